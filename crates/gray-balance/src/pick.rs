//! Choosing an endpoint over a snapshot: the policy's walk, then a probe, power of two
//! choices or round-robin; and [`Picked`], a chosen endpoint for clients that send
//! requests themselves.

use std::{fmt, sync::Arc, time::Duration};

use gray_core::{Labels, rand::Rng};
use gray_policy::{
    OwnedSubset, Policy, Unroutable,
    route::{Key, Route},
};

use crate::{
    index::{Entry, Slot, Snapshot},
    meter::{Clock, Completion, Meter, Ticket},
};

/// How the balancer picks among the ready endpoints of a subset.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Pick {
    /// Power of two choices over a Peak-EWMA cost: the round-trip estimate (decaying
    /// towards zero while idle, jumping up on a slower response) times the requests in
    /// flight plus one. The default.
    PeakEwma {
        /// The round-trip time assumed for an endpoint without measurements.
        default_rtt: Duration,
        /// How fast old measurements fade.
        decay: Duration,
    },
    /// Power of two choices over the requests in flight.
    PendingRequests,
    /// Round-robin within the subset (seed 002).
    RoundRobin,
}

impl Default for Pick {
    /// Peak-EWMA with a 30 ms default RTT and a 10 s decay.
    fn default() -> Self {
        Pick::PeakEwma {
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
        }
    }
}

/// The names of [`Pick`] in a configuration file, in the order its errors list them.
const PICK_NAMES: &[&str] = &["peak-ewma", "pending-requests", "round-robin"];

impl<'de> serde::Deserialize<'de> for Pick {
    /// From its name in a configuration file: `"peak-ewma"` (the [default](Pick::default),
    /// with its default RTT and decay), `"pending-requests"` or `"round-robin"`. Any other
    /// value is an error that lists these (`unknown variant`, as for a derived enum).
    ///
    /// ```
    /// use gray_balance::Pick;
    ///
    /// let pick: Pick = serde_json::from_str(r#""round-robin""#)?;
    /// assert_eq!(pick, Pick::RoundRobin);
    /// let err = serde_json::from_str::<Pick>(r#""random""#).unwrap_err();
    /// assert!(err.to_string().starts_with("unknown variant `random`, expected one of `peak-ewma`"), "{err}");
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;

        impl serde::de::Visitor<'_> for Name {
            type Value = Pick;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`peak-ewma`, `pending-requests` or `round-robin`")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Pick, E> {
                match name {
                    "peak-ewma" => Ok(Pick::default()),
                    "pending-requests" => Ok(Pick::PendingRequests),
                    "round-robin" => Ok(Pick::RoundRobin),
                    other => Err(E::unknown_variant(other, PICK_NAMES)),
                }
            }
        }

        d.deserialize_str(Name)
    }
}

impl Pick {
    /// Peak-EWMA's decay in nanoseconds; `None` for the picks that measure no round trip.
    pub(crate) fn decay_ns(&self) -> Option<f64> {
        match self {
            Pick::PeakEwma { decay, .. } => Some(decay.as_nanos() as f64),
            _ => None,
        }
    }
}

/// How one request was routed: the subset it was picked from and whether that subset was
/// a fallback. Recorded on the request with
/// [`RequestStain::record_routed`](crate::RequestStain::record_routed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    subset: OwnedSubset,
    fallback: bool,
}

impl Routed {
    /// The subset the endpoint was picked from.
    #[must_use]
    pub fn subset(&self) -> &OwnedSubset {
        &self.subset
    }

    /// `true` when that subset is not the request's primary one.
    #[must_use]
    pub fn fallback(&self) -> bool {
        self.fallback
    }
}

/// Which requests the balancer records a [`Routed`] on; see
/// [`BalanceLayer::with_routed`](crate::BalanceLayer::with_routed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordRouted {
    /// None (the default).
    #[default]
    Never,
    /// Only those served from a fallback subset: nothing is added to the others.
    Fallbacks,
    /// Every routed request.
    Always,
}

/// What a balancer routes with.
#[derive(Debug, Clone)]
pub(crate) struct Router {
    pub(crate) service: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) pick: Pick,
    pub(crate) record: RecordRouted,
    /// The balancer's clock; set when the balancer is built.
    pub(crate) clock: Clock,
}

/// The endpoint chosen for a request.
pub(crate) struct Choice<'s, 'k, K, S> {
    pub(crate) slot: &'s Slot<K, S>,
    /// The request is the endpoint's probe.
    pub(crate) probe: bool,
    pub(crate) route: Route<'k>,
    /// When it was picked, on the balancer's clock (0 when round trips are not measured).
    pub(crate) start: u64,
}

impl<K: Send + Sync + 'static, S: Send + Sync + 'static> Choice<'_, '_, K, S> {
    /// A claim on the chosen endpoint, counting the request in flight.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket::new(self.slot.entry.clone(), self.probe, self.start)
    }
}

impl<K, S> Choice<'_, '_, K, S> {
    /// How the request was routed.
    fn record(&self) -> Routed {
        Routed {
            subset: self.route.subset.to_owned(),
            fallback: self.route.fallback,
        }
    }

    /// The record of how the request was routed, if `record` asks for one.
    pub(crate) fn routed(&self, record: RecordRouted) -> Option<Routed> {
        let wanted = match record {
            RecordRouted::Never => false,
            RecordRouted::Fallbacks => self.route.fallback,
            RecordRouted::Always => true,
        };
        wanted.then(|| self.record())
    }
}

/// A debug event (target `gray::balance`) about routing a request: the service and the
/// request's key (lane, pin, own lane), then the fields and message given.
macro_rules! route_event {
    ($router:expr, $key:expr, $($fields:tt)+) => {
        tracing::debug!(
            target: "gray::balance",
            service = %$router.service,
            lane = $key.lane().map(|l| l.as_str()),
            pin = $key.pin().map(|v| v.as_str()),
            own_lane = $key.is_own_lane(),
            $($fields)+
        )
    };
}

impl Router {
    /// Walks the policy's chain for `key` over `snapshot` and picks an endpoint of the
    /// subset it ends at.
    pub(crate) fn choose<'s, 'k, K: fmt::Debug, S>(
        &self,
        snapshot: &'s Snapshot<K, S>,
        key: &Key<'k>,
    ) -> Result<Choice<'s, 'k, K, S>, Unroutable> {
        let mut parts = Default::default();
        let walked = self.policy.walk(key, |subset| {
            parts = snapshot.resolve(subset);
            snapshot.counts(parts)
        });
        let route = match walked {
            Ok(route) => route,
            Err(miss) => {
                route_event!(
                    self,
                    key,
                    policy = self.policy.name(),
                    fallback_policy = %self.policy.fallback(),
                    reason = ?miss,
                    "unroutable",
                );
                return Err(self.policy.unroutable(&self.service, key, &miss));
            }
        };
        let n = route.counts.ready;
        // Read once: the costs of p2c and the start of the request's round trip.
        let now = match self.pick {
            Pick::PeakEwma { .. } => self.clock.now(),
            _ => 0,
        };
        let (slot, probe) = match self.pick {
            Pick::RoundRobin => (
                snapshot.ready_at(parts, snapshot.next_cursor(parts, n)),
                false,
            ),
            _ => match snapshot.claim_fresh(parts) {
                Some(slot) => (Some(slot), true),
                None if n == 1 => (snapshot.ready_at(parts, 0), false),
                None => (self.p2c(snapshot, parts, n, now), false),
            },
        };
        let Some(slot) = slot else {
            // The counts and the lists of one snapshot always agree.
            let miss = gray_policy::route::Miss::Unready {
                subset: route.subset,
                present: route.counts.present,
            };
            return Err(self.policy.unroutable(&self.service, key, &miss));
        };
        route_event!(
            self,
            key,
            subset = %route.subset,
            subset_size = route.counts.present,
            ready = route.counts.ready,
            fallback = route.fallback,
            probe,
            endpoint = ?slot.entry.key,
            "routed",
        );
        Ok(Choice {
            slot,
            probe,
            route,
            start: now,
        })
    }

    /// Power of two choices among the `n > 1` ready members of `parts`.
    fn p2c<'s, K, S>(
        &self,
        snapshot: &'s Snapshot<K, S>,
        parts: crate::index::Parts,
        n: usize,
        now: u64,
    ) -> Option<&'s Slot<K, S>> {
        let mut rng = Rng::new();
        let a = rng.index(n);
        let mut b = rng.index(n - 1);
        if b >= a {
            b += 1;
        }
        let (sa, sb) = (snapshot.ready_at(parts, a)?, snapshot.ready_at(parts, b)?);
        let (ma, mb) = (&sa.entry.meter, &sb.entry.meter);
        // One about to be ejected loses.
        let a_lighter = match (ma.doomed(), mb.doomed()) {
            (false, true) => true,
            (true, false) => false,
            _ => self.lighter(ma, mb, now),
        };
        Some(if a_lighter { sa } else { sb })
    }

    /// `true` when `ma` carries no more load than `mb`.
    fn lighter(&self, ma: &Meter, mb: &Meter, now: u64) -> bool {
        match self.pick {
            Pick::PeakEwma { default_rtt, .. } => {
                Meter::lighter(ma, mb, now, default_rtt.as_nanos() as f64)
            }
            _ => ma.pending() <= mb.pending(),
        }
    }
}

/// An endpoint picked for a request that the caller sends itself (see
/// [`Balance::pick`](crate::Balance::pick)): a reqwest client rewriting a URL, or any
/// client with its own connections.
///
/// The request counts as in flight for the endpoint's load until this is consumed or
/// dropped. Tell it how the request ended with [`succeeded`](Self::succeeded),
/// [`failed`](Self::failed) or [`connection_failed`](Self::connection_failed), so that
/// Peak-EWMA measures the round trip and passive health sees connection errors; dropping
/// it records nothing (a cancelled request).
pub struct Picked<K: Send + Sync, S: Send + Sync> {
    ticket: Ticket<Entry<K, S>>,
    routed: Routed,
}

impl<K: fmt::Debug + Send + Sync, S: Send + Sync> fmt::Debug for Picked<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Picked")
            .field("key", &self.ticket.owner().key)
            .field("routed", &self.routed)
            .finish_non_exhaustive()
    }
}

impl<K: Send + Sync, S: Send + Sync> Picked<K, S> {
    pub(crate) fn new(choice: &Choice<'_, '_, K, S>) -> Self {
        Picked {
            ticket: Ticket::new(choice.slot.entry.clone(), choice.probe, choice.start),
            routed: choice.record(),
        }
    }

    /// The endpoint's discovery key.
    #[must_use]
    pub fn key(&self) -> &K {
        &self.ticket.owner().key
    }

    /// The endpoint (for a URL-rewriting client, its [`gray_core::Origin`]).
    #[must_use]
    pub fn endpoint(&self) -> &S {
        &self.ticket.owner().service
    }

    /// The endpoint's labels.
    #[must_use]
    pub fn labels(&self) -> &Labels {
        &self.ticket.owner().labels
    }

    /// The subset it was picked from, and whether that was a fallback.
    #[must_use]
    pub fn routed(&self) -> &Routed {
        &self.routed
    }

    /// The request got a response (whatever its status): the round trip is measured and
    /// the endpoint's error count reset.
    pub fn succeeded(mut self) {
        self.ticket.finish(Completion::Success);
    }

    /// The request failed after reaching the endpoint (a timeout, a broken response): the
    /// endpoint's connection error count is reset, no round trip measured.
    pub fn failed(mut self) {
        self.ticket.finish(Completion::Failed { connection: false });
    }

    /// The request could not reach the endpoint: one more connection error in a row
    /// towards its ejection.
    pub fn connection_failed(mut self) {
        self.ticket.finish(Completion::Failed { connection: true });
    }
}
