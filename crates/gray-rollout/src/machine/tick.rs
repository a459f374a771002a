//! Time: [`tick`](Rollout::tick) advances a step whose hold, users and power are met,
//! leaves the shadow phase, pauses on stale evidence, missing gray traffic or a shared
//! outage, and lifts those pauses.

use std::time::Duration;

use super::{PauseReason, Phase, Reason, Rollout, Transition, whole_ms};
use crate::millis::as_ms;

// === impl Rollout ===

impl Rollout {
    /// Moves on with time: advances a step whose hold is met, pauses on stale evidence or
    /// missing gray traffic, resumes when they come back.
    pub fn tick(&mut self, now: Duration) -> Option<Transition> {
        let now = whole_ms(now);
        let stale_after = self.config.stale_after;
        let entered = self
            .state
            .last_transition
            .as_ref()
            .map_or(Duration::ZERO, |t| t.at);
        let quiet = |last: Option<Duration>| {
            now.saturating_sub(last.unwrap_or(Duration::ZERO).max(entered)) > stale_after
        };
        let (step, weight) = (self.state.step, self.state.weight);
        match (self.state.phase, self.state.pause) {
            (Phase::Shadow, _) => {
                let shadow = self.config.shadow?;
                let held = now.saturating_sub(entered);
                let counts = self
                    .state
                    .shadow
                    .as_ref()
                    .map(|s| s.counts)
                    .unwrap_or_default();
                if held < shadow.hold || counts.copies < shadow.min_requests {
                    return None;
                }
                let reason = Reason::ShadowPassed {
                    held_ms: as_ms(held),
                    counts,
                };
                Some(self.enter(now, 0, reason))
            }
            (Phase::Step, _) => {
                if quiet(self.state.last_evidence) {
                    let reason = Reason::Stale {
                        last_evidence_ms: self.state.last_evidence.map(as_ms),
                    };
                    let pause = Some(PauseReason::Stale);
                    return Some(self.transition(now, Phase::Paused, pause, step, weight, reason));
                }
                if quiet(self.state.last_gray_request) {
                    let reason = Reason::NoData {
                        last_gray_request_ms: self.state.last_gray_request.map(as_ms),
                    };
                    let pause = Some(PauseReason::NoData);
                    return Some(self.transition(now, Phase::Paused, pause, step, weight, reason));
                }
                let recent = self.kill.recent_within(now, self.config.outage.window);
                if self.config.outage.began(&recent) {
                    let reason = Reason::Outage((&recent).into());
                    let pause = Some(PauseReason::Outage);
                    return Some(self.transition(now, Phase::Paused, pause, step, weight, reason));
                }
                let held = now.saturating_sub(self.state.epoch.started);
                let users = self.state.evidence.epoch.gray_users;
                if held < self.config.hold || users < self.config.min_users || !self.powered() {
                    return None;
                }
                let next = step.map_or(0, |i| i + 1);
                let next_weight = *self.config.steps.get(next)?;
                if self.config.gates.contains(&next_weight) {
                    let pause = Some(PauseReason::Gate { step: next });
                    let reason = Reason::Gate { next_weight };
                    return Some(self.transition(now, Phase::Paused, pause, step, weight, reason));
                }
                let reason = if next_weight >= 100.0 {
                    Reason::Complete
                } else {
                    Reason::Advance {
                        held_ms: as_ms(held),
                        users,
                        power: self
                            .config
                            .detect
                            .is_enabled()
                            .then_some(self.state.evidence.step_power)
                            .flatten(),
                    }
                };
                Some(self.enter(now, next, reason))
            }
            (Phase::Paused, Some(PauseReason::Outage)) => {
                let recent = self.kill.recent_within(now, self.config.outage.window);
                if !self.config.outage.ended(&recent) {
                    return None;
                }
                // the step starts again: its hold and power are earned after the outage
                let thresholds = self.state.epoch.thresholds;
                self.new_epoch(now, weight);
                if thresholds.is_some() {
                    self.state.epoch.thresholds = thresholds;
                }
                let reason = Reason::Recovered((&recent).into());
                Some(self.transition(now, Phase::Step, None, step, weight, reason))
            }
            (Phase::Paused, Some(p)) if p.is_automatic() => {
                // lifts once both evidence and gray traffic arrived since the pause
                let since = |last: Option<Duration>| last.is_some_and(|t| t >= entered);
                if since(self.state.last_evidence) && since(self.state.last_gray_request) {
                    return Some(self.transition(
                        now,
                        Phase::Step,
                        None,
                        step,
                        weight,
                        Reason::Fresh,
                    ));
                }
                None
            }
            _ => None,
        }
    }
}
