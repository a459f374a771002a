//! A rollout from a stored [`State`]: [`Rollout::restore`] checks it against the
//! configuration, and [`Rollout::abort_unfit`] rolls back one that does not fit.

use std::time::Duration;

use super::{
    PauseReason, Phase, Reason, RestoreError, Rollout, RolloutConfig, State, Transition, whole_ms,
};
use crate::evidence::Stream;
use crate::kill::KillWindow;

// === impl Rollout ===

impl Rollout {
    /// The rollout `state` describes (read back from a file or etcd), checked against
    /// `config`: the same step, the same evidence. The kill switch's window starts again
    /// empty. A state that is not active (`pending`, `promoted`, `rolled_back`) fits any
    /// configuration: nothing is judged until a start, which begins fresh evidence under
    /// the configuration of the day.
    pub fn restore(config: RolloutConfig, state: State) -> Result<Self, RestoreError> {
        let mut rollout = Rollout::new(config)?;
        let steps = &rollout.config.steps;
        let judged = if state.phase.is_active() {
            &Stream::ALL[..]
        } else {
            &[]
        };
        for &s in judged {
            let (have, want) = (state.evidence.streams.get(s), rollout.fresh.get(s));
            if !have.same_test(want) {
                return Err(RestoreError::new(
                    format!("evidence.streams.{s}"),
                    format!(
                        "made with r0 {}, ratios {:?} and alpha {}; the configuration has r0 {}, ratios {:?} and alpha {}",
                        have.tolerance(),
                        have.ratios(),
                        have.alpha(),
                        want.tolerance(),
                        want.ratios(),
                        want.alpha()
                    ),
                ));
            }
        }
        if state.phase == Phase::Shadow {
            let fits = rollout.config.shadow.is_some()
                && state.shadow.as_ref().is_some_and(|s| {
                    s.mismatch.same_test(&rollout.shadow.0) && s.slow.same_test(&rollout.shadow.1)
                });
            if !fits {
                return Err(RestoreError::new(
                    "shadow",
                    "a rollout in its shadow phase needs the configuration's `shadow`, with the same alpha and ratios",
                ));
            }
        }
        let expected = match (state.phase, state.step) {
            (Phase::Pending | Phase::Shadow | Phase::RolledBack, _) => Some(0.0),
            (Phase::Promoted, _) => Some(100.0),
            (Phase::Step | Phase::Paused, Some(i)) => steps.get(i).copied(),
            (Phase::Step | Phase::Paused, None) => None,
        };
        if expected != Some(state.weight) || state.epoch.weight != state.weight {
            return Err(RestoreError::new(
                "weight",
                format!(
                    "{} (epoch {}) does not fit phase {} at step {:?} of {:?}",
                    state.weight, state.epoch.weight, state.phase, state.step, steps
                ),
            ));
        }
        let pause_fits = match (state.phase, state.pause) {
            (Phase::Paused, Some(PauseReason::Gate { step })) => {
                state.step.and_then(|i| i.checked_add(1)) == Some(step) && step < steps.len()
            }
            (Phase::Paused, pause) => pause.is_some(),
            (_, pause) => pause.is_none(),
        };
        if !pause_fits {
            return Err(RestoreError::new(
                "pause",
                format!(
                    "{:?} does not fit phase {} at step {:?}",
                    state.pause, state.phase, state.step
                ),
            ));
        }
        let at = state.last_evidence.unwrap_or(state.epoch.started);
        rollout.state = state;
        rollout.kill = KillWindow::resume(
            rollout.config.kill_switch.clone(),
            at,
            rollout.kill_counts(),
        );
        Ok(rollout)
    }

    /// Rolls back a stored rollout that `config` does not fit ([`restore`](Self::restore)
    /// refused it: a configuration change rolling through a fleet of gateways, say): its
    /// run, epochs and transitions go on from `state`, its weight goes to 0, and the
    /// rolled-back state fits `config` (and any other) from then on. The abort that works
    /// whatever configuration wrote the state; `state` must be active or promoted, as for
    /// [`abort`](Self::abort).
    pub fn abort_unfit(
        config: RolloutConfig,
        state: State,
        now: Duration,
    ) -> Result<(Self, Transition), RestoreError> {
        let mut rollout = Rollout::new(config)?;
        if !(state.phase.is_active() || state.phase == Phase::Promoted) {
            return Err(RestoreError::new(
                "phase",
                format!("a rollout {} cannot be aborted", state.phase),
            ));
        }
        rollout.state = state;
        let transition = rollout.roll_back(whole_ms(now), Reason::Abort);
        Ok((rollout, transition))
    }
}
