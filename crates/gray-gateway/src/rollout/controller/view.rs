//! What the admin API and the metrics show of a rollout: its [`View`], with the shadow
//! phase's evidence ([`ShadowView`]), a configuration that does not fit the stored state
//! ([`Skew`]) and the looks that did not complete ([`LookFailures`]).

use std::collections::{BTreeMap, VecDeque};

use gray_rollout::{Phase, Transition, machine::EvidenceSummary};
use serde::Serialize;

/// What the admin API and the metrics show of a rollout.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct View {
    pub(crate) service: String,
    pub(crate) rule: String,
    pub(crate) phase: Phase,
    pub(crate) pause_reason: Option<gray_rollout::machine::PauseReason>,
    pub(crate) weight: f64,
    pub(crate) step: Option<usize>,
    pub(crate) steps: Vec<f64>,
    /// The percentage the rules' source gives the rule (the rollout's weight wins while
    /// the rollout exists).
    pub(crate) source_percent: Option<f64>,
    pub(crate) evidence: Option<EvidenceSummary>,
    pub(crate) last_transition: Option<Transition>,
    pub(crate) transitions: VecDeque<Transition>,
    #[serde(skip)]
    pub(crate) counts: BTreeMap<(&'static str, &'static str, &'static str), u64>,
    /// The store's version of the state (`None`: never saved).
    pub(crate) version: Option<u64>,
    /// Whether this gateway is cut off from the store for longer than
    /// `partition_hold_ms`: it puts 0 on the rule of a rollout in progress (`weight` is
    /// the percentage in force; a final weight is held).
    pub(crate) cut_off: bool,
    /// Whether this gateway leads the rollout: it alone observes and advances.
    pub(crate) leader: bool,
    /// Looks that did not complete since the gateway started: `panic` (caught, logged at
    /// ERROR; the state is read again from the store) and `timeout` (a look that took
    /// longer than the look bound, cancelled).
    pub(crate) look_failures: LookFailures,
    /// Whether a transition is in force on this gateway that the store has not accepted
    /// yet: a rollback whose save failed (only a move toward weight 0 is put in force
    /// unsaved; it is saved again at each look until the store takes it).
    pub(crate) unsaved: bool,
    /// The stored state this gateway's configuration of the rollout does not fit, if it
    /// does not (`null` when it fits): see [`Skew`].
    pub(crate) config_skew: Option<Skew>,
    /// The shadow phase's evidence (of the last run that had one): the judge's two tests
    /// over every gateway's copies.
    pub(crate) shadow: Option<ShadowView>,
}

/// What `/rollouts/{service}` shows of a shadow phase.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShadowView {
    /// What was judged over every gateway (copies, controls, their mismatches and slow
    /// answers).
    pub(crate) counts: gray_rollout::shadow::ShadowCounts,
    /// ln M of the mismatch stream and of the slow stream, against their alarm line.
    pub(crate) mismatch_log_m: f64,
    pub(crate) slow_log_m: f64,
    pub(crate) alarm_at: f64,
    /// This gateway's mirror: its latest mismatches and the noise its judge learned.
    pub(crate) recent_mismatches: Vec<crate::mirror::Mismatch>,
    pub(crate) noise: Vec<String>,
}

/// A stored state that this gateway's configuration of the rollout does not fit (a
/// configuration change rolling through the fleet: other steps, another `alpha`). The
/// gateway then puts the stored weight in force (the safe weight: the one the fleet's
/// leader decided, so that a user is in the same lane through every gateway; 0 once cut
/// off, as for any rollout in progress), records evidence for the leader, does not lead,
/// and takes only an abort, until a state it fits is stored.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Skew {
    /// The stored state's version.
    pub(crate) version: u64,
    /// What does not fit, with the field of the state and both values.
    pub(crate) reason: String,
    /// This gateway's configuration of the rollout, in short.
    pub(crate) config: String,
    /// The stored state's phase and weight (the weight in force here).
    pub(crate) stored_phase: Phase,
    pub(crate) stored_weight: f64,
}

/// How many looks did not complete, by why.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct LookFailures {
    /// A look that panicked.
    pub(crate) panic: u64,
    /// A look cancelled after the look bound.
    pub(crate) timeout: u64,
}
