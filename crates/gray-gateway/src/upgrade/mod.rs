//! Upgraded connections (WebSocket) through the gateway.
//!
//! An HTTP/1.1 request that asks for an upgrade (`Connection: upgrade` and an `Upgrade`
//! header) is an ordinary request for the edge: stained by the rules, forged stains
//! stripped, routed by its stain, retried (it has no body) only before an answer. The
//! edge takes `Connection` and `Upgrade` off as hop-by-hop headers; the proxy puts them
//! back on the request it sends ([`Offer`], noted by the connection before the edge runs)
//! and on a `101` answer. Once the instance answered `101 Switching Protocols` and the
//! gateway has written it to the client, the client's connection leaves hyper and
//! becomes a [`Tunnel`] to the instance's connection, in the connection's own task
//! ([`tunnel::run`]): bytes both ways, nothing parsed but the WebSocket frame headers.
//! Any other answer (a `426`, a `403`) goes to the client as it is.
//!
//! - **Limits.** At most `max_upgraded` upgraded connections at once (more get 503); each
//!   is still a client connection (`max_connections`). One that carries no byte either
//!   way for `upgraded_idle_timeout_ms` is closed (a WebSocket close frame 1001 both
//!   ways); WebSocket pings are bytes, so a client that pings is never idle.
//! - **Rollbacks.** A rollout rolled back closes the upgraded connections of its lane
//!   ([`Tunnels::close_lane`]), `upgraded_close_per_second` a second, each with the close
//!   code 1012 (service restart) to the client and to the instance, between two frames: the clients reconnect, now to baseline, without reconnecting all at once.
//! - **Drain.** At shutdown every upgraded connection gets 1001 (going away) both ways,
//!   and the shutdown's grace bounds the rest.
//! - **HTTP/2.** The gateway does not offer the extended CONNECT of RFC 8441 (it sends no
//!   `SETTINGS_ENABLE_CONNECT_PROTOCOL`), so a client that speaks HTTP/2 to it opens its
//!   WebSocket over HTTP/1.1, as browsers do; a `CONNECT` over HTTP/2 gets 405. Instances
//!   are reached in HTTP/1.1 for an upgrade: a service whose `protocol` is `http2`
//!   answers upgrade requests 502, saying so.

pub(crate) mod frames;
pub(crate) mod tunnel;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering},
    },
    task::Context,
    time::Duration,
};

use futures_util::task::AtomicWaker;
use gray_core::Lane;
use gray_discovery::http::Upgraded;
use http::HeaderValue;

use crate::{
    config::Limits,
    metrics::{Metrics, UpgradeSeries},
    serve::Handoff,
};

/// What the connection tells the proxy of an upgrade request, before the edge strips
/// its `Upgrade` header: the protocol asked for, and where the tunnel goes once the
/// instance switched (a request extension).
#[derive(Clone)]
pub(crate) struct Offer {
    /// The request's `Upgrade` header.
    pub(crate) protocol: HeaderValue,
    /// The connection that takes the tunnel.
    pub(crate) handoff: Handoff,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// Whether `protocol` (an `Upgrade` header) names WebSocket, whose frames the tunnel
/// follows.
fn is_websocket(protocol: &HeaderValue) -> bool {
    protocol.to_str().is_ok_and(|p| {
        p.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
    })
}

/// Why the gateway closes an upgraded connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closing {
    /// Its lane's rollout was rolled back.
    Rollback,
    /// The gateway shuts down.
    Drain,
    /// No byte either way for `upgraded_idle_timeout_ms`.
    Idle,
}

impl Closing {
    /// The WebSocket close code and reason sent to the client.
    fn code(self) -> (u16, &'static str) {
        match self {
            Closing::Rollback => (1012, "service restart: the release was rolled back"),
            Closing::Drain => (1001, "going away: the gateway shuts down"),
            Closing::Idle => (1001, "going away: idle for upgraded_idle_timeout_ms"),
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Closing::Rollback => 1,
            Closing::Drain => 2,
            Closing::Idle => 3,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Closing::Rollback),
            2 => Some(Closing::Drain),
            3 => Some(Closing::Idle),
            _ => None,
        }
    }
}

/// How an upgraded connection ended (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    /// Both peers closed it.
    Peer,
    /// A read or a write failed (a reset).
    Error,
    /// The gateway closed it.
    Gateway(Closing),
}

impl From<Closing> for Closed {
    fn from(c: Closing) -> Self {
        Closed::Gateway(c)
    }
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::Peer => "peer",
            Closed::Error => "error",
            Closed::Gateway(Closing::Rollback) => "rollback",
            Closed::Gateway(Closing::Drain) => "drain",
            Closed::Gateway(Closing::Idle) => "idle",
        }
    }
}

/// How the gateway asks one tunnel to close.
#[derive(Debug, Default)]
pub(crate) struct Closer {
    reason: AtomicU8,
    waker: AtomicWaker,
}

impl Closer {
    fn close(&self, reason: Closing) {
        self.reason.store(reason.to_u8(), Ordering::Release);
        self.waker.wake();
    }

    /// The close asked for, if any (else the task is woken when one is).
    pub(crate) fn requested(&self, cx: &mut Context<'_>) -> Option<Closing> {
        self.waker.register(cx.waker());
        Closing::from_u8(self.reason.load(Ordering::Acquire))
    }
}

/// An open tunnel, as the registry knows it.
struct Live {
    service: Arc<str>,
    lane: Option<Lane>,
    closer: Arc<Closer>,
}

/// Every upgraded connection of the gateway: the cap, and what a rollback closes.
pub(crate) struct Tunnels {
    max: usize,
    pub(crate) idle_timeout: Option<Duration>,
    close_per_second: u32,
    /// Admitted (a ticket held), whether switched yet or not.
    admitted: AtomicUsize,
    next: AtomicU64,
    live: Mutex<HashMap<u64, Live>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Tunnels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnels")
            .field("max", &self.max)
            .field("admitted", &self.admitted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Tunnels {
    pub(crate) fn new(limits: &Limits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Tunnels {
            max: limits.max_upgraded,
            idle_timeout: limits.upgraded_idle_timeout,
            close_per_second: limits.upgraded_close_per_second.max(1),
            admitted: AtomicUsize::new(0),
            next: AtomicU64::new(0),
            live: Mutex::default(),
            metrics,
        })
    }

    /// The cap (0: none).
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// One more upgrade, if the cap allows it.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Ticket> {
        let admitted = self.admitted.fetch_add(1, Ordering::AcqRel);
        if self.max > 0 && admitted >= self.max {
            self.admitted.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Ticket {
            tunnels: self.clone(),
            id: self.next.fetch_add(1, Ordering::Relaxed),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the upgraded connections of `service` routed to `lane`, paced at
    /// `upgraded_close_per_second`, each with 1012 to its client. Returns how many.
    pub(crate) fn close_lane(self: &Arc<Self>, service: &str, lane: &Lane) -> usize {
        let closers: Vec<Arc<Closer>> = self
            .lock()
            .values()
            .filter(|l| &*l.service == service && l.lane.as_ref() == Some(lane))
            .map(|l| l.closer.clone())
            .collect();
        let n = closers.len();
        if n == 0 {
            return 0;
        }
        let rate = self.close_per_second;
        tracing::info!(service, lane = %lane, connections = n, per_second = rate, "rolled back: closing the lane's upgraded connections with 1012");
        let every = Duration::from_secs(1) / rate;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            for closer in closers {
                tick.tick().await;
                closer.close(Closing::Rollback);
            }
        });
        n
    }
}

/// An admitted upgrade: counted against `max_upgraded` until dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    tunnels: Arc<Tunnels>,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.tunnels.admitted.fetch_sub(1, Ordering::AcqRel);
        self.tunnels.lock().remove(&self.id);
    }
}

impl Ticket {
    /// The instance switched protocols: the tunnel to it, for the client's connection to
    /// run.
    pub(crate) fn switched(
        self,
        service: &Arc<str>,
        lane: Option<&Lane>,
        protocol: &HeaderValue,
        upstream: Upgraded,
    ) -> Tunnel {
        let closer = Arc::new(Closer::default());
        let tunnels = self.tunnels.clone();
        tunnels.lock().insert(
            self.id,
            Live {
                service: service.clone(),
                lane: lane.cloned(),
                closer: closer.clone(),
            },
        );
        let series = tunnels.metrics.upgrades(service, lane);
        series.open.inc();
        Tunnel {
            tunnels,
            ticket: self,
            closer,
            websocket: is_websocket(protocol),
            upstream: Some(upstream),
            series,
            counted: (0, 0),
            outcome: None,
        }
    }
}

/// One upgraded connection's instance side, and what it counts in.
pub(crate) struct Tunnel {
    pub(crate) tunnels: Arc<Tunnels>,
    #[allow(dead_code)]
    ticket: Ticket,
    pub(crate) closer: Arc<Closer>,
    /// The protocol is WebSocket: the gateway's closes are close frames.
    pub(crate) websocket: bool,
    upstream: Option<Upgraded>,
    series: UpgradeSeries,
    /// Bytes counted so far, up and down.
    counted: (u64, u64),
    /// How it ended, once it did (a tunnel dropped unrun, its `101` never written, is
    /// counted as an error).
    outcome: Option<Closed>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let how = self.outcome.unwrap_or(Closed::Error);
        self.series.open.dec();
        self.series.closed(how.label());
    }
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("websocket", &self.websocket)
            .finish_non_exhaustive()
    }
}

impl Tunnel {
    /// The instance's connection (once).
    pub(crate) fn take_upstream(&mut self) -> Option<Upgraded> {
        self.upstream.take()
    }

    /// Counts the bytes moved since the last count.
    fn count(&mut self, up: u64, down: u64) {
        if up > self.counted.0 {
            self.series.up.inc_by(up - self.counted.0);
        }
        if down > self.counted.1 {
            self.series.down.inc_by(down - self.counted.1);
        }
        self.counted = (up, down);
    }

    fn closed(&mut self, how: Closed) {
        self.outcome = Some(how);
        tracing::debug!(
            websocket = self.websocket,
            reason = how.label(),
            "upgraded connection closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_is_recognised_in_any_case_and_among_others() {
        for (value, websocket) in [
            ("websocket", true),
            ("WebSocket", true),
            ("h2c, websocket", true),
            ("h2c", false),
            ("", false),
        ] {
            assert_eq!(
                is_websocket(&HeaderValue::from_static(value)),
                websocket,
                "{value}"
            );
        }
    }

    #[tokio::test]
    async fn the_cap_counts_admitted_upgrades_until_they_go() {
        let limits = Limits {
            max_upgraded: 2,
            ..Limits::default()
        };
        let tunnels = Tunnels::new(&limits, Metrics::new(4));
        let a = tunnels.admit().expect("first");
        let _b = tunnels.admit().expect("second");
        assert!(tunnels.admit().is_none(), "over the cap");
        drop(a);
        assert!(tunnels.admit().is_some(), "a place left by one that went");
    }
}
