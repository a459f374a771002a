//! Promotion on evidence: see [`Detect`].

use serde::{Deserialize, Serialize};

use super::{ConfigError, Rollout};

/// The degradation a step must be able to catch before it advances: the `detect` table.
///
/// Promotion on evidence: a step advances only once its test could have caught the
/// degradation the configuration names (`detect`), whatever `hold_ms` says.
///
/// A hold is time, and time is not evidence: at 4 s holds and a few hundred users a step,
/// a gray failing 2 % of its requests can reach 100 % with ln M at 2 of its 5.7, and 100 %
/// ends the test for good. So before a step advances (and before 100 % above all), the
/// machine asks the errors stream's test for its power on the step's own traffic
/// ([`MixtureTest::power`](crate::sequential::MixtureTest::power)): had gray's rate of bad
/// users been `ratio` × baseline's, or baseline's plus `min_rate` when that is more,
/// would the test have alarmed on this step's evidence with a chance of `power` or more?
///
/// The step's traffic, from its counts (summed over every gateway): `g` distinct gray
/// users, an estimated `g·(1 − w)/w` baseline users (the sticky split puts a share `w` in
/// gray), of whom `b` had a bad event; baseline's rate is `b / (g·(1 − w)/w)`. Under the
/// degradation, `g` times the degraded rate bad events are expected from gray. A step with
/// few users cannot reach the power and waits (the admin API shows the power so far, the
/// `evidence.step_power` of each transition and view): at 5 % with a clean baseline and the
/// default `min_rate` of 0.02, that is about 310 gray users; at 50 %, about 890. The
/// guide's table (`docs/rollout.md`) gives them per step and fault size.
///
/// | key | default | meaning |
/// |---|---|---|
/// | `ratio` | `2.0` | gray's rate of users with an error, as a multiple of baseline's |
/// | `min_rate` | `0.02` | or baseline's rate plus this share of users, when that is more (a clean baseline has a rate of 0) |
/// | `power` | `0.9` | the chance of catching it on the step's evidence that a step needs; 0 turns the requirement off |
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Detect {
    /// The degraded rate, as a multiple of baseline's.
    pub ratio: f64,
    /// The least degradation, as an added share of users.
    pub min_rate: f64,
    /// The power a step needs (0: none).
    pub power: f64,
}

impl Detect {
    /// The defaults: 2× or +2 % of users, with a power of 0.9.
    #[must_use]
    pub fn new() -> Self {
        Detect {
            ratio: 2.0,
            min_rate: 0.02,
            power: 0.9,
        }
    }

    /// With the ratio.
    #[must_use]
    pub fn with_ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// With the least added share of users.
    #[must_use]
    pub fn with_min_rate(mut self, rate: f64) -> Self {
        self.min_rate = rate;
        self
    }

    /// With the power a step needs (0: off).
    #[must_use]
    pub fn with_power(mut self, power: f64) -> Self {
        self.power = power;
        self
    }

    /// Whether steps wait for power at all.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.power > 0.0
    }

    /// The degraded rate of bad users for a baseline rate `baseline` (capped at 1).
    #[must_use]
    pub fn degraded(&self, baseline: f64) -> f64 {
        (self.ratio * baseline)
            .max(baseline + self.min_rate)
            .min(1.0)
    }

    pub(super) fn validate(&self, r0: f64) -> Result<(), ConfigError> {
        if !(self.ratio.is_finite() && self.ratio > r0) {
            return Err(ConfigError::new(
                "detect.ratio",
                format!(
                    "{} is not above the errors' tolerance ({r0}): a gray that much worse is not a fault",
                    self.ratio
                ),
            ));
        }
        if !(self.min_rate > 0.0 && self.min_rate <= 1.0) {
            return Err(ConfigError::new(
                "detect.min_rate",
                format!("{} is not in (0, 1]", self.min_rate),
            ));
        }
        if !(self.power >= 0.0 && self.power < 1.0) {
            return Err(ConfigError::new(
                "detect.power",
                format!("{} is not in [0, 1)", self.power),
            ));
        }
        Ok(())
    }
}

impl Default for Detect {
    fn default() -> Self {
        Detect::new()
    }
}

impl Rollout {
    /// The errors test's power on the current step's evidence so far, against the
    /// configured degradation (see [`Detect`]); `None` at 0 % or 100 %.
    pub(super) fn step_power(&self) -> Option<f64> {
        let w = self.state.epoch.weight / 100.0;
        if !(w > 0.0 && w < 1.0) {
            return None;
        }
        let counts = &self.state.evidence.epoch;
        let gray_users = counts.gray_users as f64;
        let bad = counts.bad_users.errors.baseline as f64;
        let baseline_users = gray_users * (1.0 - w) / w;
        let rate = if baseline_users > 0.0 {
            (bad / baseline_users).min(1.0)
        } else {
            0.0
        };
        let test = &self.state.evidence.streams.errors;
        let degraded = self.config.detect.degraded(rate);
        if degraded <= test.tolerance() * rate {
            return Some(0.0);
        }
        Some(test.power(self.state.epoch.started, w, gray_users * degraded, bad))
    }

    /// Whether the step's evidence could have caught the degradation (always, when the
    /// requirement is off).
    pub(super) fn powered(&self) -> bool {
        !self.config.detect.is_enabled()
            || self
                .state
                .evidence
                .step_power
                .is_some_and(|p| p >= self.config.detect.power)
    }
}

impl super::RolloutConfig {
    /// For each step below 100 %, about how many distinct gray users the step must see
    /// before it may advance, with a clean baseline (no baseline user with an error): the
    /// fewest whose evidence reaches the [`Detect`] power, the step taken to begin
    /// `index × hold` into the run. `None` for every step when the requirement is off or
    /// the configuration is not valid.
    #[must_use]
    pub fn users_to_detect(&self) -> Vec<(f64, Option<u64>)> {
        let test = match self.tests() {
            Ok(mut tests) if self.detect.is_enabled() => {
                tests.errors.begin(std::time::Duration::ZERO);
                Some(tests.errors)
            }
            _ => None,
        };
        let rate = self.detect.degraded(0.0);
        let steps = self.steps.iter().filter(|w| **w < 100.0);
        steps
            .enumerate()
            .map(|(i, &weight)| {
                let Some(test) = &test else {
                    return (weight, None);
                };
                let since = self
                    .hold
                    .saturating_mul(u32::try_from(i).unwrap_or(u32::MAX));
                let power =
                    |users: u64| test.power(since, weight / 100.0, users as f64 * rate, 0.0);
                // the power grows with the users: the first that reach it, by bisection
                let (mut lo, mut hi) = (0u64, 1u64);
                while power(hi) < self.detect.power {
                    if hi >= 1 << 40 {
                        return (weight, None);
                    }
                    (lo, hi) = (hi, hi * 2);
                }
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if power(mid) >= self.detect.power {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                (weight, Some(hi))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RolloutConfig;

    #[test]
    fn the_users_a_step_needs_grow_with_its_share() {
        let config = RolloutConfig::new("canary").with_steps([5.0, 25.0, 50.0, 100.0]);
        let needed = config.users_to_detect();
        let n: Vec<u64> = needed.iter().map(|(_, n)| n.unwrap()).collect();
        assert_eq!(needed.len(), 3, "{needed:?}");
        assert!(n[0] > 200 && n[0] < 500, "{n:?}");
        assert!(n[0] < n[1] && n[1] < n[2], "{n:?}");
        let off = config.with_detect(Detect::new().with_power(0.0));
        assert!(off.users_to_detect().iter().all(|(_, n)| n.is_none()));
    }
}
