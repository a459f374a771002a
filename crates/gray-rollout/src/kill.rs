//! The kill switch: a catastrophic gray rolls back at once, without waiting for the test.
//!
//! The sequential test needs a few bad events to be sure; when most of gray's requests
//! fail, there is nothing to weigh. The switch trips when, over the recent `window`
//! (10 s by default), **all** of these hold:
//!
//! - gray served at least `min_requests` requests (20);
//! - at least `error_ratio` of them failed (0.5), with 99.95 % confidence: the lower end
//!   of the Wilson interval (z = 3.29) of gray's error ratio reaches `error_ratio`, so 12
//!   failures of 20 requests are not enough, 18 of 20 or 32 of 40 are;
//! - at least `min_users` (3) gray users had their first error of the rollout within the
//!   window: one heavy user failing every request is not a catastrophe of the version;
//! - baseline's error ratio over the same window is below half of that lower end: a
//!   shared dependency failing both arms is not gray's fault.
//!
//! It counts requests, not users, and looks at fixed windows, so it has no bound on false
//! alarms of its own like the test's: the confidence bound keeps a gray as healthy as
//! baseline from tripping it by chance when a shared outage makes errors common, and the
//! simulations count its trips within the test's α.
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::evidence::Pair;
//! use gray_rollout::kill::{KillCounts, KillSwitch, KillWindow};
//!
//! let mut window = KillWindow::new(KillSwitch::new(), Duration::ZERO);
//! let s = Duration::from_secs;
//! // cumulative requests and errors per arm, and gray users who failed, as the
//! // evidence arrives
//! window.observe(s(1), KillCounts::new(Pair::new(10, 190), Pair::new(1, 0), 1));
//! assert!(window.check(s(1)).is_none());
//! window.observe(s(3), KillCounts::new(Pair::new(50, 950), Pair::new(41, 1), 30));
//! let trip = window.check(s(3)).expect("41 of gray's 50 requests failed");
//! assert_eq!((trip.gray_requests, trip.gray_errors), (50, 41));
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::evidence::{Arm, Pair};

/// The kill switch's settings; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct KillSwitch {
    /// Whether the switch is armed (default true).
    pub enabled: bool,
    /// The share of gray's recent requests that must have failed, in (0, 1].
    pub error_ratio: f64,
    /// The fewest gray requests in the window.
    pub min_requests: u64,
    /// The fewest gray users whose first error of the rollout falls in the window.
    pub min_users: u64,
    /// How far back "recent" goes (`window_ms`).
    #[serde(rename = "window_ms", with = "crate::millis")]
    pub window: Duration,
}

impl KillSwitch {
    /// The defaults: 50 % of at least 20 gray requests in 10 s, from at least 3 users.
    #[must_use]
    pub fn new() -> Self {
        KillSwitch {
            enabled: true,
            error_ratio: 0.5,
            min_requests: 20,
            min_users: 3,
            window: Duration::from_secs(10),
        }
    }

    /// Armed or not.
    #[must_use]
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The share of failed gray requests that trips the switch.
    #[must_use]
    pub fn with_error_ratio(mut self, ratio: f64) -> Self {
        self.error_ratio = ratio;
        self
    }

    /// The fewest gray requests in the window.
    #[must_use]
    pub fn with_min_requests(mut self, n: u64) -> Self {
        self.min_requests = n;
        self
    }

    /// The fewest gray users whose first error of the rollout falls in the window.
    #[must_use]
    pub fn with_min_users(mut self, n: u64) -> Self {
        self.min_users = n;
        self
    }

    /// How far back "recent" goes.
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}

impl Default for KillSwitch {
    fn default() -> Self {
        KillSwitch::new()
    }
}

/// What tripped the switch: the recent window's counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct KillEvidence {
    /// Gray requests in the window.
    pub gray_requests: u64,
    /// Gray requests that failed in the window.
    pub gray_errors: u64,
    /// Baseline requests in the window.
    pub baseline_requests: u64,
    /// Baseline requests that failed in the window.
    pub baseline_errors: u64,
    /// Gray users whose first error of the rollout fell in the window.
    pub gray_error_users: u64,
    /// How long the window actually spans, in milliseconds.
    pub window_ms: u64,
}

/// The cumulative counts of a rollout the switch looks at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KillCounts {
    /// Requests per arm.
    pub requests: Pair,
    /// Failed requests per arm.
    pub errors: Pair,
    /// Gray users with an error (each counted once, at their first).
    pub gray_error_users: u64,
}

impl KillCounts {
    /// Counts.
    #[must_use]
    pub fn new(requests: Pair, errors: Pair, gray_error_users: u64) -> Self {
        KillCounts {
            requests,
            errors,
            gray_error_users,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    counts: KillCounts,
}

/// The recent history of cumulative counts the switch looks at: a few dozen samples at
/// most (one kept per 1/32 of the window).
#[derive(Debug, Clone)]
pub struct KillWindow {
    switch: KillSwitch,
    samples: VecDeque<Sample>,
    latest: Sample,
}

impl KillWindow {
    /// An empty history for `switch`, starting at `now` with zero counts (a rollout's
    /// start).
    #[must_use]
    pub fn new(switch: KillSwitch, now: Duration) -> Self {
        KillWindow::resume(switch, now, KillCounts::default())
    }

    /// A history for `switch` that starts at `now` with the cumulative counts so far (a
    /// restored rollout).
    #[must_use]
    pub fn resume(switch: KillSwitch, now: Duration, counts: KillCounts) -> Self {
        let first = Sample { at: now, counts };
        KillWindow {
            switch,
            samples: VecDeque::from([first]),
            latest: first,
        }
    }

    /// Notes the cumulative counts at `now`.
    pub fn observe(&mut self, now: Duration, counts: KillCounts) {
        self.latest = Sample { at: now, counts };
        let keep_every = self.switch.window / 32;
        if self
            .samples
            .back()
            .is_none_or(|last| now >= last.at + keep_every)
        {
            self.samples.push_back(self.latest);
        }
    }

    /// The counts over the recent window at `now` (the switch's `window_ms`, from the
    /// newest sample at or before `now − window` to the latest), also when the switch is
    /// disabled.
    pub fn recent(&mut self, now: Duration) -> Recent {
        // the window starts at the newest sample at or before now − window
        let start = now.saturating_sub(self.switch.window);
        while self.samples.len() >= 2 && self.samples[1].at <= start {
            self.samples.pop_front();
        }
        self.since(start)
    }

    /// The counts over the last `span` at `now`, at most the switch's window (from the
    /// newest sample at or before `now − span`, samples being kept every 1/32 of the
    /// window): the shared-outage check reads a shorter window than the switch.
    pub fn recent_within(&mut self, now: Duration, span: Duration) -> Recent {
        let _ = self.recent(now);
        self.since(now.saturating_sub(span))
    }

    fn since(&self, start: Duration) -> Recent {
        let first = self
            .samples
            .iter()
            .rev()
            .find(|s| s.at <= start)
            .or(self.samples.front())
            .copied()
            .unwrap_or(self.latest);
        let (a, b) = (first.counts, self.latest.counts);
        let diff = |x: Pair, y: Pair| {
            Pair::new(
                y.gray.saturating_sub(x.gray),
                y.baseline.saturating_sub(x.baseline),
            )
        };
        Recent {
            requests: diff(a.requests, b.requests),
            errors: diff(a.errors, b.errors),
            gray_error_users: b.gray_error_users.saturating_sub(a.gray_error_users),
            span: self.latest.at.saturating_sub(first.at),
        }
    }

    /// Whether the switch trips at `now`.
    pub fn check(&mut self, now: Duration) -> Option<KillEvidence> {
        let recent = self.recent(now);
        let switch = &self.switch;
        if !switch.enabled {
            return None;
        }
        let Recent {
            requests,
            errors,
            gray_error_users: users,
            span,
        } = recent;
        if requests.gray < switch.min_requests.max(1) || users < switch.min_users {
            return None;
        }
        let gray_ratio = wilson_lower(errors.gray, requests.gray);
        let baseline_ratio = recent.error_ratio(Arm::Baseline).unwrap_or(0.0);
        (gray_ratio >= switch.error_ratio && baseline_ratio < gray_ratio / 2.0).then(|| {
            KillEvidence {
                gray_requests: requests.gray,
                gray_errors: errors.gray,
                baseline_requests: requests.baseline,
                baseline_errors: errors.baseline,
                gray_error_users: users,
                window_ms: crate::millis::as_ms(span),
            }
        })
    }
}

/// What the recent window counted ([`KillWindow::recent`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recent {
    /// Requests per arm.
    pub requests: Pair,
    /// Failed requests per arm.
    pub errors: Pair,
    /// Gray users whose first error of the rollout fell in the window.
    pub gray_error_users: u64,
    /// From the window's first sample to its last.
    pub span: Duration,
}

impl Recent {
    /// The share of `arm`'s requests that failed, if it served any.
    #[must_use]
    pub fn error_ratio(&self, arm: Arm) -> Option<f64> {
        let (requests, errors) = match arm {
            Arm::Gray => (self.requests.gray, self.errors.gray),
            Arm::Baseline => (self.requests.baseline, self.errors.baseline),
        };
        (requests > 0).then(|| errors.min(requests) as f64 / requests as f64)
    }
}

fn wilson_lower(k: u64, n: u64) -> f64 {
    const Z: f64 = 3.29;
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let z2n = Z * Z / n;
    let centre = p + z2n / 2.0;
    let half = Z * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    ((centre - half) / (1.0 + z2n)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn c(requests: Pair, errors: Pair, users: u64) -> KillCounts {
        KillCounts::new(requests, errors, users)
    }

    #[test]
    fn only_the_recent_window_counts() {
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        // a bad minute long ago, then healthy traffic
        w.observe(S(60), c(Pair::new(600, 11_400), Pair::new(500, 10), 400));
        assert!(w.check(S(60)).is_some());
        w.observe(S(80), c(Pair::new(800, 15_200), Pair::new(500, 10), 400));
        assert!(w.check(S(80)).is_none());
        w.observe(S(85), c(Pair::new(850, 16_150), Pair::new(501, 10), 401));
        let trip = w.check(S(85));
        assert!(trip.is_none(), "{trip:?}");
    }

    #[test]
    fn a_shared_outage_or_a_few_users_do_not_trip() {
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        // both arms fail 90 %
        w.observe(S(5), c(Pair::new(100, 1_900), Pair::new(90, 1_710), 80));
        assert!(w.check(S(5)).is_none());
        // gray fails alone, but from 2 users failing for the first time in the window
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        w.observe(S(5), c(Pair::new(100, 1_900), Pair::new(90, 2), 2));
        assert!(w.check(S(5)).is_none());
        // users who failed before the window do not count
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        w.observe(S(1), c(Pair::new(10, 190), Pair::new(1, 0), 10));
        w.observe(S(12), c(Pair::new(110, 2090), Pair::new(91, 2), 12));
        assert!(w.check(S(12)).is_none());
        w.observe(S(13), c(Pair::new(120, 2280), Pair::new(101, 2), 13));
        let trip = w.check(S(13)).expect("3 new failing users");
        assert_eq!(
            (trip.gray_requests, trip.gray_errors, trip.gray_error_users),
            (110, 100, 3)
        );
        // too few requests to judge, or disarmed
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        w.observe(S(5), c(Pair::new(19, 300), Pair::new(19, 0), 19));
        assert!(w.check(S(5)).is_none());
        w.observe(S(6), c(Pair::new(25, 300), Pair::new(25, 0), 25));
        assert!(w.check(S(6)).is_some());
        let mut off = KillWindow::new(KillSwitch::new().with_enabled(false), S(0));
        off.observe(S(6), c(Pair::new(25, 300), Pair::new(25, 0), 25));
        assert!(off.check(S(6)).is_none());
    }

    #[test]
    fn chance_is_not_a_catastrophe() {
        let trips = |gray_errors: u64, gray_requests: u64| {
            let mut w = KillWindow::new(KillSwitch::new(), S(0));
            let requests = Pair::new(gray_requests, 1000);
            w.observe(S(5), c(requests, Pair::new(gray_errors, 0), gray_errors));
            w.check(S(5)).is_some()
        };
        // the examples of the module docs
        assert!(!trips(12, 20));
        assert!(trips(18, 20));
        assert!(trips(32, 40));
        assert!(trips(20, 20));
        assert!(!trips(25, 40));
    }

    #[test]
    fn the_history_stays_small() {
        let mut w = KillWindow::new(KillSwitch::new(), S(0));
        for ms in (0..600_000u64).step_by(10) {
            let at = Duration::from_millis(ms);
            w.observe(at, c(Pair::new(ms, ms * 19), Pair::default(), 0));
            w.check(at);
        }
        assert!(w.samples.len() <= 120, "{}", w.samples.len());
    }
}
