//! The wire form of a [`MixtureTest`], checked when read back.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{MixtureTest, Onset};
use crate::millis::as_ms;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TestRepr {
    r0: f64,
    ratios: Vec<f64>,
    alpha: f64,
    onset_every_ms: u64,
    max_onsets: usize,
    began_ms: Option<u64>,
    opened: u64,
    log_closed: Option<f64>,
    onsets: Vec<Onset>,
    gray: u64,
    baseline: u64,
    /// For people to read; recomputed.
    #[serde(default)]
    log_m: Option<f64>,
    /// For people to read; recomputed.
    #[serde(default)]
    alarm_at: Option<f64>,
}

impl From<MixtureTest> for TestRepr {
    fn from(t: MixtureTest) -> Self {
        TestRepr {
            log_m: Some(t.log_m()),
            alarm_at: Some(t.log_threshold()),
            r0: t.r0,
            ratios: t.ratios,
            alpha: t.alpha,
            onset_every_ms: as_ms(t.onset_every),
            max_onsets: t.max_onsets,
            began_ms: t.began.map(as_ms),
            opened: t.opened,
            log_closed: t.log_closed,
            onsets: t.onsets,
            gray: t.gray,
            baseline: t.baseline,
        }
    }
}

impl TryFrom<TestRepr> for MixtureTest {
    type Error = String;

    fn try_from(t: TestRepr) -> Result<Self, String> {
        let multipliers: Vec<f64> = t.ratios.iter().map(|r| r / t.r0).collect();
        let mut test = MixtureTest::new(t.r0, &multipliers, t.alpha)
            .and_then(|test| {
                test.with_onsets(Duration::from_millis(t.onset_every_ms), t.max_onsets)
            })
            .map_err(|e| e.to_string())?;
        if t.onsets.len() > t.max_onsets {
            return Err(format!(
                "{} onsets open, at most {}",
                t.onsets.len(),
                t.max_onsets
            ));
        }
        for (i, onset) in t.onsets.iter().enumerate() {
            if onset.log_likelihoods.len() != t.ratios.len() {
                return Err(format!(
                    "onset {i}: {} log-likelihoods for {} ratios",
                    onset.log_likelihoods.len(),
                    t.ratios.len()
                ));
            }
            let numbers = onset.log_likelihoods.iter().chain([&onset.log_weight]);
            if let Some(l) = numbers.into_iter().find(|l| !l.is_finite()) {
                return Err(format!("onset {i}: {l} is not a finite number"));
            }
            if onset.index >= t.opened {
                return Err(format!(
                    "onset {i}: index {} not below {} opened",
                    onset.index, t.opened
                ));
            }
        }
        if t.log_closed.is_some_and(|l| !l.is_finite()) {
            return Err("log_closed is not a finite number".to_owned());
        }
        test.ratios = t.ratios;
        test.began = t.began_ms.map(Duration::from_millis);
        test.opened = t.opened;
        test.log_closed = t.log_closed;
        test.onsets = t.onsets;
        test.gray = t.gray;
        test.baseline = t.baseline;
        Ok(test)
    }
}
