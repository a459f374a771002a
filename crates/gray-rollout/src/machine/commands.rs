//! The manual commands: [`start`](Rollout::start), [`pause`](Rollout::pause),
//! [`resume`](Rollout::resume), [`promote`](Rollout::promote) and
//! [`abort`](Rollout::abort), each a [`Transition`] or a [`CommandError`].

use std::time::Duration;

use super::{
    Command, CommandError, PauseReason, Phase, Reason, Rollout, ShadowEvidence, Transition,
    whole_ms,
};
use crate::evidence::Stream;
use crate::kill::KillWindow;

// === impl Rollout ===

impl Rollout {
    /// Starts at the first step with fresh evidence, from `pending`, `promoted` or
    /// `rolled_back`. A gate on the first step is met by the start itself.
    pub fn start(&mut self, now: Duration) -> Result<Transition, CommandError> {
        let now = whole_ms(now);
        if self.state.phase.is_active() {
            return Err(self.refuse(Command::Start));
        }
        let ev = &mut self.state.evidence;
        ev.streams = self.fresh.clone();
        for s in Stream::ALL {
            ev.streams.get_mut(s).begin(now);
        }
        ev.requests = Default::default();
        ev.errors = Default::default();
        self.state.last_gray_request = None;
        self.kill = KillWindow::new(self.config.kill_switch.clone(), now);
        if self.config.shadow.is_some() {
            // Copies only, at weight 0, in an epoch of its own; the steps come after.
            let (mismatch, slow) = self.shadow.clone();
            self.state.shadow = Some(ShadowEvidence::new(mismatch, slow, now));
            self.new_epoch(now, 0.0);
            self.state.run = self.state.epoch.index;
            self.state.users.new_run();
            return Ok(self.transition(now, Phase::Shadow, None, None, 0.0, Reason::Start));
        }
        let weight = self.config.steps[0];
        let to = if weight >= 100.0 {
            Phase::Promoted
        } else {
            Phase::Step
        };
        // a run starts with an epoch of its own, whatever the weight was
        self.new_epoch(now, weight);
        self.state.run = self.state.epoch.index;
        self.state.users.new_run();
        Ok(self.transition(now, to, None, Some(0), weight, Reason::Start))
    }

    /// Pauses a rollout at its step (the test keeps running). A rollout paused for stale
    /// evidence becomes paused by hand: it no longer resumes by itself.
    pub fn pause(&mut self, now: Duration) -> Result<Transition, CommandError> {
        match (self.state.phase, self.state.pause) {
            (Phase::Step, _) => {}
            (Phase::Paused, Some(p)) if p.is_automatic() => {}
            _ => return Err(self.refuse(Command::Pause)),
        }
        let (step, weight) = (self.state.step, self.state.weight);
        let pause = Some(PauseReason::Manual);
        Ok(self.transition(
            whole_ms(now),
            Phase::Paused,
            pause,
            step,
            weight,
            Reason::Pause,
        ))
    }

    /// Resumes a paused rollout; at a gate, enters the gated step.
    pub fn resume(&mut self, now: Duration) -> Result<Transition, CommandError> {
        let now = whole_ms(now);
        match (self.state.phase, self.state.pause) {
            (Phase::Paused, Some(PauseReason::Gate { step })) => {
                Ok(self.enter(now, step, Reason::Resume))
            }
            (Phase::Paused, _) => {
                let (step, weight) = (self.state.step, self.state.weight);
                Ok(self.transition(now, Phase::Step, None, step, weight, Reason::Resume))
            }
            _ => Err(self.refuse(Command::Resume)),
        }
    }

    /// Promotes a running rollout to 100 % at once.
    pub fn promote(&mut self, now: Duration) -> Result<Transition, CommandError> {
        if !self.state.phase.is_active() {
            return Err(self.refuse(Command::Promote));
        }
        let last = Some(self.config.steps.len() - 1);
        Ok(self.transition(
            whole_ms(now),
            Phase::Promoted,
            None,
            last,
            100.0,
            Reason::Promote,
        ))
    }

    /// Rolls back to 0 % at once, from `step`, `paused` or `promoted`.
    pub fn abort(&mut self, now: Duration) -> Result<Transition, CommandError> {
        if !(self.state.phase.is_active() || self.state.phase == Phase::Promoted) {
            return Err(self.refuse(Command::Abort));
        }
        Ok(self.roll_back(whole_ms(now), Reason::Abort))
    }

    fn refuse(&self, command: Command) -> CommandError {
        CommandError {
            command,
            phase: self.state.phase,
            pause: self.state.pause,
        }
    }
}
