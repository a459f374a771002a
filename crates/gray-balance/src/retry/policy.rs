//! When a balancer retries, and how much: [`RetryPolicy`] and [`Copies`] (see the
//! [module docs](super)).

use std::time::Duration;

use http::Method;

/// Which requests a [`Retry`](super::Retry) copies (as each attempt is called); see the
/// [module docs](super), "Bodies and copies".
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

/// When a balancer retries, and how much; see the [module docs](super).
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
    pub(super) max_retries: u32,
    pub(super) budget_percent: u32,
    pub(super) min_per_second: u32,
    pub(super) window: Duration,
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
