//! The built-in strategies, and [`Chooser`]: how a balancer calls its strategy (a
//! built-in one directly, any other through [`Candidates`]).

use std::{any::Any, fmt, sync::Arc, time::Duration};

use gray_core::rand::Rng;

use super::{Candidates, Load, Strategy, nanos, ready::Ready};
use crate::{index::Slot, meter::Meter};

/// Power of two choices over a Peak-EWMA cost: the round-trip estimate (decaying towards
/// zero while idle, jumping up on a slower response) times the requests in flight plus
/// one. The default strategy ([`Pick::PeakEwma`](crate::Pick::PeakEwma)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeakEwma {
    /// The round-trip time assumed for an endpoint without measurements (default 30 ms).
    pub default_rtt: Duration,
    /// How fast old measurements fade (default 10 s).
    pub decay: Duration,
}

/// Power of two choices over the requests in flight
/// ([`Pick::PendingRequests`](crate::Pick::PendingRequests)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingRequests;

/// Round-robin within the subset (seed 002; [`Pick::RoundRobin`](crate::Pick::RoundRobin)):
/// an endpoint of a subset of `n` gets one of every `n` requests, so new endpoints need no
/// probes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundRobin;

// === impl PeakEwma ===

impl Default for PeakEwma {
    fn default() -> Self {
        PeakEwma {
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
        }
    }
}

impl PeakEwma {
    /// A 30 ms default round trip, a 10 s decay.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The round trip assumed for an endpoint without measurements.
    #[must_use]
    pub fn with_default_rtt(mut self, default_rtt: Duration) -> Self {
        self.default_rtt = default_rtt;
        self
    }

    /// How fast old measurements fade.
    #[must_use]
    pub fn with_decay(mut self, decay: Duration) -> Self {
        self.decay = decay;
        self
    }
}

/// Peak-EWMA's comparison, with the default round trip in nanoseconds.
fn lighter_cost(default_rtt_ns: f64) -> impl Fn(&Load<'_>, &Load<'_>) -> bool {
    move |a, b| Meter::lighter(a.meter, b.meter, a.now, default_rtt_ns)
}

fn fewer_in_flight(a: &Load<'_>, b: &Load<'_>) -> bool {
    a.in_flight() <= b.in_flight()
}

impl Strategy for PeakEwma {
    fn choose(&self, candidates: &Candidates<'_>, rng: &mut Rng) -> usize {
        candidates.power_of_two(rng, lighter_cost(nanos(self.default_rtt)))
    }

    fn rtt_decay(&self) -> Option<Duration> {
        Some(self.decay)
    }
}

// === impl PendingRequests, RoundRobin ===

impl Strategy for PendingRequests {
    fn choose(&self, candidates: &Candidates<'_>, rng: &mut Rng) -> usize {
        candidates.power_of_two(rng, fewer_in_flight)
    }
}

impl Strategy for RoundRobin {
    fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
        candidates.next_round_robin()
    }

    fn probes(&self) -> bool {
        false
    }
}

/// A balancer's strategy: a built-in one, called directly (no virtual call, no second
/// lookup of the chosen endpoint), or any other, through [`Candidates`].
#[derive(Clone)]
pub(crate) enum Chooser {
    PeakEwma(PeakEwma, f64),
    PendingRequests,
    RoundRobin,
    Custom(Arc<dyn Strategy>),
}

// === impl Chooser ===

impl Chooser {
    /// `strategy`; a built-in one is recognised, to be called directly.
    pub(crate) fn new<T: Strategy>(strategy: T) -> Self {
        let any: &dyn Any = &strategy;
        if let Some(peak) = any.downcast_ref::<PeakEwma>() {
            Chooser::PeakEwma(*peak, nanos(peak.default_rtt))
        } else if any.is::<PendingRequests>() {
            Chooser::PendingRequests
        } else if any.is::<RoundRobin>() {
            Chooser::RoundRobin
        } else {
            Chooser::Custom(Arc::new(strategy))
        }
    }

    /// The strategy, as a trait object.
    fn strategy(&self) -> &dyn Strategy {
        match self {
            Chooser::PeakEwma(s, _) => s,
            Chooser::PendingRequests => &PendingRequests,
            Chooser::RoundRobin => &RoundRobin,
            Chooser::Custom(s) => &**s,
        }
    }

    /// See [`Strategy::rtt_decay`].
    pub(crate) fn rtt_decay(&self) -> Option<Duration> {
        self.strategy().rtt_decay()
    }

    /// See [`Strategy::probes`].
    pub(crate) fn probes(&self) -> bool {
        self.strategy().probes()
    }

    /// The endpoint chosen among `ready`'s (at least two).
    pub(crate) fn choose<'s, K, S>(&self, ready: &Ready<'s, K, S>) -> Option<&'s Slot<K, S>> {
        match self {
            Chooser::PeakEwma(_, default_rtt_ns) => {
                ready.power_of_two(&mut Rng::new(), lighter_cost(*default_rtt_ns))
            }
            Chooser::PendingRequests => ready.power_of_two(&mut Rng::new(), fewer_in_flight),
            Chooser::RoundRobin => ready.slot(ready.next_round_robin()),
            Chooser::Custom(s) => ready.settle(s.choose(&Candidates::new(ready), &mut Rng::new())),
        }
    }
}

impl fmt::Debug for Chooser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.strategy(), f)
    }
}
