//! A rollout's state, its transitions and their reasons: values the caller logs, counts,
//! keeps and persists.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::OutageEvidence;
use crate::evidence::{Counters, EpochSpec, Pair, PerStream, Stream, Thresholds};
use crate::kill::KillEvidence;
use crate::sequential::{MixtureTest, StreamSummary};

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Phase {
    /// Configured, not started: weight 0.
    Pending,
    /// Copies only, judged against baseline (weight 0: no user is answered by gray),
    /// before the first step ([`ShadowPhase`](super::ShadowPhase)).
    Shadow,
    /// At a step, holding it until it may advance.
    Step,
    /// Holding its weight until resumed ([`PauseReason`] says why).
    Paused,
    /// At 100 %: done.
    Promoted,
    /// At 0 %, after an alarm, the kill switch or an abort.
    RolledBack,
}

impl Phase {
    /// `pending`, `shadow`, `step`, `paused`, `promoted` or `rolled_back`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Shadow => "shadow",
            Phase::Step => "step",
            Phase::Paused => "paused",
            Phase::Promoted => "promoted",
            Phase::RolledBack => "rolled_back",
        }
    }

    /// Whether the rollout is under way (`shadow`, `step` or `paused`): a test can roll it
    /// back.
    #[must_use]
    pub fn is_active(self) -> bool {
        matches!(self, Phase::Shadow | Phase::Step | Phase::Paused)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a rollout is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum PauseReason {
    /// Someone paused it; only a resume continues.
    Manual,
    /// The next step is gated; a resume enters it.
    Gate {
        /// The index of the gated step.
        step: usize,
    },
    /// No evidence arrived for `stale_ms`; it continues by itself when evidence does.
    Stale,
    /// Gray served no request for `stale_ms`; it continues by itself when gray does.
    NoData,
    /// Both arms are failing together (a shared outage); it continues by itself, with the
    /// step started again, when baseline's errors are back to normal.
    Outage,
}

impl PauseReason {
    /// Whether the pause lifts by itself when the data comes back.
    #[must_use]
    pub fn is_automatic(self) -> bool {
        matches!(
            self,
            PauseReason::Stale | PauseReason::NoData | PauseReason::Outage
        )
    }
}

/// A period with a constant gray share.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Epoch {
    /// Its number, increasing over the rollout's life (across restarts of the rollout).
    pub index: u64,
    /// Gray's share, in percent.
    pub weight: f64,
    /// When it started (`started_ms`).
    #[serde(rename = "started_ms", with = "crate::millis")]
    pub started: Duration,
    /// The latency thresholds, frozen once set.
    pub thresholds: Option<Thresholds>,
}

/// The evidence of a rollout: one test per stream and the counts behind them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Evidence {
    /// The sequential test of each stream.
    pub streams: PerStream<MixtureTest>,
    /// Requests per arm since the rollout started.
    pub requests: Pair,
    /// Failed requests per arm since the rollout started.
    pub errors: Pair,
    /// The current epoch's counts, summed over every source.
    pub epoch: Counters,
    /// The errors test's power on the current step's evidence against the configured
    /// degradation ([`Detect`](super::Detect)), as of the last report; `None` at 0 or 100 %.
    #[serde(default)]
    pub step_power: Option<f64>,
}

impl Evidence {
    /// What the admin API and a transition show.
    #[must_use]
    pub fn summary(&self) -> EvidenceSummary {
        EvidenceSummary {
            streams: PerStream::from_fn(|s| self.streams.get(s).summary()),
            requests: self.requests,
            errors: self.errors,
            step_users: self.epoch.gray_users,
            step_power: self.step_power,
        }
    }
}

/// A readable digest of the [`Evidence`], kept with each transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EvidenceSummary {
    /// ln M, its alarm level and the bad-user counts, per stream.
    pub streams: PerStream<StreamSummary>,
    /// Requests per arm since the rollout started.
    pub requests: Pair,
    /// Failed requests per arm since the rollout started.
    pub errors: Pair,
    /// Distinct users seen in gray in the current step.
    pub step_users: u64,
    /// The errors test's power on the current step's evidence
    /// ([`Evidence::step_power`]).
    #[serde(default)]
    pub step_power: Option<f64>,
}

/// Why a transition happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
#[non_exhaustive]
pub enum Reason {
    /// A manual start.
    Start,
    /// The hold was met with no alarm.
    Advance {
        /// How long the step lasted, in milliseconds.
        held_ms: u64,
        /// Distinct gray users seen in the step.
        users: u64,
        /// The errors test's power on the step's evidence
        /// ([`Detect`](super::Detect)), when steps wait for it.
        #[serde(default)]
        power: Option<f64>,
    },
    /// The hold was met, and the next step is gated.
    Gate {
        /// The percentage that waits for a resume.
        next_weight: f64,
    },
    /// No evidence for `stale_ms`.
    Stale {
        /// When the last evidence arrived, if ever.
        last_evidence_ms: Option<u64>,
    },
    /// No gray request for `stale_ms`.
    NoData {
        /// When the last gray request was counted, if ever.
        last_gray_request_ms: Option<u64>,
    },
    /// Evidence (and gray traffic) came back after an automatic pause.
    Fresh,
    /// Both arms failed together over the recent window: paused, the hold not counted.
    Outage(OutageEvidence),
    /// Baseline's errors are back to normal after a shared outage: the step starts again.
    Recovered(OutageEvidence),
    /// A manual pause.
    Pause,
    /// A manual resume.
    Resume,
    /// A stream's test alarmed: gray is worse than the tolerance allows.
    Alarm {
        /// The stream.
        stream: Stream,
        /// ln M when it alarmed.
        log_m: f64,
        /// ln(1/α) of the stream.
        alarm_at: f64,
        /// Bad users counted in gray.
        gray: u64,
        /// Bad users counted in baseline.
        baseline: u64,
        /// The ratio the evidence favours most.
        leading_ratio: Option<f64>,
    },
    /// The kill switch tripped.
    KillSwitch(KillEvidence),
    /// In the shadow phase, a stream of the judge alarmed: gray answers differently from
    /// baseline (or slower) beyond the noise two baseline instances show.
    ShadowAlarm {
        /// `mismatch` or `slow`.
        stream: String,
        /// ln M when it alarmed.
        log_m: f64,
        /// ln(2/α).
        alarm_at: f64,
        /// What was judged.
        counts: crate::shadow::ShadowCounts,
    },
    /// The shadow phase's hold was met with no alarm: the first step.
    ShadowPassed {
        /// How long the shadow phase lasted, in milliseconds.
        held_ms: u64,
        /// What was judged.
        counts: crate::shadow::ShadowCounts,
    },
    /// The last step's hold was met: at 100 %.
    Complete,
    /// A manual promotion.
    Promote,
    /// A manual abort.
    Abort,
}

impl Reason {
    /// A short name for logs and metric labels: `start`, `advance`, `gate`, `stale`,
    /// `no_data`, `fresh`, `outage`, `recovered`, `pause`, `resume`, `alarm`,
    /// `kill_switch`, `shadow_alarm`, `shadow_passed`, `complete`, `promote`, `abort`.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Advance { .. } => "advance",
            Reason::Gate { .. } => "gate",
            Reason::Stale { .. } => "stale",
            Reason::NoData { .. } => "no_data",
            Reason::Fresh => "fresh",
            Reason::Outage(_) => "outage",
            Reason::Recovered(_) => "recovered",
            Reason::Pause => "pause",
            Reason::Resume => "resume",
            Reason::Alarm { .. } => "alarm",
            Reason::KillSwitch(_) => "kill_switch",
            Reason::ShadowAlarm { .. } => "shadow_alarm",
            Reason::ShadowPassed { .. } => "shadow_passed",
            Reason::Complete => "complete",
            Reason::Promote => "promote",
            Reason::Abort => "abort",
        }
    }
}

/// One change of phase or weight, with what caused it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Transition {
    /// When (`at_ms`).
    #[serde(rename = "at_ms", with = "crate::millis")]
    pub at: Duration,
    /// The phase before.
    pub from: Phase,
    /// The phase after.
    pub to: Phase,
    /// Gray's percentage before.
    pub from_weight: f64,
    /// Gray's percentage after: what the rule's `percent` must be now.
    pub weight: f64,
    /// The step index after.
    pub step: Option<usize>,
    /// The epoch after.
    pub epoch: u64,
    /// Why.
    pub reason: Reason,
    /// The evidence at that moment.
    pub evidence: EvidenceSummary,
}

/// What the leader has consumed of each source's cumulative counts, for the current
/// epoch and the one before: the next report from a source counts only beyond this.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Consumed {
    /// Per source, in the current epoch.
    pub current: BTreeMap<u64, Counters>,
    /// Per source, in the previous epoch.
    pub previous: BTreeMap<u64, Counters>,
}

/// Everything a rollout is, serialisable: persist it (a local file, etcd) and
/// [`Rollout::restore`](super::Rollout::restore) it to resume the same step with the
/// same evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct State {
    /// The phase.
    pub phase: Phase,
    /// Why it is paused, when it is.
    pub pause: Option<PauseReason>,
    /// Gray's percentage now: what the rule's `percent` must be.
    pub weight: f64,
    /// The index of the current (or last) step; `None` before the first start.
    pub step: Option<usize>,
    /// The run: the epoch at which the rollout last started (users count once per run).
    pub run: u64,
    /// The current epoch.
    pub epoch: Epoch,
    /// The epoch before, whose late counts still arrive.
    pub previous_epoch: Option<Epoch>,
    /// The tests and the counts behind them.
    pub evidence: Evidence,
    /// What was consumed of each source's counts.
    pub consumed: Consumed,
    /// The distinct users over every source, and what was consumed of each source's user
    /// log ([`users`](super::users)). Absent in a state saved before it existed: empty.
    #[serde(default)]
    pub users: super::Users,
    /// When evidence last arrived (`last_evidence_ms`).
    #[serde(rename = "last_evidence_ms", with = "crate::millis::opt")]
    pub last_evidence: Option<Duration>,
    /// When gray last served a request, as far as the evidence says
    /// (`last_gray_request_ms`).
    #[serde(rename = "last_gray_request_ms", with = "crate::millis::opt")]
    pub last_gray_request: Option<Duration>,
    /// The last transition.
    pub last_transition: Option<Transition>,
    /// How many transitions happened.
    pub transitions: u64,
    /// The evidence of the shadow phase (of the last run that had one). Absent in a state
    /// saved before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowEvidence>,
}

/// The evidence of a shadow phase: the judge's two tests over every gateway's counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ShadowEvidence {
    /// Mismatches of the copies against the controls'.
    pub mismatch: MixtureTest,
    /// Slow answers of the copies against the controls'.
    pub slow: MixtureTest,
    /// What was judged, over every source.
    pub counts: crate::shadow::ShadowCounts,
    /// What was consumed of each source's counts.
    pub consumed: BTreeMap<u64, crate::shadow::ShadowCounts>,
}

impl ShadowEvidence {
    /// Fresh evidence with the tests `mismatch` and `slow`, begun at `now`.
    pub(crate) fn new(mut mismatch: MixtureTest, mut slow: MixtureTest, now: Duration) -> Self {
        mismatch.begin(now);
        slow.begin(now);
        ShadowEvidence {
            mismatch,
            slow,
            counts: crate::shadow::ShadowCounts::default(),
            consumed: BTreeMap::new(),
        }
    }
}

impl State {
    /// What every recorder must follow ([`Recorder::follow`](crate::evidence::Recorder::follow)).
    #[must_use]
    pub fn epoch_spec(&self) -> EpochSpec {
        EpochSpec::new(self.epoch.index)
            .with_run(self.run)
            .with_thresholds(self.epoch.thresholds)
    }
}
