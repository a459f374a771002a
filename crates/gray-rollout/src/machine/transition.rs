//! Every change of phase or weight goes through [`Rollout::transition`]: the
//! [`Transition`] with its reason and evidence, and a new epoch when the weight changes.

use std::time::Duration;

use super::{Epoch, PauseReason, Phase, Reason, Rollout, Transition};
use crate::evidence::{Counters, Thresholds};

// === impl Rollout ===

impl Rollout {
    /// Enters step `index` (promoted when it is 100 %).
    pub(super) fn enter(&mut self, now: Duration, index: usize, reason: Reason) -> Transition {
        let weight = self.config.steps[index.min(self.config.steps.len() - 1)];
        let to = if weight >= 100.0 {
            Phase::Promoted
        } else {
            Phase::Step
        };
        self.transition(now, to, None, Some(index), weight, reason)
    }

    pub(super) fn roll_back(&mut self, now: Duration, reason: Reason) -> Transition {
        let step = self.state.step;
        self.transition(now, Phase::RolledBack, None, step, 0.0, reason)
    }

    pub(super) fn transition(
        &mut self,
        now: Duration,
        to: Phase,
        pause: Option<PauseReason>,
        step: Option<usize>,
        weight: f64,
        reason: Reason,
    ) -> Transition {
        let (from, from_weight) = (self.state.phase, self.state.weight);
        // the evidence that led here: the step's counts, before a new epoch clears them
        let evidence = self.state.evidence.summary();
        if weight != self.state.epoch.weight {
            self.new_epoch(now, weight);
        }
        let state = &mut self.state;
        state.phase = to;
        state.pause = pause;
        state.step = step;
        state.weight = weight;
        let transition = Transition {
            at: now,
            from,
            to,
            from_weight,
            weight,
            step,
            epoch: state.epoch.index,
            reason,
            evidence,
        };
        state.last_transition = Some(transition.clone());
        state.transitions = state.transitions.saturating_add(1);
        transition
    }

    /// A new epoch at `weight`: thresholds from the ending epoch's baseline latencies
    /// (or the ending epoch's own thresholds when it saw too few), counts from zero.
    pub(super) fn new_epoch(&mut self, now: Duration, weight: f64) {
        let latencies = self.baseline_latencies();
        let state = &mut self.state;
        let thresholds = Thresholds::from_latencies(&latencies, self.config.min_latency_samples)
            .or(state.epoch.thresholds);
        let next = Epoch {
            index: state.epoch.index.saturating_add(1),
            weight,
            started: now,
            thresholds,
        };
        state.previous_epoch = Some(std::mem::replace(&mut state.epoch, next));
        state.consumed.previous = std::mem::take(&mut state.consumed.current);
        let previous = &state.consumed.previous;
        state
            .users
            .new_epoch(|source| previous.contains_key(&source));
        state.evidence.epoch = Counters::default();
        state.evidence.step_power = None;
        self.latencies.clear();
    }
}
