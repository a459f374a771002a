//! The watchdog of one connection: a task of its own that enforces the timeouts of the
//! [module docs](super) and asks an idle HTTP/1.1 connection to park, from what it reads
//! of the connection's [`ConnState`] tick after tick.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::task::AbortHandle;

use super::state::ConnState;
use crate::config::Limits;

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    /// No complete request head in time.
    Head,
    /// Idle for too long.
    Idle,
    /// Response bodies made no progress for too long.
    Send,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expired::Head => "no complete request head within header_read_timeout",
            Expired::Idle => "idle for idle_timeout",
            Expired::Send => "response bodies made no progress for send_timeout",
        })
    }
}

/// The timeouts a watchdog enforces (a copy per connection: only what it needs of the
/// [`Limits`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    idle_timeout: Option<Duration>,
    header_read_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
}

impl From<&Limits> for Timeouts {
    fn from(limits: &Limits) -> Self {
        Timeouts {
            idle_timeout: limits.idle_timeout,
            header_read_timeout: limits.header_read_timeout,
            send_timeout: limits.send_timeout,
        }
    }
}

/// The longest tick: with no timeout shorter than this, a watchdog still looks at its
/// connection every quarter of it, to park it when idle.
const LONGEST: Duration = Duration::from_secs(10);

/// How often a watchdog looks at its connection: a quarter of the shortest timeout (or of
/// [`LONGEST`]), so a connection is closed between its timeout and 1.25 times it, and an
/// idle HTTP/1.1 connection is parked between one and two ticks after its last response.
fn tick(limits: &Timeouts) -> Duration {
    [
        limits.idle_timeout,
        limits.header_read_timeout,
        limits.send_timeout,
        Some(LONGEST),
    ]
    .into_iter()
    .flatten()
    .min()
    .map_or(LONGEST, |t| t / 4)
    .max(Duration::from_millis(1))
}

/// Watches one connection, on a task of its own (the connection's task pays nothing per
/// poll): every tick it compares the connection's [`ConnState`] with the previous tick's and
/// aborts the connection's task (closing the connection) once the same head has been
/// pending, or the connection idle, for the timeout. Ends with the connection.
pub(super) async fn watchdog(
    state: Arc<ConnState>,
    conn: AbortHandle,
    limits: Timeouts,
    peer: SocketAddr,
) {
    let tick = tick(&limits);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    // The state seen, and for how long it has been seen unchanged.
    let mut seen = None;
    let mut unchanged = Duration::ZERO;
    let (mut sending, mut stalled) = (None, Duration::ZERO);
    loop {
        interval.tick().await;
        if conn.is_finished() || state.is_upgraded() {
            return;
        }
        if let Some(limit) = limits.send_timeout {
            let now = state.sending();
            if now.is_some() && now == sending {
                stalled += tick;
                if stalled >= limit {
                    tracing::debug!(%peer, "connection closed: {}", Expired::Send);
                    // the bodies cut log their service and instance as they are dropped
                    state.expire_send();
                    conn.abort();
                    return;
                }
            } else {
                (sending, stalled) = (now, Duration::ZERO);
            }
        }
        let now = state.idle_since_tick();
        if now.is_none() || now != seen {
            seen = now;
            unchanged = Duration::ZERO;
            continue;
        }
        unchanged += tick;
        if unchanged == tick && matches!(now, Some((_, false))) {
            // Idle for a tick: an HTTP/1.1 connection drops its buffers.
            state.request_park();
        }
        let (expired, limit) = match now {
            Some((_, true)) => (Expired::Head, limits.header_read_timeout),
            _ => (Expired::Idle, limits.idle_timeout),
        };
        if limit.is_some_and(|limit| unchanged >= limit) {
            tracing::debug!(%peer, "connection closed: {expired}");
            conn.abort();
            return;
        }
    }
}
