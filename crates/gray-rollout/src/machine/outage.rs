//! Shared outages: see [`SharedOutage`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::evidence::Arm;
use crate::kill::Recent;
use crate::millis::as_ms;

/// When a shared outage pauses a rollout: the `outage` table.
///
/// A shared outage is not a clean hold: while both arms fail together, the step's time
/// does not count, and the rollout pauses (`outage`) until baseline's errors are back to
/// normal.
///
/// A dependency that both versions share going down makes every request fail in both
/// arms. The test rightly sees nothing against gray (both arms alike), but a hold that
/// passes during it has shown nothing either. Over the last `window_ms` (2 s, at most the
/// kill switch's window), the rollout is in a shared outage when baseline served at
/// least `min_requests` requests of which at least `error_ratio` failed, and gray's
/// error ratio over the window is as high (or gray served nothing). It is looked for at
/// every tick of a running step, so an outage is seen within about a second of its start
/// once baseline serves 10 requests a second or more; a service with less traffic than
/// `min_requests` per window is not judged (lower `min_requests`, or widen `window_ms`).
/// It pauses, and the test keeps running (a gray worse than baseline still rolls back). The pause lifts by
/// itself once baseline, over a window with `min_requests` requests, fails less than
/// half of `error_ratio`; the step then starts again with fresh counts (a new epoch at
/// the same weight, the latency thresholds kept), so its hold and power are earned after
/// the outage.
///
/// | key | default | meaning |
/// |---|---|---|
/// | `enabled` | `true` | whether it pauses at all |
/// | `error_ratio` | `0.25` | the share of failed requests, in both arms, that makes an outage |
/// | `min_requests` | `20` | baseline requests the window needs to tell |
/// | `window_ms` | `2000` | the window looked at (at most `kill_switch.window_ms`) |
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SharedOutage {
    /// Whether a shared outage pauses the rollout.
    pub enabled: bool,
    /// The error ratio of both arms that makes an outage.
    pub error_ratio: f64,
    /// The baseline requests the window needs.
    pub min_requests: u64,
    /// The window looked at (`window_ms`).
    #[serde(rename = "window_ms", with = "crate::millis")]
    pub window: Duration,
}

impl SharedOutage {
    /// The defaults: on, 25 % of requests failing in both arms, 20 baseline requests.
    #[must_use]
    pub fn new() -> Self {
        SharedOutage {
            enabled: true,
            error_ratio: 0.25,
            min_requests: 20,
            window: Duration::from_secs(2),
        }
    }

    /// Turned on or off.
    #[must_use]
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// With the error ratio.
    #[must_use]
    pub fn with_error_ratio(mut self, ratio: f64) -> Self {
        self.error_ratio = ratio;
        self
    }

    /// With the baseline requests a window needs.
    #[must_use]
    pub fn with_min_requests(mut self, n: u64) -> Self {
        self.min_requests = n;
        self
    }

    /// With the window looked at.
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Whether `recent` is a shared outage.
    pub(super) fn began(&self, recent: &Recent) -> bool {
        let (Some(base), gray) = (self.baseline(recent), recent.error_ratio(Arm::Gray)) else {
            return false;
        };
        self.enabled && base >= self.error_ratio && gray.is_none_or(|g| g >= self.error_ratio)
    }

    /// Whether baseline is back to normal in `recent`.
    pub(super) fn ended(&self, recent: &Recent) -> bool {
        !self.enabled
            || self
                .baseline(recent)
                .is_some_and(|base| base < self.error_ratio / 2.0)
    }

    fn baseline(&self, recent: &Recent) -> Option<f64> {
        if recent.requests.baseline < self.min_requests.max(1) {
            return None;
        }
        recent.error_ratio(Arm::Baseline)
    }

    pub(super) fn validate(&self, kill_window: Duration) -> Result<(), ConfigError> {
        if self.window.is_zero() || self.window > kill_window {
            return Err(ConfigError::new(
                "outage.window_ms",
                format!(
                    "{} ms is not in (0, kill_switch.window_ms = {} ms]",
                    self.window.as_millis(),
                    kill_window.as_millis()
                ),
            ));
        }
        if !(self.error_ratio > 0.0 && self.error_ratio <= 1.0) {
            return Err(ConfigError::new(
                "outage.error_ratio",
                format!("{} is not in (0, 1]", self.error_ratio),
            ));
        }
        Ok(())
    }
}

impl Default for SharedOutage {
    fn default() -> Self {
        SharedOutage::new()
    }
}

/// What the recent window counted when an outage began or ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct OutageEvidence {
    /// Gray's requests in the window.
    pub gray_requests: u64,
    /// Gray's failed requests in the window.
    pub gray_errors: u64,
    /// Baseline's requests in the window.
    pub baseline_requests: u64,
    /// Baseline's failed requests in the window.
    pub baseline_errors: u64,
    /// The window, in milliseconds.
    pub window_ms: u64,
}

impl From<&Recent> for OutageEvidence {
    fn from(r: &Recent) -> Self {
        OutageEvidence {
            gray_requests: r.requests.gray,
            gray_errors: r.errors.gray,
            baseline_requests: r.requests.baseline,
            baseline_errors: r.errors.baseline,
            window_ms: as_ms(r.span),
        }
    }
}
