//! Choosing an endpoint over a snapshot: the policy's walk, then a probe or the
//! [`Strategy`]; [`Pick`], the built-in strategies by name; and [`Picked`], a chosen
//! endpoint for clients that send requests themselves.

use std::{fmt, sync::Arc, time::Duration};

use gray_core::Labels;
use gray_policy::{
    OwnedSubset, Policy, Unroutable,
    route::{Key, Route},
};

use crate::{
    health::Failure,
    index::{Entry, Skips, Slot, Snapshot, Tried},
    meter::{Clock, Completion, Ticket},
    strategy::{Chooser, PeakEwma, PendingRequests, Ready, RoundRobin, Strategy},
};

/// The built-in [`Strategy`]s by name, as a configuration file names them (`peak-ewma`,
/// `pending-requests`, `round-robin`); [`BalanceLayer::with_pick`](crate::BalanceLayer::with_pick)
/// uses the one it names. A strategy of your own goes to
/// [`BalanceLayer::with_strategy`](crate::BalanceLayer::with_strategy).
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
    /// The strategy this names: [`PeakEwma`], [`PendingRequests`] or [`RoundRobin`].
    #[must_use]
    pub fn strategy(&self) -> Arc<dyn Strategy> {
        match *self {
            Pick::PeakEwma { default_rtt, decay } => Arc::new(
                PeakEwma::new()
                    .with_default_rtt(default_rtt)
                    .with_decay(decay),
            ),
            Pick::PendingRequests => Arc::new(PendingRequests),
            Pick::RoundRobin => Arc::new(RoundRobin),
        }
    }

    /// The strategy this names, as a balancer calls it.
    pub(crate) fn chooser(&self) -> Chooser {
        match *self {
            Pick::PeakEwma { default_rtt, decay } => Chooser::new(
                PeakEwma::new()
                    .with_default_rtt(default_rtt)
                    .with_decay(decay),
            ),
            Pick::PendingRequests => Chooser::PendingRequests,
            Pick::RoundRobin => Chooser::RoundRobin,
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
    chooser: Chooser,
    /// The strategy's `rtt_decay()`, in nanoseconds: round trips are measured, the clock
    /// read at every pick.
    rtt_decay_ns: Option<f64>,
    /// The strategy's `probes()`.
    probes: bool,
    /// Requests in flight at which an endpoint is passed over (0: no limit).
    pub(crate) max_pending: u32,
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

/// The strategy's Peak-EWMA decay, in nanoseconds.
fn rtt_decay_ns(chooser: &Chooser) -> Option<f64> {
    chooser.rtt_decay().map(|d| d.as_nanos() as f64)
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
    /// Routes calls to `service` by `policy`, picking with `chooser`.
    pub(crate) fn new(service: &str, policy: Policy, chooser: Chooser) -> Self {
        Router {
            service: service.into(),
            policy,
            rtt_decay_ns: rtt_decay_ns(&chooser),
            probes: chooser.probes(),
            chooser,
            max_pending: 0,
            record: RecordRouted::Never,
            clock: Clock::new(),
        }
    }

    pub(crate) fn set_strategy(&mut self, chooser: Chooser) {
        self.rtt_decay_ns = rtt_decay_ns(&chooser);
        self.probes = chooser.probes();
        self.chooser = chooser;
    }

    /// The strategy, for `Debug`.
    pub(crate) fn strategy(&self) -> &Chooser {
        &self.chooser
    }

    /// Peak-EWMA's decay in nanoseconds, when the strategy measures round trips.
    pub(crate) fn rtt_decay_ns(&self) -> Option<f64> {
        self.rtt_decay_ns
    }

    /// Walks the policy's chain for `key` over `snapshot` and picks an endpoint of the
    /// subset it ends at, as if the endpoints in `tried` were ejected.
    pub(crate) fn choose<'s, 'k, K: fmt::Debug, S>(
        &self,
        snapshot: &'s Snapshot<K, S>,
        key: &Key<'k>,
        tried: &Tried,
    ) -> Result<Choice<'s, 'k, K, S>, Unroutable> {
        let mut parts = Default::default();
        let mut skips = Skips::default();
        let walked = self.policy.walk(key, |subset| {
            parts = snapshot.resolve(subset);
            let mut counts = snapshot.counts(parts);
            if !tried.is_empty() {
                // A tried endpoint counts as ejected: absent, and not ready.
                skips = snapshot.skips(parts, tried);
                counts.present = counts.present.saturating_sub(skips.len());
                counts.ready = counts.ready.saturating_sub(skips.len());
            }
            counts
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
        // Read once: the costs the strategy sees and the start of the request's round trip.
        let now = match self.rtt_decay_ns {
            Some(_) => self.clock.now(),
            None => 0,
        };
        let fresh = match self.probes {
            true => snapshot.claim_fresh(parts, tried),
            false => None,
        };
        let ready = Ready::new(snapshot, parts, n, now, skips);
        let (slot, probe) = match fresh {
            Some(slot) => (Some(slot), true),
            None if n <= 1 => (ready.slot(0), false),
            None => (self.chooser.choose(&ready), false),
        };
        let Some(slot) = slot else {
            // The counts and the lists of one snapshot always agree.
            let miss = gray_policy::route::Miss::Unready {
                subset: route.subset,
                present: route.counts.present,
            };
            return Err(self.policy.unroutable(&self.service, key, &miss));
        };
        let slot = match self.max_pending {
            0 => slot,
            limit if slot.entry.meter.pending() < limit => slot,
            limit => unsaturated(&ready, n, limit).ok_or_else(|| {
                route_event!(self, key, subset = %route.subset, limit, "saturated");
                self.policy
                    .saturated(&self.service, key, route.subset, limit)
            })?,
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

    /// The endpoint's slot, for a retry to avoid.
    #[cfg(feature = "reqwest")]
    pub(crate) fn id(&self) -> crate::meter::Id {
        self.ticket.meter().id()
    }

    /// When it was picked on the balancer's clock (0 when the pick did not read it).
    #[cfg(feature = "reqwest")]
    pub(crate) fn start(&self) -> u64 {
        self.ticket.start()
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
        self.ticket.finish(Completion::Failed(Failure::Other));
    }

    /// The request could not reach the endpoint: one more connection error in a row
    /// towards its ejection.
    pub fn connection_failed(mut self) {
        self.ticket.finish(Completion::Failed(Failure::Unsent));
    }

    /// The instance refused the connection: nothing listens there. The endpoint leaves
    /// the picks at once (see [`health`](crate::health)).
    pub fn refused(mut self) {
        self.ticket.finish(Completion::Failed(Failure::Refused));
    }

    /// The request failed with `error`: the balancer's classifier reads it (a refusal
    /// ejects at once, another connection error counts towards an ejection, anything
    /// else resets the count), and its reading is returned.
    pub fn failed_with(mut self, error: &(dyn std::error::Error + 'static)) -> Failure {
        let failure = (self.ticket.meter().feedback().classify)(error);
        self.ticket.finish(Completion::Failed(failure));
        failure
    }
}

/// The first ready endpoint, from a random place, with fewer than `limit` requests in
/// flight: the rare path of a pick whose choice is saturated.
fn unsaturated<'s, K, S>(ready: &Ready<'s, K, S>, n: usize, limit: u32) -> Option<&'s Slot<K, S>> {
    let start = gray_core::rand::Rng::new().index(n.max(1));
    (0..n)
        .filter_map(|i| ready.slot((start + i) % n))
        .find(|slot| slot.entry.meter.pending() < limit)
}
