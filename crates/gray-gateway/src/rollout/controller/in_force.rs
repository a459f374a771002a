//! What a state puts in force on this gateway: the weight on the rule (decided by
//! [`weight_in_force`] alone), the recorder following the state's epoch, the upgraded
//! connections a rollback closes, the mirror on in the shadow phase only, and the view;
//! and everything else a transition does but the save ([`Controller::transitioned`]).

use std::sync::{Arc, atomic::Ordering};

use gray_rollout::{Phase, Rollout, State, Transition};

use super::{Controller, ShadowView};
use crate::rollout::Population;

// === impl Controller ===

impl Controller {
    /// Puts `state`'s weight on the rule (but for a rollout never started), records
    /// evidence while it is active, and has the recorder follow its epoch.
    pub(super) fn put_in_force(&self, state: &State) {
        let cut_off = self.cut_off.load(Ordering::Relaxed);
        let in_force = weight_in_force(state, cut_off);
        if let Some(weight) = in_force
            && let Err(e) = self.rules.override_percent(&self.config.rule, weight)
        {
            tracing::error!(target: "gray::rollout", service = %self.service, rule = %self.config.rule, error = %e, "cannot put the rollout's weight on its rule");
        }
        self.close_tunnels(state);
        let shadow = self.shadow_view(state);
        self.recorder.follow(&state.epoch_spec());
        let population = state.phase.is_active().then(|| {
            Arc::new(Population {
                recorder: self.recorder.clone(),
                rule: self.config.rule.as_str().into(),
                rules: self.rules.clone(),
            })
        });
        self.evidence.set_population(population);
        let mut view = self.lock_view();
        view.phase = state.phase;
        view.pause_reason = state.pause;
        view.weight = in_force.unwrap_or(state.weight);
        view.cut_off = cut_off;
        view.step = state.step;
        view.evidence = Some(state.evidence.summary());
        view.last_transition = state.last_transition.clone();
        view.shadow = shadow;
    }

    /// Once a rollout is rolled back, the upgraded connections (WebSocket) of its rule's
    /// lane are closed, paced (`crate::upgrade`): their clients reconnect to baseline.
    fn close_tunnels(&self, state: &State) {
        if state.phase != Phase::RolledBack {
            self.tunnels_closed.store(false, Ordering::Relaxed);
            return;
        }
        if self.tunnels_closed.swap(true, Ordering::Relaxed) {
            return;
        }
        let rules = self.rules.load();
        let lane = rules
            .rules()
            .sticky_rule(&self.config.rule)
            .ok()
            .and_then(|sticky| sticky.rule().stain().and_then(|s| s.lane().cloned()));
        if let Some(lane) = lane {
            self.tunnels.close_lane(&self.service, &lane);
        }
    }

    /// With a shadow phase, the mirror copies while the rollout is in it (stopped at once
    /// otherwise: on an alarm, at the first step); what the view shows of the phase.
    fn shadow_view(&self, state: &State) -> Option<ShadowView> {
        let mirror = self.mirror.as_ref()?;
        if self.config.shadow.is_some() {
            mirror.set_enabled(state.phase == Phase::Shadow);
        }
        let evidence = state.shadow.as_ref()?;
        Some(ShadowView {
            counts: evidence.counts,
            mismatch_log_m: evidence.mismatch.log_m(),
            slow_log_m: evidence.slow.log_m(),
            alarm_at: evidence.mismatch.log_threshold(),
            recent_mismatches: mirror.recent(),
            noise: mirror.judgement().noise,
        })
    }

    /// Everything a transition does but the save.
    pub(super) fn transitioned(&self, rollout: &Rollout, t: &Transition) {
        self.put_in_force(rollout.state());
        let evidence = serde_json::to_string(&t.evidence).unwrap_or_default();
        let reason = serde_json::to_string(&t.reason).unwrap_or_default();
        if t.to == Phase::RolledBack {
            tracing::warn!(target: "gray::rollout", service = %self.service, from = %t.from, to = %t.to, weight = t.weight, step = ?t.step, reason = %reason, evidence = %evidence, "rollout rolled back: weight 0");
        } else {
            tracing::info!(target: "gray::rollout", service = %self.service, from = %t.from, to = %t.to, weight = t.weight, step = ?t.step, reason = %reason, evidence = %evidence, "rollout transition");
        }
        let mut view = self.lock_view();
        *view
            .counts
            .entry((t.from.as_str(), t.to.as_str(), t.reason.as_str()))
            .or_default() += 1;
        view.transitions.push_back(t.clone());
        while view.transitions.len() > self.history {
            view.transitions.pop_front();
        }
    }
}

/// The percentage a rollout's rule runs at: the one decision of it. The state machine
/// (gray-rollout's `Rollout`) decides the rollout's weight (`State::weight`), the store
/// keeps it, and this says what of it is in force on this gateway: that weight, but 0
/// while a rollout *in progress* (`step`, `paused`) is on a gateway cut off from the store
/// for longer than the partition hold; `None` for a rollout never started, whose rule
/// keeps its source's percentage.
///
/// A final weight is final: `promoted` (100) and `rolled_back` (0) are held through any
/// outage of the store, because no leader can change them any more and baseline may
/// already be scaled down after a promotion. [`Controller::put_in_force`] is the only
/// caller, and the only one that applies it (`LiveRules::override_percent`, which the
/// sticky rule then reads per request).
fn weight_in_force(state: &gray_rollout::machine::State, cut_off: bool) -> Option<f64> {
    match state.phase {
        Phase::Pending => None,
        Phase::Step | Phase::Paused if cut_off => Some(0.0),
        _ => Some(state.weight),
    }
}
