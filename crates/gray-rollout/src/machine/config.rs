//! A rollout's configuration and its validation.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Detect, SharedOutage};
use crate::evidence::{PerStream, Stream};
use crate::kill::KillSwitch;
use crate::sequential::{
    DEFAULT_MAX_ONSETS, DEFAULT_MULTIPLIERS, DEFAULT_ONSET_EVERY, MixtureTest,
};

/// A rollout's configuration: the `[services.<name>.rollout]` table of the gateway.
///
/// Deserialises from the keys below (every key but `rule` has a default) and is checked
/// by [`validate`](Self::validate), which [`Rollout::new`](super::Rollout::new) calls:
///
/// | key | default | meaning |
/// |---|---|---|
/// | `rule` | (required) | the sticky-percentage rule the rollout drives |
/// | `steps` | `[1, 5, 10, 25, 50, 100]` | percentages, increasing, the last 100 |
/// | `hold_ms` | `60000` | the least time spent at each step |
/// | `min_users` | `100` | the fewest distinct users seen in gray before a step advances |
/// | `gates` | `[]` | steps (percentages) that wait for a manual `resume` before they are entered |
/// | `alpha` | `0.01` | the bound on the chance of rolling back a healthy gray, split evenly over the three streams |
/// | `tolerance` | `1.0` each | `r0` per stream (`errors`, `latency_p99`, `latency_p50`): gray may be this many times worse than baseline before it counts as bad |
/// | `ratios` | `[1.5, 2, 3, 5, 10, 20, 50, 100]` | the grid of the mixture, as multiples of `r0` |
/// | `onset_every_ms` | `60000` | how often the test opens a fresh mixture for a change that begins then; 0: one, at the start (see [`sequential`](crate::sequential)) |
/// | `max_onsets` | `16` | how many of those stay open |
/// | `kill_switch` | see [`KillSwitch`] | `enabled`, `error_ratio`, `min_requests`, `min_users`, `window_ms` |
/// | `stale_ms` | `30000` | evidence older than this (or no gray request for this long) pauses the rollout |
/// | `min_latency_samples` | `1000` | baseline latencies needed to set an epoch's p99 and p50 thresholds |
/// | `detect` | see [`Detect`] | `ratio`, `min_rate`, `power`: the degradation a step's evidence must be able to catch before it advances |
/// | `users_per_s` | none | the distinct users a second the service expects: only the gateway's `--check` reads it, to warn of holds shorter than the time a step needs to see the users of [`users_to_detect`](Self::users_to_detect) |
/// | `outage` | see [`SharedOutage`] | `enabled`, `error_ratio`, `min_requests`, `window_ms`: when both arms failing together pauses the rollout |
/// | `shadow` | none | `{ hold_ms, min_requests }` ([`ShadowPhase`]): the rollout starts in phase `shadow`, copies only, judged by [`crate::shadow`] |
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RolloutConfig {
    /// The sticky-percentage rule the rollout drives, by name.
    pub rule: String,
    /// The percentages, in order.
    pub steps: Vec<f64>,
    /// The least time per step (`hold_ms`).
    #[serde(rename = "hold_ms", with = "crate::millis")]
    pub hold: Duration,
    /// The fewest distinct users seen in gray per step.
    pub min_users: u64,
    /// Steps (percentages) entered only after a manual resume.
    pub gates: Vec<f64>,
    /// The bound on P(rolling back a healthy gray).
    pub alpha: f64,
    /// `r0` per stream.
    pub tolerance: Tolerance,
    /// The mixture's grid, as multiples of `r0`.
    pub ratios: Vec<f64>,
    /// How often the test opens a fresh mixture (`onset_every_ms`).
    #[serde(rename = "onset_every_ms", with = "crate::millis")]
    pub onset_every: Duration,
    /// How many onsets stay open.
    pub max_onsets: usize,
    /// The kill switch.
    pub kill_switch: KillSwitch,
    /// How old evidence may be before the rollout pauses (`stale_ms`).
    #[serde(rename = "stale_ms", with = "crate::millis")]
    pub stale_after: Duration,
    /// Baseline latencies needed before an epoch's thresholds are set.
    pub min_latency_samples: u64,
    /// The degradation a step must be able to catch before it advances.
    pub detect: Detect,
    /// When a shared outage pauses the rollout.
    pub outage: SharedOutage,
    /// The distinct users a second the service expects (for `--check`'s estimate only).
    pub users_per_s: Option<f64>,
    /// A shadow phase before the first step (`shadow`).
    pub shadow: Option<ShadowPhase>,
}

/// A rollout's shadow phase (`shadow = { hold_ms, min_requests }`): the rollout starts
/// with copies only (weight 0: no user is answered by gray), its mirror's comparisons
/// judged by the anytime-valid test of [`crate::shadow`]; an alarm rolls it back, and once
/// `hold_ms` passed and `min_requests` copies were judged with no alarm, it enters its
/// first step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ShadowPhase {
    /// The least time in the shadow phase (`hold_ms`, default 60000).
    #[serde(rename = "hold_ms", with = "crate::millis")]
    pub hold: Duration,
    /// The fewest copies judged before the first step (`min_requests`, default 500).
    pub min_requests: u64,
}

impl ShadowPhase {
    /// A shadow phase of `hold`, judging at least `min_requests` copies.
    #[must_use]
    pub fn new(hold: Duration, min_requests: u64) -> Self {
        ShadowPhase { hold, min_requests }
    }
}

impl Default for ShadowPhase {
    fn default() -> Self {
        ShadowPhase::new(Duration::from_secs(60), 500)
    }
}

/// The tolerated degradation `r0` of each stream: the null hypothesis of the stream's
/// test is "gray's rate of bad users ≤ r0 × baseline's".
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Tolerance {
    /// For errors.
    pub errors: f64,
    /// For latencies above the baseline's p99.
    pub latency_p99: f64,
    /// For latencies above the baseline's p50.
    pub latency_p50: f64,
}

impl Tolerance {
    /// 1.0 for every stream: gray no worse than baseline.
    #[must_use]
    pub fn new() -> Self {
        Tolerance {
            errors: 1.0,
            latency_p99: 1.0,
            latency_p50: 1.0,
        }
    }

    /// `r0` of `stream`.
    #[must_use]
    pub fn get(&self, stream: Stream) -> f64 {
        match stream {
            Stream::Errors => self.errors,
            Stream::LatencyP99 => self.latency_p99,
            Stream::LatencyP50 => self.latency_p50,
        }
    }

    /// With `r0` of `stream` set to `r0`.
    #[must_use]
    pub fn with(mut self, stream: Stream, r0: f64) -> Self {
        match stream {
            Stream::Errors => self.errors = r0,
            Stream::LatencyP99 => self.latency_p99 = r0,
            Stream::LatencyP50 => self.latency_p50 = r0,
        }
        self
    }
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance::new()
    }
}

/// A configuration that cannot run: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    problem: String,
}

impl ConfigError {
    pub(super) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field, as written in the configuration (`steps[2]`, `kill_switch.error_ratio`).
    #[must_use]
    pub fn field(&self) -> &str {
        &self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rollout `{}`: {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {}

// === impl RolloutConfig ===

impl RolloutConfig {
    /// The defaults, driving the rule `rule`.
    pub fn new(rule: impl Into<String>) -> Self {
        RolloutConfig {
            rule: rule.into(),
            steps: vec![1.0, 5.0, 10.0, 25.0, 50.0, 100.0],
            hold: Duration::from_secs(60),
            min_users: 100,
            gates: Vec::new(),
            alpha: 0.01,
            tolerance: Tolerance::new(),
            ratios: DEFAULT_MULTIPLIERS.to_vec(),
            onset_every: DEFAULT_ONSET_EVERY,
            max_onsets: DEFAULT_MAX_ONSETS,
            kill_switch: KillSwitch::new(),
            stale_after: Duration::from_secs(30),
            min_latency_samples: 1000,
            detect: Detect::new(),
            outage: SharedOutage::new(),
            users_per_s: None,
            shadow: None,
        }
    }

    /// A shadow phase before the first step.
    #[must_use]
    pub fn with_shadow(mut self, shadow: ShadowPhase) -> Self {
        self.shadow = Some(shadow);
        self
    }

    /// The fresh tests of a shadow phase (mismatches, slow answers): the rollout's α split
    /// evenly over them, against `r0` = 1 (a copy no worse than a control).
    pub(crate) fn shadow_tests(&self) -> Result<(MixtureTest, MixtureTest), ConfigError> {
        let test = MixtureTest::new(1.0, &self.ratios, self.alpha / 2.0)
            .and_then(|t| t.with_onsets(self.onset_every, self.max_onsets))
            .map_err(|e| ConfigError::new("shadow", e.to_string()))?;
        Ok((test.clone(), test))
    }

    /// The steps, in percent.
    #[must_use]
    pub fn with_steps(mut self, steps: impl Into<Vec<f64>>) -> Self {
        self.steps = steps.into();
        self
    }

    /// The least time per step.
    #[must_use]
    pub fn with_hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// The fewest distinct gray users per step.
    #[must_use]
    pub fn with_min_users(mut self, n: u64) -> Self {
        self.min_users = n;
        self
    }

    /// Steps (percentages) that wait for a manual resume.
    #[must_use]
    pub fn with_gates(mut self, gates: impl Into<Vec<f64>>) -> Self {
        self.gates = gates.into();
        self
    }

    /// The false-rollback bound.
    #[must_use]
    pub fn with_alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }

    /// The tolerated degradation per stream.
    #[must_use]
    pub fn with_tolerance(mut self, tolerance: Tolerance) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The mixture's grid, as multiples of `r0`.
    #[must_use]
    pub fn with_ratios(mut self, ratios: impl Into<Vec<f64>>) -> Self {
        self.ratios = ratios.into();
        self
    }

    /// How often the test opens a fresh mixture, and how many stay open.
    #[must_use]
    pub fn with_onsets(mut self, every: Duration, max: usize) -> Self {
        self.onset_every = every;
        self.max_onsets = max;
        self
    }

    /// The kill switch.
    #[must_use]
    pub fn with_kill_switch(mut self, kill_switch: KillSwitch) -> Self {
        self.kill_switch = kill_switch;
        self
    }

    /// How old evidence may get before the rollout pauses.
    #[must_use]
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// Baseline latencies needed to set an epoch's thresholds.
    #[must_use]
    pub fn with_min_latency_samples(mut self, n: u64) -> Self {
        self.min_latency_samples = n;
        self
    }

    /// The degradation a step must be able to catch before it advances.
    #[must_use]
    pub fn with_detect(mut self, detect: Detect) -> Self {
        self.detect = detect;
        self
    }

    /// When a shared outage pauses the rollout.
    #[must_use]
    pub fn with_outage(mut self, outage: SharedOutage) -> Self {
        self.outage = outage;
        self
    }

    /// α of each stream's test: α split evenly over the three streams (Bonferroni), so
    /// that P(any stream falsely alarms) ≤ α.
    #[must_use]
    pub fn stream_alpha(&self) -> f64 {
        self.alpha / Stream::ALL.len() as f64
    }

    /// A fresh test for each stream.
    pub(crate) fn tests(&self) -> Result<PerStream<MixtureTest>, ConfigError> {
        let test = |s: Stream| {
            MixtureTest::new(self.tolerance.get(s), &self.ratios, self.stream_alpha())
                .and_then(|t| t.with_onsets(self.onset_every, self.max_onsets))
                .map_err(|e| ConfigError::new(format!("tolerance.{s}"), e.to_string()))
        };
        Ok(PerStream {
            errors: test(Stream::Errors)?,
            latency_p99: test(Stream::LatencyP99)?,
            latency_p50: test(Stream::LatencyP50)?,
        })
    }

    /// Checks every field; the first problem found is returned, naming its field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.rule.trim().is_empty() {
            return Err(ConfigError::new(
                "rule",
                "required: the name of the sticky-percentage rule to drive",
            ));
        }
        if self.steps.is_empty() {
            return Err(ConfigError::new("steps", "needs at least one step (100)"));
        }
        let mut before = 0.0;
        for (i, &p) in self.steps.iter().enumerate() {
            let field = format!("steps[{i}]");
            if !(p.is_finite() && p > 0.0 && p <= 100.0) {
                return Err(ConfigError::new(field, format!("{p} is not in (0, 100]")));
            }
            if p <= before {
                return Err(ConfigError::new(
                    field,
                    format!("{p} does not increase on the step before ({before})"),
                ));
            }
            if p.mul_add(-100.0, (p * 100.0).round()).abs() > 1e-6 {
                return Err(ConfigError::new(
                    field,
                    format!("{p} is finer than the sticky rule's resolution of 0.01 %"),
                ));
            }
            before = p;
        }
        if before != 100.0 {
            return Err(ConfigError::new(
                format!("steps[{}]", self.steps.len() - 1),
                format!("the last step must be 100, not {before}"),
            ));
        }
        for (i, g) in self.gates.iter().enumerate() {
            if !self.steps.contains(g) {
                return Err(ConfigError::new(
                    format!("gates[{i}]"),
                    format!("{g} is not one of the steps {:?}", self.steps),
                ));
            }
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(ConfigError::new(
                "alpha",
                format!("{} is not in (0, 1)", self.alpha),
            ));
        }
        for (i, m) in self.ratios.iter().enumerate() {
            if !(m.is_finite() && *m > 1.0) {
                return Err(ConfigError::new(
                    format!("ratios[{i}]"),
                    format!("{m} is not a number above 1"),
                ));
            }
        }
        if self.ratios.is_empty() {
            return Err(ConfigError::new("ratios", "needs at least one ratio"));
        }
        if self.max_onsets == 0 {
            return Err(ConfigError::new("max_onsets", "must be at least 1"));
        }
        for s in Stream::ALL {
            let r0 = self.tolerance.get(s);
            if !(r0.is_finite() && r0 > 0.0) {
                return Err(ConfigError::new(
                    format!("tolerance.{s}"),
                    format!("{r0} is not a positive number"),
                ));
            }
        }
        let k = &self.kill_switch;
        if !(k.error_ratio > 0.0 && k.error_ratio <= 1.0) {
            return Err(ConfigError::new(
                "kill_switch.error_ratio",
                format!("{} is not in (0, 1]", k.error_ratio),
            ));
        }
        if k.window.is_zero() {
            return Err(ConfigError::new("kill_switch.window_ms", "must be above 0"));
        }
        if self.stale_after.is_zero() {
            return Err(ConfigError::new("stale_ms", "must be above 0"));
        }
        if self.min_latency_samples < 100 {
            return Err(ConfigError::new(
                "min_latency_samples",
                format!(
                    "{} is too few to estimate a p99 (at least 100)",
                    self.min_latency_samples
                ),
            ));
        }
        self.detect.validate(self.tolerance.errors)?;
        if let Some(n) = self.users_per_s
            && !(n.is_finite() && n > 0.0)
        {
            return Err(ConfigError::new(
                "users_per_s",
                format!("{n} is not a positive number"),
            ));
        }
        self.outage.validate(self.kill_switch.window)?;
        if let Some(shadow) = &self.shadow
            && shadow.min_requests == 0
        {
            return Err(ConfigError::new(
                "shadow.min_requests",
                "expected at least 1: a shadow phase judges copies",
            ));
        }
        Ok(())
    }
}

impl Default for RolloutConfig {
    /// The defaults with no rule: [`validate`](RolloutConfig::validate) asks for one.
    fn default() -> Self {
        RolloutConfig::new("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(config: RolloutConfig) -> String {
        config.validate().unwrap_err().field().to_owned()
    }

    #[test]
    fn the_issues_keys_deserialise() {
        let json = r#"{"rule": "canary", "steps": [1, 5, 10, 25, 50, 100], "hold_ms": 30000,
                       "min_users": 200, "alpha": 0.01, "gates": [50],
                       "tolerance": {"latency_p50": 1.5},
                       "kill_switch": {"error_ratio": 0.8}}"#;
        let config: RolloutConfig = serde_json::from_str(json).unwrap();
        config.validate().unwrap();
        assert_eq!(config.hold, Duration::from_secs(30));
        assert_eq!(config.min_users, 200);
        assert_eq!(config.tolerance.get(Stream::LatencyP50), 1.5);
        assert_eq!(config.tolerance.get(Stream::Errors), 1.0);
        assert_eq!(config.kill_switch.error_ratio, 0.8);
        assert_eq!(config.kill_switch.min_requests, 20);
        assert_eq!(config.ratios, DEFAULT_MULTIPLIERS);
        let err = serde_json::from_str::<RolloutConfig>(r#"{"rule": "c", "hold": 1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `hold`"), "{err}");
    }

    #[test]
    fn every_field_is_checked_and_named() {
        let ok = RolloutConfig::new("canary");
        ok.validate().unwrap();
        assert_eq!(field_of(RolloutConfig::default()), "rule");
        assert_eq!(field_of(ok.clone().with_steps([])), "steps");
        assert_eq!(
            field_of(ok.clone().with_steps([5.0, 1.0, 100.0])),
            "steps[1]"
        );
        assert_eq!(field_of(ok.clone().with_steps([0.0, 100.0])), "steps[0]");
        assert_eq!(field_of(ok.clone().with_steps([1.0, 150.0])), "steps[1]");
        assert_eq!(field_of(ok.clone().with_steps([1.0, 50.0])), "steps[1]");
        assert_eq!(field_of(ok.clone().with_steps([0.001, 100.0])), "steps[0]");
        assert_eq!(
            field_of(ok.clone().with_steps([f64::NAN, 100.0])),
            "steps[0]"
        );
        assert_eq!(field_of(ok.clone().with_gates([1.0, 7.0])), "gates[1]");
        assert_eq!(field_of(ok.clone().with_alpha(0.0)), "alpha");
        assert_eq!(field_of(ok.clone().with_alpha(1.0)), "alpha");
        assert_eq!(field_of(ok.clone().with_ratios([2.0, 0.5])), "ratios[1]");
        assert_eq!(field_of(ok.clone().with_ratios([])), "ratios");
        assert_eq!(
            field_of(ok.clone().with_onsets(Duration::ZERO, 0)),
            "max_onsets"
        );
        let t = Tolerance::new().with(Stream::LatencyP99, -1.0);
        assert_eq!(
            field_of(ok.clone().with_tolerance(t)),
            "tolerance.latency_p99"
        );
        let k = KillSwitch::new().with_error_ratio(1.5);
        assert_eq!(
            field_of(ok.clone().with_kill_switch(k)),
            "kill_switch.error_ratio"
        );
        let k = KillSwitch::new().with_window(Duration::ZERO);
        assert_eq!(
            field_of(ok.clone().with_kill_switch(k)),
            "kill_switch.window_ms"
        );
        assert_eq!(
            field_of(ok.clone().with_stale_after(Duration::ZERO)),
            "stale_ms"
        );
        assert_eq!(
            field_of(ok.clone().with_min_latency_samples(10)),
            "min_latency_samples"
        );
        let d = Detect::new().with_ratio(1.0);
        assert_eq!(field_of(ok.clone().with_detect(d)), "detect.ratio");
        let d = Detect::new().with_min_rate(0.0);
        assert_eq!(field_of(ok.clone().with_detect(d)), "detect.min_rate");
        let d = Detect::new().with_power(1.0);
        assert_eq!(field_of(ok.clone().with_detect(d)), "detect.power");
        let o = SharedOutage::new().with_error_ratio(0.0);
        assert_eq!(field_of(ok.clone().with_outage(o)), "outage.error_ratio");
        let err = ok
            .with_steps([1.0, 5.0, 3.0, 100.0])
            .validate()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "rollout `steps[2]`: 3 does not increase on the step before (5)"
        );
    }
}
