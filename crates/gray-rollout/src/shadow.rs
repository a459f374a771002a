//! The judge of a shadow: is a mirror's lane answering differently from baseline, beyond
//! the noise two baseline instances show between themselves?
//!
//! A mirror copies users' requests to the shadow (the gray lane) and compares each copy's
//! answer with the answer the user got. Some fields differ on every answer whoever serves
//! it (a timestamp, a request id, an order of keys): comparing gray with baseline alone
//! cannot tell those from a bug. So a share of the requests also goes to a second baseline
//! instance, a *control*, compared with the user's answer in the same way (Diffy's trick).
//! The judge sees two arms of comparisons: [`Arm::Gray`] (a copy against the user's
//! answer) and [`Arm::Baseline`] (a control against it).
//!
//! **Noise is learned.** A difference (a key such as `json /ts` or `header etag`; array
//! indices are generalised to `*`, so `json /items/3/ts` is learned as `json /items/*/ts`)
//! seen in at least `noise_min` control comparisons is noise from then on, and no longer
//! makes a comparison of either arm a mismatch. A status class is never noise. What is
//! learned in a batch applies from the next one, for both arms alike. The test starts once
//! `warmup` controls (50 by default) have been compared: until then the judge only
//! learns, so that the noise every answer shows (a timestamp) is known before it could
//! weigh on the test. (Noise that first shows later is a debt the test pays back: its
//! batch's bad events fall in both arms, most of them in the copies', the larger arm.)
//!
//! **Two streams of bad events**, each judged by the anytime-valid [`MixtureTest`]:
//!
//! - `mismatch`: a comparison with a difference outside the noise;
//! - `slow`: a comparison whose answer took more than twice the user's answer and more
//!   than 10 ms beyond it (the caller decides, and says so in [`Comparison::new`]).
//!
//! **Unit of analysis and null.** The unit is a *pair*: a request's copy and its control,
//! both compared with the user's answer ([`Judge::observe_pair`]); a copy without a
//! control is judged for the metrics but not counted by the test. Under the null
//! hypothesis the shadow's answers differ from the users' (or are slow) no more often than
//! a second baseline instance's do: within a pair, judged by the same noise, the copy and
//! the control are exchangeable, so of the bad events of any set of pairs each is the
//! copy's with probability 1/2 at most, and the test is fed at that share. Given a set of
//! pairs and its bad events, the copies' count is a sum of hypergeometric draws, smaller
//! in convex order than the binomial the test's factor is built for (Hoeffding, 1963), so
//! each factor keeps an expectation of at most 1 and Ville's inequality bounds the chance
//! of any false alarm of a stream, ever, by its share of `alpha` (half of it each:
//! Bonferroni). Because every pair has the same share, counts of pairs add up: the
//! batches of several looks, and the counts of several gateways (each with the noise its
//! own judge learned), merge into one batch without changing the bound — which is how a
//! rollout's shadow phase judges a fleet ([`ShadowCounts`], one report per gateway). What
//! it assumes: the controls are drawn independently of the answers (a fixed share of the
//! requests, at random), and a copy's and a control's answers to the same request are
//! alike but for the version (same data, same time).
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::{Arm, shadow::{Comparison, Judge}};
//!
//! let mut judge = Judge::new(0.05).unwrap();
//! let ms = Duration::from_millis;
//! // Two baseline instances differ in `ts` on every answer: learned as noise.
//! for i in 0..20u64 {
//!     let copy = Comparison::new(Arm::Gray, ["json /ts"], false);
//!     let control = Comparison::new(Arm::Baseline, ["json /ts"], false);
//!     judge.observe_pair(&copy, &control);
//!     judge.look(ms(100 * i));
//! }
//! assert!(judge.summary().noise.contains(&"json /ts".to_owned()));
//! assert!(judge.alarm().is_none());
//! // Gray also differs in `id`, which baseline never does: an alarm.
//! let mut t = 2_000;
//! while judge.alarm().is_none() {
//!     let copy = Comparison::new(Arm::Gray, ["json /ts", "json /id"], false);
//!     let control = Comparison::new(Arm::Baseline, ["json /ts"], false);
//!     judge.observe_pair(&copy, &control);
//!     judge.look(ms(t));
//!     t += 100;
//! }
//! assert_eq!(judge.alarm(), Some("mismatch"));
//! ```

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    evidence::Arm,
    sequential::{DEFAULT_MULTIPLIERS, InvalidTest, MixtureTest},
};

/// How many control comparisons a difference must be seen in to be noise, by default.
pub const DEFAULT_NOISE_MIN: u64 = 2;

/// How many controls are compared before the test starts, by default.
pub const DEFAULT_WARMUP: u64 = 50;

/// The most distinct differences the judge keeps counts of (the rest are not learned).
const MAX_KEYS: usize = 1024;

/// One comparison: a copy's or a control's answer against the user's.
#[derive(Debug, Clone)]
pub struct Comparison {
    arm: Arm,
    differences: Vec<String>,
    slower: bool,
}

impl Comparison {
    /// A comparison of `arm` (a copy: [`Arm::Gray`]; a control: [`Arm::Baseline`]) that
    /// found `differences` (keys: `status`, `header <name>`, `json <pointer>`, `body`),
    /// its answer `slower` than the user's by the judge's rule (see the module docs).
    pub fn new<I, S>(arm: Arm, differences: I, slower: bool) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Comparison {
            arm,
            differences: differences.into_iter().map(Into::into).collect(),
            slower,
        }
    }
}

/// Where a comparison's answer differed from the user's once the noise is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The differences outside the noise: empty when the answers match.
    pub differences: Vec<String>,
}

/// What a judge counted, cumulative: what a rollout's shadow phase consumes from every
/// gateway's report (the counts of the comparisons judged by the test, after the warm-up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ShadowCounts {
    /// Copies judged.
    pub copies: u64,
    /// Controls judged.
    pub controls: u64,
    /// Copies that mismatched outside the noise.
    pub copy_mismatches: u64,
    /// Controls that mismatched outside the noise.
    pub control_mismatches: u64,
    /// Copies slower than the user's answer.
    pub copy_slow: u64,
    /// Controls slower than the user's answer.
    pub control_slow: u64,
}

impl ShadowCounts {
    /// What `self` counts beyond `before` (saturating: counts from a store never panic).
    #[must_use]
    pub fn since(&self, before: &ShadowCounts) -> ShadowCounts {
        ShadowCounts {
            copies: self.copies.saturating_sub(before.copies),
            controls: self.controls.saturating_sub(before.controls),
            copy_mismatches: self.copy_mismatches.saturating_sub(before.copy_mismatches),
            control_mismatches: self
                .control_mismatches
                .saturating_sub(before.control_mismatches),
            copy_slow: self.copy_slow.saturating_sub(before.copy_slow),
            control_slow: self.control_slow.saturating_sub(before.control_slow),
        }
    }

    /// The larger of each count.
    #[must_use]
    pub fn max(&self, other: &ShadowCounts) -> ShadowCounts {
        ShadowCounts {
            copies: self.copies.max(other.copies),
            controls: self.controls.max(other.controls),
            copy_mismatches: self.copy_mismatches.max(other.copy_mismatches),
            control_mismatches: self.control_mismatches.max(other.control_mismatches),
            copy_slow: self.copy_slow.max(other.copy_slow),
            control_slow: self.control_slow.max(other.control_slow),
        }
    }

    /// The sum of each count (saturating).
    #[must_use]
    pub fn add(&self, other: &ShadowCounts) -> ShadowCounts {
        ShadowCounts {
            copies: self.copies.saturating_add(other.copies),
            controls: self.controls.saturating_add(other.controls),
            copy_mismatches: self.copy_mismatches.saturating_add(other.copy_mismatches),
            control_mismatches: self
                .control_mismatches
                .saturating_add(other.control_mismatches),
            copy_slow: self.copy_slow.saturating_add(other.copy_slow),
            control_slow: self.control_slow.saturating_add(other.control_slow),
        }
    }

    /// Feeds these counts, one batch, to the `mismatch` and `slow` tests at `now`, at the
    /// share of copies among its comparisons; returns whether either alarms.
    pub fn feed(&self, now: Duration, mismatch: &mut MixtureTest, slow: &mut MixtureTest) -> bool {
        let compared = self.copies.saturating_add(self.controls);
        if compared == 0 {
            return mismatch.alarm() || slow.alarm();
        }
        let w = self.copies as f64 / compared as f64;
        let a = mismatch.update(now, w, self.copy_mismatches, self.control_mismatches);
        let b = slow.update(now, w, self.copy_slow, self.control_slow);
        a || b
    }
}

/// What the judge has seen, for an API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeSummary {
    /// Copies judged by the test (after the warm-up).
    pub copies: u64,
    /// Controls judged by the test.
    pub controls: u64,
    /// Copies that mismatched outside the noise.
    pub copy_mismatches: u64,
    /// Controls that mismatched outside the noise.
    pub control_mismatches: u64,
    /// ln M of the mismatch stream.
    pub mismatch_log_m: f64,
    /// ln M of the slow stream.
    pub slow_log_m: f64,
    /// The alarm line both streams are held against: ln(2/alpha).
    pub alarm_at: f64,
    /// The stream that alarmed (`mismatch`, `slow`), if one did.
    pub alarm: Option<String>,
    /// The differences learned as noise.
    pub noise: Vec<String>,
}

/// The judge of a shadow; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Judge {
    mismatch: MixtureTest,
    slow: MixtureTest,
    noise_min: u64,
    warmup: u64,
    /// How many control comparisons saw each difference, up to the batch before.
    seen: BTreeMap<String, u64>,
    /// The current batch's control differences, learned at its look.
    learning: Vec<String>,
    batch: ShadowCounts,
    /// Controls compared during the warm-up.
    warm_controls: u64,
    /// What was fed to the test (the warm-up left out).
    fed: ShadowCounts,
    alarm: Option<&'static str>,
}

impl Judge {
    /// A judge that alarms falsely with a chance of at most `alpha` (in (0, 1)), split
    /// evenly over its two streams (each test alarms at `M ≥ 2/alpha`), learning a
    /// difference as noise once [`DEFAULT_NOISE_MIN`] controls showed it.
    pub fn new(alpha: f64) -> Result<Self, InvalidTest> {
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(InvalidTest::Alpha(alpha));
        }
        let test = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, alpha / 2.0)?;
        Ok(Judge {
            mismatch: test.clone(),
            slow: test,
            noise_min: DEFAULT_NOISE_MIN,
            warmup: DEFAULT_WARMUP,
            seen: BTreeMap::new(),
            learning: Vec::new(),
            batch: ShadowCounts::default(),
            warm_controls: 0,
            fed: ShadowCounts::default(),
            alarm: None,
        })
    }

    /// Learns a difference as noise once `controls` control comparisons showed it (at
    /// least 1).
    #[must_use]
    pub fn with_noise_min(mut self, controls: u64) -> Self {
        self.noise_min = controls.max(1);
        self
    }

    /// Starts the test once `controls` controls have been compared (default
    /// [`DEFAULT_WARMUP`]; 0: at once).
    #[must_use]
    pub fn with_warmup(mut self, controls: u64) -> Self {
        self.warmup = controls;
        self
    }

    /// Whether `key` is noise now.
    #[must_use]
    pub fn is_noise(&self, key: &str) -> bool {
        key != "status"
            && self
                .seen
                .get(&generalise(key))
                .is_some_and(|n| *n >= self.noise_min)
    }

    /// Judges `comparison`: its differences outside the noise; a control's differences
    /// are learned at the next look. A lone comparison (a copy without a control) is not
    /// counted by the test: [`observe_pair`](Self::observe_pair) is.
    pub fn observe(&mut self, comparison: &Comparison) -> Judged {
        let differences: Vec<String> = comparison
            .differences
            .iter()
            .filter(|d| !self.is_noise(d))
            .cloned()
            .collect();
        if comparison.arm == Arm::Baseline {
            self.learning
                .extend(comparison.differences.iter().map(|d| generalise(d)));
        }
        Judged { differences }
    }

    /// Judges a request's `copy` and its `control` as [`observe`](Self::observe) does each,
    /// and adds the pair to the current batch: the test counts pairs only (see the module
    /// docs, *Unit of analysis*). Returns the copy's and the control's differences outside
    /// the noise.
    pub fn observe_pair(&mut self, copy: &Comparison, control: &Comparison) -> [Judged; 2] {
        let judged = [self.observe(copy), self.observe(control)];
        let b = &mut self.batch;
        b.copies += 1;
        b.controls += 1;
        b.copy_mismatches += u64::from(!judged[0].differences.is_empty());
        b.control_mismatches += u64::from(!judged[1].differences.is_empty());
        b.copy_slow += u64::from(copy.slower);
        b.control_slow += u64::from(control.slower);
        judged
    }

    /// Ends the batch at `now`: its bad events go to the streams' tests at the share of
    /// copies among its comparisons, then what its controls showed is learned. Returns the
    /// stream that alarmed, if one has.
    pub fn look(&mut self, now: Duration) -> Option<&'static str> {
        let batch = std::mem::take(&mut self.batch);
        // Decided before the batch: whether the controls compared before it met the warm-up.
        if self.warm_controls < self.warmup {
            self.warm_controls = self.warm_controls.saturating_add(batch.controls);
        } else if batch.copies + batch.controls > 0 {
            batch.feed(now, &mut self.mismatch, &mut self.slow);
            self.fed = self.fed.add(&batch);
            if self.alarm.is_none() {
                self.alarm = if self.mismatch.alarm() {
                    Some("mismatch")
                } else if self.slow.alarm() {
                    Some("slow")
                } else {
                    None
                };
            }
        }
        for key in std::mem::take(&mut self.learning) {
            if self.seen.len() < MAX_KEYS || self.seen.contains_key(&key) {
                *self.seen.entry(key).or_default() += 1;
            }
        }
        self.alarm
    }

    /// What the judge counted of the comparisons it fed its test, cumulative (for a
    /// rollout's shadow phase, [`Report::with_shadow`](crate::Report::with_shadow)).
    #[must_use]
    pub fn counts(&self) -> ShadowCounts {
        self.fed
    }

    /// The stream that alarmed (`mismatch`, `slow`), if one has: it stays alarmed.
    #[must_use]
    pub fn alarm(&self) -> Option<&'static str> {
        self.alarm
    }

    /// What the judge has seen, up to the last look.
    #[must_use]
    pub fn summary(&self) -> JudgeSummary {
        JudgeSummary {
            copies: self.fed.copies,
            controls: self.fed.controls,
            copy_mismatches: self.fed.copy_mismatches,
            control_mismatches: self.fed.control_mismatches,
            mismatch_log_m: self.mismatch.log_m(),
            slow_log_m: self.slow.log_m(),
            alarm_at: self.mismatch.log_threshold(),
            alarm: self.alarm.map(str::to_owned),
            noise: self
                .seen
                .iter()
                .filter(|(k, n)| **n >= self.noise_min && k.as_str() != "status")
                .map(|(k, _)| k.clone())
                .collect(),
        }
    }
}

/// `key` with its JSON pointer's array indices as `*`: `json /items/3/ts` →
/// `json /items/*/ts`.
fn generalise(key: &str) -> String {
    let Some(pointer) = key.strip_prefix("json ") else {
        return key.to_owned();
    };
    let mut out = String::from("json ");
    for (i, token) in pointer.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
            out.push('*');
        } else {
            out.push_str(token);
        }
    }
    out
}
