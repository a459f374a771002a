//! Pick strategies: how a balancer chooses among the ready endpoints of the subset its
//! policy chose. The built-in ones are [`PeakEwma`] (the default), [`PendingRequests`]
//! and [`RoundRobin`] ([`Pick`](crate::Pick) names them in a configuration file); a
//! [`Strategy`] of your own plugs in with
//! [`BalanceLayer::with_strategy`](crate::BalanceLayer::with_strategy).
//!
//! # What a strategy sees
//!
//! For each request, [`Strategy::choose`] gets the [`Candidates`]: the ready endpoints
//! of the chosen subset, at least two, each as a read-only [`Load`] (requests in flight,
//! the Peak-EWMA cost at the time of the pick, whether it is still being probed or about
//! to be ejected, its labels), the subset's round-robin cursor and the request's random
//! number generator. It returns an index. It runs on the request path, in the caller's
//! task: it must not block, and should not allocate.
//!
//! # What the balancer still does around it
//!
//! - It walks the policy: the strategy only ever sees endpoints that may serve the
//!   request, and never an empty or one-endpoint subset (that one endpoint is taken).
//! - Passive health: ejected and unready endpoints are not candidates at all. An endpoint
//!   that has just reached the ejection threshold (the background task ejects it within
//!   microseconds) may still be one; if the strategy picks it, the balancer takes one of
//!   the next few candidates that is not [ejecting](Load::is_ejecting) instead.
//! - Probing: unless [`Strategy::probes`] says no, a new (or readmitted) endpoint gets its
//!   probe requests, one at a time, before the strategy is asked (see the
//!   [crate docs](crate#new-endpoints)).
//! - Load: every request counts in flight for its endpoint from the pick to its end; when
//!   [`Strategy::rtt_decay`] asks for it, every round trip is measured into the endpoint's
//!   Peak-EWMA estimate.
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, sync::Arc, task::{Context, Poll}};
//! use gray_balance::{BalanceLayer, strategy::{Candidates, Strategy}};
//! use gray_core::{Labelled, Labels, rand::Rng};
//! use gray_policy::Policy;
//! use tower::{ServiceExt, discover::Change};
//!
//! /// The candidate with the highest `weight` label (ties and unlabelled: the first).
//! #[derive(Debug)]
//! struct Heaviest;
//!
//! impl Strategy for Heaviest {
//!     fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
//!         let weight = |i: usize| {
//!             let load = candidates.get(i)?;
//!             load.labels().get("weight")?.parse::<u32>().ok()
//!         };
//!         (0..candidates.len()).max_by_key(|&i| (weight(i), std::cmp::Reverse(i))).unwrap_or(0)
//!     }
//!
//!     fn probes(&self) -> bool {
//!         false // new endpoints get no requests of their own first
//!     }
//! }
//!
//! #[derive(Clone)]
//! struct Endpoint(&'static str, Arc<Labels>);
//!
//! impl Labelled for Endpoint {
//!     fn labels(&self) -> &Labels { &self.1 }
//! }
//!
//! impl tower::Service<http::Request<()>> for Endpoint {
//!     type Response = &'static str;
//!     type Error = Infallible;
//!     type Future = Ready<Result<&'static str, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: http::Request<()>) -> Self::Future { ready(Ok(self.0)) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let endpoint = |name, weight| {
//!     Ok::<_, Infallible>(Change::Insert(name, Endpoint(name, Arc::new(Labels::from_iter([("weight", weight)])))))
//! };
//! let endpoints = futures_util::stream::iter([endpoint("a", "1"), endpoint("b", "5"), endpoint("c", "2")]);
//! let balance = BalanceLayer::new("svc", Policy::new()).with_strategy(Heaviest).build(endpoints);
//! for _ in 0..10 {
//!     assert_eq!(balance.clone().oneshot(http::Request::new(())).await?, "b");
//! }
//! # Ok(())
//! # }
//! ```

mod builtin;
mod ready;

use std::{fmt, time::Duration};

use gray_core::{Labels, rand::Rng};

pub use self::builtin::{PeakEwma, PendingRequests, RoundRobin};
use self::ready::View;
pub(crate) use self::{builtin::Chooser, ready::Ready};
use crate::meter::Meter;

/// How a balancer chooses among the ready endpoints of a subset; see the
/// [module docs](self) for what it sees and what the balancer still does around it.
pub trait Strategy: fmt::Debug + Send + Sync + 'static {
    /// Chooses one of `candidates` (there are at least two): returns its index, below
    /// [`candidates.len()`](Candidates::len) (a larger one is taken modulo the length).
    /// `rng` is the request's random number generator.
    fn choose(&self, candidates: &Candidates<'_>, rng: &mut Rng) -> usize;

    /// `Some(decay)` makes the balancer measure every request's round trip into its
    /// endpoint's Peak-EWMA estimate (old measurements fade over `decay`) and read its
    /// clock at every pick, for [`Load::cost`]; `None` (the default) measures nothing, and
    /// every endpoint costs the default round trip per request in flight.
    fn rtt_decay(&self) -> Option<Duration> {
        None
    }

    /// Whether a new endpoint gets its probe requests before the strategy is asked (see
    /// the [crate docs](crate#new-endpoints)); `true` by default. A strategy that spreads
    /// requests evenly by itself (round-robin) needs none.
    fn probes(&self) -> bool {
        true
    }
}

/// The ready endpoints of the chosen subset, as a [`Strategy`] sees them.
pub struct Candidates<'a> {
    view: &'a (dyn View<'a> + 'a),
}

/// One candidate's load and labels, read from its atomics at the time of the pick.
#[derive(Clone, Copy)]
pub struct Load<'a> {
    meter: &'a Meter,
    labels: &'a Labels,
    now: u64,
}

/// `d` in nanoseconds, without `Duration::as_nanos`'s 128-bit arithmetic.
fn nanos(d: Duration) -> f64 {
    (d.as_secs() as f64).mul_add(1e9, f64::from(d.subsec_nanos()))
}

// === impl Candidates ===

impl<'a> Candidates<'a> {
    pub(crate) fn new(view: &'a (dyn View<'a> + 'a)) -> Self {
        Candidates { view }
    }

    /// How many there are (at least two when a strategy is asked).
    #[must_use]
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// `true` when there are none (never, when a strategy is asked).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th candidate, `None` past the end.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<Load<'a>> {
        self.view.get(i)
    }

    /// Every candidate, in index order (a strategy that scans them all costs O(n) per
    /// request; the built-in ones look at two).
    pub fn iter(&self) -> impl Iterator<Item = Load<'a>> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The next position of the subset's round-robin cursor, below [`len`](Self::len):
    /// shared by every request routed to the subset, kept across changes of the index.
    #[must_use]
    pub fn next_round_robin(&self) -> usize {
        self.view.next_round_robin()
    }

    /// Power of two choices: two distinct candidates drawn with `rng`, and the lighter one
    /// by `lighter(a, b)` (`true`: `a` is lighter) kept, except that one being
    /// [ejected](Load::is_ejecting) always loses.
    pub fn power_of_two(
        &self,
        rng: &mut Rng,
        lighter: impl FnOnce(&Load<'a>, &Load<'a>) -> bool,
    ) -> usize {
        let n = self.len();
        if n < 2 {
            return 0;
        }
        let (a, b) = ready::two(rng, n);
        let (Some(la), Some(lb)) = (self.get(a), self.get(b)) else {
            return a;
        };
        if ready::first_wins(&la, &lb, lighter) {
            a
        } else {
            b
        }
    }
}

impl fmt::Debug for Candidates<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// === impl Load ===

impl Load<'_> {
    /// Requests picked for this endpoint and not completed yet.
    #[must_use]
    pub fn in_flight(&self) -> u32 {
        self.meter.pending()
    }

    /// Peak-EWMA's cost at the time of the pick: the round-trip estimate (decayed since
    /// its last update) times the requests in flight plus one, in nanoseconds. Without a
    /// measurement (a new endpoint, or a strategy without [`Strategy::rtt_decay`]), the
    /// estimate is `default_rtt`.
    #[must_use]
    pub fn cost(&self, default_rtt: Duration) -> f64 {
        self.meter.cost(self.now, nanos(default_rtt))
    }

    /// `true` when this endpoint costs no more than `other` at the time of the pick: the
    /// comparison of the two [`cost`](Self::cost)s, with one exponential instead of two.
    #[must_use]
    pub fn is_lighter_than(&self, other: &Load<'_>, default_rtt: Duration) -> bool {
        Meter::lighter(self.meter, other.meter, self.now, nanos(default_rtt))
    }

    /// `true` while the endpoint is new (or readmitted) and has completed fewer than its
    /// probe requests.
    #[must_use]
    pub fn is_probing(&self) -> bool {
        self.meter.is_probing()
    }

    /// `true` when the endpoint reached the ejection threshold and the background task has
    /// not ejected it yet: a pick should avoid it (the balancer does, after the strategy).
    #[must_use]
    pub fn is_ejecting(&self) -> bool {
        self.meter.doomed()
    }

    /// The endpoint's labels, as the registry reports them.
    #[must_use]
    pub fn labels(&self) -> &Labels {
        self.labels
    }
}

impl fmt::Debug for Load<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Load")
            .field("in_flight", &self.in_flight())
            .field("probing", &self.is_probing())
            .field("ejecting", &self.is_ejecting())
            .field("labels", &self.labels)
            .finish()
    }
}
