//! The anytime-valid sequential test of gray against baseline, for one stream of bad
//! events.
//!
//! Given that a bad event happened while gray had the share `w` of the users, the chance
//! that it came from gray is
//!
//! ```text
//! q(r) = w·r / (w·r + 1 − w)
//! ```
//!
//! where `r` is gray's bad-event rate ÷ baseline's (per user). Whatever the load, and
//! whatever a shared dependency does to both arms alike, only `r` moves `q`. The null
//! hypothesis is *gray ≤ r0 × baseline* (`r ≤ r0`, `r0` the tolerated degradation).
//!
//! **Over ratios.** Against it, a mixture over a grid of ratios `r_k = r0 × m_k` (the
//! multipliers, by default [`DEFAULT_MULTIPLIERS`] = 1.5, 2, 3, 5, 10, 20, 50, 100): for
//! every batch of `c` gray and `b` baseline bad events seen at share `w`,
//!
//! ```text
//! ℓ_k += c·ln(q(r_k)/q(r0)) + b·ln((1 − q(r_k))/(1 − q(r0)))
//!      = c·ln(r_k/r0) + (c + b)·[ln(1 + w(r0 − 1)) − ln(1 + w(r_k − 1))]
//! M    = (1/K)·Σ_k exp(ℓ_k)
//! ```
//!
//! computed in log space (log-sum-exp). This is the statistic of the design.
//!
//! **Over onsets.** A gray that is healthy for a while and then goes bad would find that
//! mixture slow: every healthy minute lowers `ℓ_k` for the large ratios (a baseline bad
//! event counts against them), and that debt must be paid back before `M` can rise (in
//! the simulations, a fault 10 minutes into a step took a median of 41 s to detect
//! instead of 12 s, one hour in 81 s). So the test is also a mixture over *when* the
//! change began: a fresh ratio mixture `M_j` opens every `onset_every` (60 s) since the
//! test began, with prior weight `π_j = 1/((j+1)(j+2))` (summing to 1), and
//!
//! ```text
//! M = Σ_j π_j·M_j  +  (the prior weight of onsets not open yet)
//! ```
//!
//! A change that began around minute `j` is judged by `M_j`, which carries no debt, at
//! the cost of `ln(1/π_j)` (1.8 nats after a minute, 4.9 after ten, 8.2 after an hour,
//! against the debt's 15 and 90). The last `max_onsets` (16) stay open; an older one is
//! closed by keeping its current value `π_j·M_j` as it is. With `onset_every` zero,
//! there is one onset, at the start, with weight 1: the design's mixture alone.
//!
//! The test alarms once `M ≥ 1/α`.
//!
//! **Guarantee.** Under the null, each event's factor `exp(Δℓ_k)` has a conditional
//! expectation of at most 1 given the past (it is linear in the true `q ≤ q(r0)` and
//! equals 1 at `q(r0)`), so every `exp(ℓ_k)` is a nonnegative supermartingale from 1.
//! Opening an onset moves prior weight from "not open yet" (worth its weight) to `M_j`
//! (worth its weight, `M_j` starting at 1); closing one freezes its value: neither
//! changes `M`, and the times at which they happen are fixed in advance. So `M` is a
//! nonnegative supermartingale starting at 1, and Ville's inequality bounds
//! `P(M ever reaches 1/α) ≤ α`: the test may be looked at after every event, every second
//! or whenever, for as long as one likes. `w` may change between batches (each batch
//! uses the share it was observed under); a batch at `w` of 0 or 1 carries no evidence.
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::sequential::{DEFAULT_MULTIPLIERS, MixtureTest};
//!
//! let s = Duration::from_secs;
//! let mut test = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01).unwrap();
//! test.begin(s(0));
//! // 5 % of the users in gray, and 1 of 20 bad users there: as expected
//! test.update(s(30), 0.05, 1, 19);
//! assert!(!test.alarm());
//! // then 12 of the next 18: gray is far worse
//! test.update(s(40), 0.05, 12, 6);
//! assert!(test.alarm());
//! assert!(test.log_m() >= test.log_threshold()); // ln(1/α) = 4.6
//! assert_eq!(test.summary().leading_ratio, Some(10.0));
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::millis::as_ms;

/// The default grid of ratio multipliers.
pub const DEFAULT_MULTIPLIERS: [f64; 8] = [1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0];

/// The default time between two onsets.
pub const DEFAULT_ONSET_EVERY: Duration = Duration::from_secs(60);

/// The default number of onsets kept open.
pub const DEFAULT_MAX_ONSETS: usize = 16;

/// The mixture test of one stream; see the [module docs](self).
///
/// Serialisable, so that a restart resumes with the same evidence: its parameters, its
/// open onsets (`index`, `log_weight`, ℓ_k as `log_likelihoods`), `log_closed` (the log
/// of the closed onsets' frozen value), `gray` and `baseline` (bad events counted), plus
/// `log_m` and `alarm_at` (ln M and ln(1/α)) for people to read, recomputed when read
/// back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "repr::TestRepr", try_from = "repr::TestRepr")]
pub struct MixtureTest {
    r0: f64,
    ratios: Vec<f64>,
    alpha: f64,
    onset_every: Duration,
    max_onsets: usize,
    began: Option<Duration>,
    opened: u64,
    log_closed: Option<f64>,
    onsets: Vec<Onset>,
    gray: u64,
    baseline: u64,
}

/// The ratio mixture started at onset `index`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Onset {
    index: u64,
    log_weight: f64,
    log_likelihoods: Vec<f64>,
}

/// Why a [`MixtureTest`] cannot be built.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum InvalidTest {
    /// `r0` is not a positive finite number.
    Tolerance(f64),
    /// The grid has no multiplier.
    NoMultipliers,
    /// A multiplier is not a finite number above 1.
    Multiplier(f64),
    /// α is not in (0, 1).
    Alpha(f64),
    /// No onset may stay open.
    MaxOnsets,
}

impl std::fmt::Display for InvalidTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidTest::Tolerance(r0) => {
                write!(f, "the tolerated ratio must be a positive number, not {r0}")
            }
            InvalidTest::NoMultipliers => f.write_str("the grid of ratios is empty"),
            InvalidTest::Multiplier(m) => {
                write!(f, "a ratio multiplier must be a number above 1, not {m}")
            }
            InvalidTest::Alpha(a) => write!(f, "alpha must be in (0, 1), not {a}"),
            InvalidTest::MaxOnsets => f.write_str("at least one onset must stay open"),
        }
    }
}

impl std::error::Error for InvalidTest {}

/// What the admin API shows of a stream's test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StreamSummary {
    /// ln M, the log of the evidence against "gray ≤ r0 × baseline".
    pub log_m: f64,
    /// ln(1/α): the test alarms when `log_m` reaches it.
    pub alarm_at: f64,
    /// Whether it did.
    pub alarm: bool,
    /// Bad events (users) counted in gray since the test began.
    pub gray: u64,
    /// Bad events (users) counted in baseline since the test began.
    pub baseline: u64,
    /// The grid ratio the evidence favours most, if any is favoured over `r0`.
    pub leading_ratio: Option<f64>,
    /// When the onset the evidence favours most opened, in milliseconds since the test
    /// began, with `leading_ratio`.
    pub leading_onset_ms: Option<u64>,
}

fn log_sum_exp(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = values.clone().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + values.map(|v| (v - max).exp()).sum::<f64>().ln()
}

/// The prior weight of the onsets `from..to`: Σ 1/((j+1)(j+2)) = 1/(from+1) − 1/(to+1).
fn prior(from: u64, to: u64) -> f64 {
    1.0 / (from as f64 + 1.0) - 1.0 / (to as f64 + 1.0)
}

// === impl MixtureTest ===

impl MixtureTest {
    /// A test of "gray ≤ `r0` × baseline" over the ratios `r0 × multipliers`, alarming at
    /// `M ≥ 1/alpha`, with an onset every [`DEFAULT_ONSET_EVERY`], the last
    /// [`DEFAULT_MAX_ONSETS`] open.
    pub fn new(r0: f64, multipliers: &[f64], alpha: f64) -> Result<Self, InvalidTest> {
        if !(r0.is_finite() && r0 > 0.0) {
            return Err(InvalidTest::Tolerance(r0));
        }
        if multipliers.is_empty() {
            return Err(InvalidTest::NoMultipliers);
        }
        if let Some(m) = multipliers.iter().find(|m| !(m.is_finite() && **m > 1.0)) {
            return Err(InvalidTest::Multiplier(*m));
        }
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(InvalidTest::Alpha(alpha));
        }
        Ok(MixtureTest {
            r0,
            ratios: multipliers.iter().map(|m| r0 * m).collect(),
            alpha,
            onset_every: DEFAULT_ONSET_EVERY,
            max_onsets: DEFAULT_MAX_ONSETS,
            began: None,
            opened: 0,
            log_closed: None,
            onsets: Vec::new(),
            gray: 0,
            baseline: 0,
        })
    }

    /// With an onset every `every` (zero: one onset, at the start, with weight 1), and at
    /// most `max` of them open (at least 1).
    pub fn with_onsets(mut self, every: Duration, max: usize) -> Result<Self, InvalidTest> {
        if max == 0 {
            return Err(InvalidTest::MaxOnsets);
        }
        self.onset_every = every;
        self.max_onsets = max;
        Ok(self)
    }

    /// Starts the test at `now` with no evidence (the first [`update`](Self::update)
    /// does it when this was not called).
    pub fn begin(&mut self, now: Duration) {
        self.began = Some(now);
        self.opened = 0;
        self.log_closed = None;
        self.onsets.clear();
        self.gray = 0;
        self.baseline = 0;
        self.open_until(now);
    }

    /// Opens the onsets due by `now`; several due at once open as one.
    fn open_until(&mut self, now: Duration) {
        let Some(began) = self.began else {
            return self.begin(now);
        };
        let due = if self.onset_every.is_zero() {
            1
        } else {
            let elapsed = now.saturating_sub(began).as_nanos();
            (elapsed / self.onset_every.as_nanos()) as u64 + 1
        };
        if due <= self.opened {
            return;
        }
        let weight = if self.onset_every.is_zero() {
            1.0
        } else {
            prior(self.opened, due)
        };
        self.onsets.push(Onset {
            index: due - 1,
            log_weight: weight.ln(),
            log_likelihoods: vec![0.0; self.ratios.len()],
        });
        self.opened = due;
        while self.onsets.len() > self.max_onsets {
            let closed = self.onsets.remove(0);
            let value = closed.log_weight + log_sum_exp(closed.log_likelihoods.iter().copied())
                - (self.ratios.len() as f64).ln();
            self.log_closed = Some(match self.log_closed {
                Some(l) => log_sum_exp([l, value].into_iter()),
                None => value,
            });
        }
    }

    /// Adds `gray` and `baseline` bad events seen by `now` while gray had the share `w`
    /// (in `[0, 1]`). Returns whether the test alarms now.
    pub fn update(&mut self, now: Duration, w: f64, gray: u64, baseline: u64) -> bool {
        self.open_until(now);
        // counts come from reports read back from a store: saturating, never a panic
        let all = gray.saturating_add(baseline);
        if !(w > 0.0 && w < 1.0) || all == 0 {
            return self.alarm();
        }
        self.gray = self.gray.saturating_add(gray);
        self.baseline = self.baseline.saturating_add(baseline);
        let (c, n) = (gray as f64, all as f64);
        let base = (w * (self.r0 - 1.0)).ln_1p();
        let deltas: Vec<f64> = self
            .ratios
            .iter()
            .map(|r| c.mul_add((r / self.r0).ln(), n * (base - (w * (r - 1.0)).ln_1p())))
            .collect();
        for onset in &mut self.onsets {
            for (l, d) in onset.log_likelihoods.iter_mut().zip(&deltas) {
                *l += d;
            }
        }
        self.alarm()
    }

    /// ln M (0 before any event).
    #[must_use]
    pub fn log_m(&self) -> f64 {
        let k = (self.ratios.len() as f64).ln();
        let open = self
            .onsets
            .iter()
            .flat_map(|o| o.log_likelihoods.iter().map(move |l| o.log_weight + l - k));
        let unopened = match self.began {
            None => 0.0, // all the prior weight, worth 1
            Some(_) if self.onset_every.is_zero() => f64::NEG_INFINITY,
            Some(_) => (1.0 / (self.opened as f64 + 1.0)).ln(),
        };
        log_sum_exp(open.chain(self.log_closed).chain([unopened]))
    }

    /// ln(1/α).
    #[must_use]
    pub fn log_threshold(&self) -> f64 {
        -self.alpha.ln()
    }

    /// Whether `M ≥ 1/α`.
    pub fn alarm(&self) -> bool {
        // cheap bound first: M ≤ (number of terms) × its largest term
        let k = (self.ratios.len() as f64).ln();
        let largest = self
            .onsets
            .iter()
            .flat_map(|o| o.log_likelihoods.iter().map(move |l| o.log_weight + l - k))
            .chain(self.log_closed)
            .fold(0.0f64, f64::max);
        let terms = (self.onsets.len() * self.ratios.len() + 2) as f64;
        if largest + terms.ln() < self.log_threshold() {
            return false;
        }
        self.log_m() >= self.log_threshold()
    }

    /// The tolerated ratio `r0`.
    #[must_use]
    pub fn tolerance(&self) -> f64 {
        self.r0
    }

    /// The grid of ratios `r_k`.
    #[must_use]
    pub fn ratios(&self) -> &[f64] {
        &self.ratios
    }

    /// α of this test.
    #[must_use]
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Bad events counted so far, gray and baseline.
    #[must_use]
    pub fn counts(&self) -> (u64, u64) {
        (self.gray, self.baseline)
    }

    /// Whether `other` tests the same hypothesis with the same grid, onsets and α (its
    /// evidence may differ): a restored state must match its configuration.
    #[must_use]
    pub fn same_test(&self, other: &MixtureTest) -> bool {
        self.r0 == other.r0
            && self.ratios == other.ratios
            && self.alpha == other.alpha
            && self.onset_every == other.onset_every
            && self.max_onsets == other.max_onsets
    }

    /// What the admin API shows.
    #[must_use]
    pub fn summary(&self) -> StreamSummary {
        let leading = self
            .onsets
            .iter()
            .flat_map(|o| {
                o.log_likelihoods
                    .iter()
                    .zip(&self.ratios)
                    .map(move |(l, r)| (o.log_weight + l, *l, *r, o.index))
            })
            .filter(|(_, l, _, _)| *l > 0.0)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        StreamSummary {
            log_m: self.log_m(),
            alarm_at: self.log_threshold(),
            alarm: self.alarm(),
            gray: self.gray,
            baseline: self.baseline,
            leading_ratio: leading.map(|(_, _, r, _)| r),
            leading_onset_ms: leading.map(|(_, _, _, j)| as_ms(self.onset_every).saturating_mul(j)),
        }
    }
}

mod power;
mod repr;

#[cfg(test)]
mod tests;
