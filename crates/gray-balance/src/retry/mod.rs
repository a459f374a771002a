//! Retries where they are safe: a request that an instance could not take goes to another
//! instance that fits the same stain.
//!
//! [`Retry`] is a service over a [`Balance`](crate::Balance) of HTTP endpoints (a layer:
//! [`RetryLayer`]); gray's reqwest routing (`reqwest::RouteMiddleware`) retries the same
//! way. Both follow the balancer's [`RetryPolicy`]
//! ([`BalanceLayer::with_retry`](crate::BalanceLayer::with_retry)) and share its budget
//! and its counts ([`Balance::retries`](crate::Balance::retries)).
//!
//! # Which requests are retried
//!
//! A request is sent again, to another endpoint of the same policy walk (the endpoints
//! it tried count as ejected for its next pick, so it falls back when they were the
//! only ones that fit), when its attempt failed with:
//!
//! - **nothing sent** (a [`Failure::Refused`] or [`Failure::Unsent`] connection, or an
//!   endpoint whose readiness failed): whatever its method, since nothing reached the
//!   instance. A refusal also takes the endpoint out of every pick at once (see
//!   [`health`](crate::health));
//! - **a broken connection before the response head** ([`Failure::Broken`]): only an
//!   idempotent request (RFC 9110's `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`
//!   by default; [`RetryPolicy::with_idempotent`]), and only once.
//!
//! Never retried: a request that got a response (any status), a request whose response
//! head arrived (the balancer's future has returned; nothing of the response reached
//! the caller before), an error that says nothing about the connection (a timeout), and
//! a request whose body cannot be sent again (over the cap). At most
//! [`max_retries`](RetryPolicy::with_max_retries) retries per request (2 by default).
//!
//! # The budget
//!
//! Retries are bounded by a budget per balancer: at most
//! [`budget_percent`](RetryPolicy::with_budget_percent) % of the requests of the last
//! [`window`](RetryPolicy::with_budget_window) (20 % of 10 s), plus
//! [`min_per_second`](RetryPolicy::with_min_per_second) retries per second (10), so a
//! sick service is not hit twice as hard. A retry the budget refuses fails with the
//! attempt's error, and is counted. The budget counts each request once, in two relaxed
//! atomic operations on a slot of the current second: no lock.
//!
//! # Bodies and copies
//!
//! To send a request again, the retry needs it again. An endpoint that fails before
//! sending anything may hand the request back inside its error
//! ([`Unsent`](gray_core::unsent::Unsent); gray-discovery's HTTP endpoints do): such a
//! request is retried as it is, body and all, and nothing was copied beforehand. A
//! request that may be retried after it was sent (an idempotent one), and every request
//! under [`Copies::All`] (for endpoints that drop a request they could not send, such as
//! tonic's `Channel`), is copied as each attempt is called, and the copy is kept while
//! that attempt is in flight: its head (method, URI, headers, extensions) and its body
//! through a [`ReplayBody`] that buffers what it sends, up to
//! [`max_replay_bytes`](RetryPolicy::with_max_replay_bytes) (64 KiB); beyond, the request
//! is not retried. The endpoints of a `Retry` take `http::Request<ReplayBody<B>>`.
//!
//! So a request that is not copied (a non-idempotent one, or any request when
//! [idempotent retries](RetryPolicy::with_idempotent) are off) costs a retrying balancer
//! what it costs a plain one, plus the budget's count: no allocation (the crate's
//! allocation test counts it). An empty body (a `GET`'s) is never buffered.
//!
//! Every retry is logged at debug level (target `gray::balance`: service, endpoint,
//! reason, attempt) and counted by reason ([`RetryStats`]).
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, io, sync::Arc, task::{Context, Poll}};
//! use gray_balance::{BalanceLayer, retry::{Copies, ReplayBody, Retry, RetryPolicy}};
//! use gray_core::{Labelled, Labels};
//! use gray_policy::Policy;
//! use tower::{BoxError, Service, ServiceExt, discover::Change};
//!
//! /// An endpoint whose instance is down (it refuses connections), or up.
//! #[derive(Clone)]
//! struct Endpoint { up: bool, labels: Arc<Labels> }
//!
//! impl Labelled for Endpoint {
//!     fn labels(&self) -> &Labels { &self.labels }
//! }
//!
//! impl Service<http::Request<ReplayBody<String>>> for Endpoint {
//!     type Response = &'static str;
//!     type Error = io::Error;
//!     type Future = Ready<Result<&'static str, io::Error>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: http::Request<ReplayBody<String>>) -> Self::Future {
//!         ready(if self.up { Ok("served") } else { Err(io::ErrorKind::ConnectionRefused.into()) })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let endpoints = futures_util::stream::iter([
//!     Ok::<_, Infallible>(Change::Insert(1, Endpoint { up: false, labels: Arc::default() })),
//!     Ok(Change::Insert(2, Endpoint { up: true, labels: Arc::default() })),
//! ]);
//! // These endpoints drop a request they could not send: every request is copied.
//! let balance = BalanceLayer::new("svc", Policy::new())
//!     .with_retry(RetryPolicy::new().with_copies(Copies::All))
//!     .build(endpoints);
//! let retry = Retry::new(balance.clone());
//! // Every request is served, whichever endpoint it went to first.
//! for _ in 0..4 {
//!     let request = http::Request::post("/orders").body("order".to_owned())?;
//!     assert_eq!(retry.clone().oneshot(request).await?, "served");
//! }
//! assert!(balance.retries().refused <= 1, "the dead one is out after its first refusal");
//! # Ok(())
//! # }
//! ```

mod body;
mod budget;
mod future;
mod service;

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use http::Method;

use self::budget::Budget;
pub use self::{
    body::{Capped, ReplayBody},
    future::RetryFuture,
    service::{Retry, RetryLayer},
};
use crate::health::Failure;

/// Which requests a [`Retry`] copies (as each attempt is called); see the
/// [module docs](self), "Bodies and copies".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Copies {
    /// Idempotent requests (the default): the others are retried only when the endpoint
    /// hands them back unsent, as gray-discovery's HTTP endpoints do.
    #[default]
    Idempotent,
    /// Every request: for endpoints that drop a request they could not send (tonic's
    /// `Channel`, which connects in the request's future).
    All,
}

/// When a balancer retries, and how much; see the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use gray_balance::retry::{Copies, RetryPolicy};
///
/// let policy = RetryPolicy::new()
///     .with_budget_percent(10)
///     .with_max_retries(1)
///     .with_copies(Copies::All);
/// assert_eq!(policy.budget_percent(), 10);
/// assert!(policy.is_idempotent(&http::Method::PUT));
/// assert!(!policy.is_idempotent(&http::Method::POST));
/// assert!(RetryPolicy::disabled().max_retries() == 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    max_retries: u32,
    budget_percent: u32,
    min_per_second: u32,
    window: Duration,
    idempotent: Vec<Method>,
    max_replay_bytes: usize,
    copies: Copies,
}

impl Default for RetryPolicy {
    /// Two retries at most; a budget of 20 % of 10 s plus 10 per second; RFC 9110's
    /// idempotent methods; bodies replayed up to 64 KiB; idempotent requests copied.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 2,
            budget_percent: 20,
            min_per_second: 10,
            window: Duration::from_secs(10),
            idempotent: Self::rfc9110_idempotent(),
            max_replay_bytes: 64 * 1024,
            copies: Copies::Idempotent,
        }
    }
}

impl RetryPolicy {
    /// The default; see [`RetryPolicy::default`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// No retries at all.
    #[must_use]
    pub fn disabled() -> Self {
        RetryPolicy::new().with_max_retries(0)
    }

    /// RFC 9110's idempotent methods: `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`.
    #[must_use]
    pub fn rfc9110_idempotent() -> Vec<Method> {
        vec![
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ]
    }

    /// Retries per request at most (0: none; at most 7).
    #[must_use]
    pub fn with_max_retries(mut self, max: u32) -> Self {
        self.max_retries = max.min(crate::index::MAX_TRIED as u32 - 1);
        self
    }

    /// The share of the window's requests that may be retried, in percent.
    #[must_use]
    pub fn with_budget_percent(mut self, percent: u32) -> Self {
        self.budget_percent = percent;
        self
    }

    /// Retries allowed per second of the window whatever the traffic.
    #[must_use]
    pub fn with_min_per_second(mut self, retries: u32) -> Self {
        self.min_per_second = retries;
        self
    }

    /// The window the budget counts over, in whole seconds (at least 1).
    #[must_use]
    pub fn with_budget_window(mut self, window: Duration) -> Self {
        self.window = window.max(Duration::from_secs(1));
        self
    }

    /// The methods whose requests are retried after a broken connection (empty: only
    /// requests that were not sent are retried).
    #[must_use]
    pub fn with_idempotent(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.idempotent = methods.into_iter().collect();
        self
    }

    /// The most body bytes buffered to send a request again.
    #[must_use]
    pub fn with_max_replay_bytes(mut self, bytes: usize) -> Self {
        self.max_replay_bytes = bytes;
        self
    }

    /// Which requests are copied (as each attempt is called).
    #[must_use]
    pub fn with_copies(mut self, copies: Copies) -> Self {
        self.copies = copies;
        self
    }

    /// Retries per request at most.
    #[must_use]
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The share of requests that may be retried, in percent.
    #[must_use]
    pub fn budget_percent(&self) -> u32 {
        self.budget_percent
    }

    /// Retries per second allowed whatever the traffic.
    #[must_use]
    pub fn min_per_second(&self) -> u32 {
        self.min_per_second
    }

    /// The budget's window.
    #[must_use]
    pub fn budget_window(&self) -> Duration {
        self.window
    }

    /// The methods retried after a broken connection.
    #[must_use]
    pub fn idempotent(&self) -> &[Method] {
        &self.idempotent
    }

    /// Whether `method` is retried after a broken connection.
    #[must_use]
    pub fn is_idempotent(&self, method: &Method) -> bool {
        self.idempotent.contains(method)
    }

    /// The most body bytes buffered for a retry.
    #[must_use]
    pub fn max_replay_bytes(&self) -> usize {
        self.max_replay_bytes
    }

    /// Which requests are copied.
    #[must_use]
    pub fn copies(&self) -> Copies {
        self.copies
    }
}

/// Retries made by a balancer since it was built, by reason, and those its budget
/// refused; see [`Balance::retries`](crate::Balance::retries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryStats {
    /// After a refused connection.
    pub refused: u64,
    /// After another failure to send anything (no connection, an unready endpoint).
    pub unsent: u64,
    /// Idempotent requests after a broken connection.
    pub broken: u64,
    /// Retries the budget refused (the request failed with its attempt's error).
    pub budget_exhausted: u64,
}

impl RetryStats {
    /// Retries made, all reasons.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.refused + self.unsent + self.broken
    }
}

/// A balancer's retry policy, budget and counts, shared by its `Retry` services and its
/// reqwest routing.
pub(crate) struct Retries {
    pub(crate) policy: RetryPolicy,
    budget: Budget,
    refused: AtomicU64,
    unsent: AtomicU64,
    broken: AtomicU64,
    exhausted: AtomicU64,
}

impl fmt::Debug for Retries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retries")
            .field("policy", &self.policy)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Retries {
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        let budget = Budget::new(
            policy.budget_percent,
            policy.min_per_second,
            u32::try_from(policy.window.as_secs()).unwrap_or(u32::MAX),
        );
        Retries {
            policy,
            budget,
            refused: AtomicU64::new(0),
            unsent: AtomicU64::new(0),
            broken: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
        }
    }

    /// Whether any request is retried.
    pub(crate) fn enabled(&self) -> bool {
        self.policy.max_retries > 0
    }

    /// Counts a request, at `now_ns` on the balancer's clock.
    pub(crate) fn deposit(&self, now_ns: u64) {
        self.budget.deposit(second(now_ns));
    }

    /// Whether an attempt that failed with `failure` may be retried, as the
    /// `retries`-th retry of a request whose method is idempotent or not.
    pub(crate) fn eligible(&self, failure: Failure, idempotent: bool, retries: u32) -> bool {
        let eligible = match failure {
            Failure::Refused | Failure::Unsent => true,
            // Once only: the request may have reached the instance.
            Failure::Broken => idempotent && retries == 0,
            Failure::Other => false,
        };
        eligible && retries < self.policy.max_retries
    }

    /// Takes a retry after `failure` from the budget at `now_ns` and counts it; or
    /// counts the budget's refusal and returns `false`.
    pub(crate) fn withdraw(&self, failure: Failure, now_ns: u64) -> bool {
        if !self.budget.withdraw(second(now_ns)) {
            self.exhausted.fetch_add(1, Relaxed);
            return false;
        }
        let counter = match failure {
            Failure::Refused => &self.refused,
            Failure::Broken => &self.broken,
            _ => &self.unsent,
        };
        counter.fetch_add(1, Relaxed);
        true
    }

    pub(crate) fn stats(&self) -> RetryStats {
        RetryStats {
            refused: self.refused.load(Relaxed),
            unsent: self.unsent.load(Relaxed),
            broken: self.broken.load(Relaxed),
            budget_exhausted: self.exhausted.load(Relaxed),
        }
    }
}

/// The second of `now_ns`.
fn second(now_ns: u64) -> u32 {
    (now_ns / 1_000_000_000) as u32
}
