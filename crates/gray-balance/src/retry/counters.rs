//! What a balancer's retries share: its policy, its budget and its counts ([`Retries`]),
//! read as [`RetryStats`].

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use super::{RetryPolicy, budget::Budget};
use crate::health::Failure;

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
            Failure::Broken | Failure::Unresponsive => idempotent && retries == 0,
            // The client's body failed (it is gone), or the instance answered.
            Failure::Other | Failure::Client => false,
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
            Failure::Broken | Failure::Unresponsive => &self.broken,
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
