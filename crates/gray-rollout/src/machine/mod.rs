//! The rollout state machine: pure, on the caller's clock.
//!
//! A [`Rollout`] steps a sticky-percentage rule through its [`RolloutConfig::steps`] and
//! rolls it back when the evidence says gray is worse than baseline. It reads no clock
//! and does no I/O: every call takes `now`, a [`Duration`] since an origin the caller
//! picks (whole milliseconds count; if the [`State`] is persisted, pick an origin that
//! survives a restart, such as the Unix epoch). Each call that changes the phase or the
//! weight returns a [`Transition`] with its [`Reason`] and the evidence at that moment,
//! for the caller to log, count and keep; the new [`State::weight`] is what the rule's
//! `percent` must be from then on.
//!
//! | from | event | to |
//! |---|---|---|
//! | `pending`, `promoted`, `rolled_back` | [`start`](Rollout::start) | `step` at the first step (fresh evidence); `shadow` at weight 0 with a [`ShadowPhase`] |
//! | `shadow` | [`tick`](Rollout::tick): its hold and `min_requests` copies judged, no alarm | `step` at the first step |
//! | `shadow` | [`observe`](Rollout::observe): the judge's counts in the reports ([`Report::with_shadow`](crate::Report::with_shadow)) alarm a test | `rolled_back`, weight 0 |
//! | `step` | [`tick`](Rollout::tick): hold time, `min_users` and the [`Detect`] power met | `step` at the next step, `paused` before a gated step, `promoted` at 100 % |
//! | `step` | `tick`: no evidence, or no gray request, for `stale_ms` | `paused` (lifts by itself when they come back) |
//! | `step` | `tick`: both arms failing together ([`SharedOutage`]) | `paused` (lifts by itself when baseline recovers; the step starts again) |
//! | `step`, `paused` | [`observe`](Rollout::observe): a stream's test alarms, or the kill switch | `rolled_back`, weight 0 |
//! | `step`, `paused` | [`pause`](Rollout::pause) / [`resume`](Rollout::resume) | `paused` / `step` (a gated step is entered) |
//! | `shadow`, `step`, `paused` | [`promote`](Rollout::promote) | `promoted`, weight 100 |
//! | `shadow`, `step`, `paused`, `promoted` | [`abort`](Rollout::abort) | `rolled_back`, weight 0 |
//!
//! The test keeps running while paused: a paused rollout still rolls back.
//!
//! The caller's loop: give each recorder the epoch to follow
//! ([`State::epoch_spec`] → [`Recorder::follow`](crate::evidence::Recorder::follow)),
//! feed every recorder's [`Report`] to [`observe`](Rollout::observe) (the leader does it
//! for every gateway's report), call [`tick`](Rollout::tick) about once a second, and
//! persist [`state`](Rollout::state) after each change.
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::evidence::{Arm, Observation, Outcome, Recorder};
//! use gray_rollout::machine::{Detect, Phase, Rollout, RolloutConfig};
//!
//! let config = RolloutConfig::new("canary")
//!     .with_steps([50.0, 100.0])
//!     .with_hold(Duration::from_secs(10))
//!     .with_min_users(3)
//!     // a step advances once it could have caught a fault of half its users
//!     .with_detect(Detect::new().with_min_rate(0.5));
//! let mut rollout = Rollout::new(config).unwrap();
//! let recorder = Recorder::new(1);
//! let s = Duration::from_secs;
//!
//! let t = rollout.start(s(0)).unwrap();
//! assert_eq!((t.to, t.weight), (Phase::Step, 50.0));
//! recorder.follow(&rollout.state().epoch_spec());
//! for user in 0..100 {
//!     let arm = if user % 2 == 0 { Arm::Gray } else { Arm::Baseline };
//!     recorder.record(&Observation::new(arm, user, Outcome::Ok, Duration::from_millis(20)));
//! }
//! assert!(rollout.observe(s(5), &recorder.report()).is_none());
//! assert!(rollout.tick(s(5)).is_none()); // holding: 10 s per step
//! rollout.observe(s(10), &recorder.report());
//! let t = rollout.tick(s(10)).unwrap();
//! assert_eq!((t.to, t.weight, t.reason.as_str()), (Phase::Promoted, 100.0, "complete"));
//! ```

mod config;
mod detect;
mod error;
mod outage;
mod state;
pub mod users;

use std::collections::BTreeMap;
use std::time::Duration;

pub use config::{ConfigError, RolloutConfig, ShadowPhase, Tolerance};
pub use detect::Detect;
pub use error::{Command, CommandError, RestoreError};
pub use outage::{OutageEvidence, SharedOutage};
pub use state::{
    Consumed, Epoch, Evidence, EvidenceSummary, PauseReason, Phase, Reason, ShadowEvidence, State,
    Transition,
};
pub use users::Users;

use crate::evidence::{Counters, EpochSpec, PerStream, Report, Stream, Thresholds, UserLog};
use crate::histogram::Snapshot;
use crate::kill::{KillCounts, KillWindow};
use crate::millis::as_ms;
use crate::sequential::MixtureTest;

/// A rollout; see the [module docs](self).
#[derive(Debug)]
pub struct Rollout {
    config: RolloutConfig,
    fresh: PerStream<MixtureTest>,
    /// The fresh tests of a shadow phase.
    shadow: (MixtureTest, MixtureTest),
    state: State,
    kill: KillWindow,
    /// The current epoch's baseline latencies, per source (not persisted: every report
    /// carries them whole).
    latencies: BTreeMap<u64, Snapshot>,
}

fn whole_ms(now: Duration) -> Duration {
    Duration::from_millis(as_ms(now))
}

// === impl Rollout ===

impl Rollout {
    /// A pending rollout (weight 0, epoch 0), once `config` is [valid](RolloutConfig::validate).
    pub fn new(config: RolloutConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let fresh = config.tests()?;
        let state = State {
            phase: Phase::Pending,
            pause: None,
            weight: 0.0,
            step: None,
            run: 0,
            epoch: Epoch {
                index: 0,
                weight: 0.0,
                started: Duration::ZERO,
                thresholds: None,
            },
            previous_epoch: None,
            evidence: Evidence {
                streams: fresh.clone(),
                requests: Default::default(),
                errors: Default::default(),
                epoch: Counters::default(),
                step_power: None,
            },
            consumed: Consumed::default(),
            users: Users::default(),
            last_evidence: None,
            last_gray_request: None,
            last_transition: None,
            transitions: 0,
            shadow: None,
        };
        let shadow = config.shadow_tests()?;
        Ok(Rollout {
            kill: KillWindow::new(config.kill_switch.clone(), Duration::ZERO),
            config,
            fresh,
            shadow,
            state,
            latencies: BTreeMap::new(),
        })
    }

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

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &RolloutConfig {
        &self.config
    }

    /// The state: persist it after every call that changed it.
    #[must_use]
    pub fn state(&self) -> &State {
        &self.state
    }

    /// What every recorder must follow.
    #[must_use]
    pub fn epoch_spec(&self) -> EpochSpec {
        self.state.epoch_spec()
    }

    // --- manual commands ---

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

    // --- evidence and time ---

    /// Consumes a source's report: only what it counts beyond its previous report (per
    /// epoch) is new. Counts of an epoch other than the current one and the one before
    /// are ignored. Distinct users come from the report's user log when it has one (the
    /// union over every source, [`users`]), else from its counters. Returns the
    /// rollback, if a stream's test alarmed or the kill switch tripped. With several
    /// sources, [`observe_all`](Rollout::observe_all) is exact where this is not quite.
    pub fn observe(&mut self, now: Duration, report: &Report) -> Option<Transition> {
        self.observe_all(now, std::slice::from_ref(report))
    }

    /// Consumes the reports of every source at once, as [`observe`](Rollout::observe)
    /// does one: the user logs' entries of the epoch before are taken from every report
    /// before those of the current epoch, so that a user who moved from baseline to gray
    /// with the weight counts in the arm of its first bad event, whichever gateway saw
    /// it.
    pub fn observe_all(&mut self, now: Duration, reports: &[Report]) -> Option<Transition> {
        let now = whole_ms(now);
        if reports.is_empty() {
            return None;
        }
        if self.state.phase == Phase::Shadow {
            return self.observe_shadow(now, reports);
        }
        self.state.last_evidence = Some(self.state.last_evidence.map_or(now, |t| t.max(now)));
        for report in reports {
            self.consume_counts(now, report);
        }
        let logs: Vec<(u64, &UserLog)> = reports
            .iter()
            .filter_map(|r| r.users.as_ref().map(|log| (r.source, log)))
            .collect();
        if !logs.is_empty() {
            let previous = self.state.previous_epoch;
            let added =
                self.state
                    .users
                    .consume(&logs, self.state.epoch.index, previous.map(|p| p.index));
            if let Some(prev) = previous {
                self.apply(now, prev.weight / 100.0, &added.previous);
            }
            self.apply(now, self.state.epoch.weight / 100.0, &added.current);
        }
        let consumed = self.state.consumed.current.values();
        let mut epoch = consumed.fold(Counters::default(), |a, c| a.add(c));
        if self.state.users.is_logged() {
            let counted = self.state.users.counted();
            epoch.gray_users = counted.gray_users;
            epoch.bad_users = counted.bad_users;
        }
        self.state.evidence.epoch = epoch;
        if self.state.epoch.thresholds.is_none() {
            self.state.epoch.thresholds = Thresholds::from_latencies(
                &self.baseline_latencies(),
                self.config.min_latency_samples,
            );
        }
        self.state.evidence.step_power = self.step_power();
        self.kill.observe(now, self.kill_counts());
        if !self.state.phase.is_active() {
            return None;
        }
        for s in Stream::ALL {
            let test = self.state.evidence.streams.get(s);
            if test.alarm() {
                let sum = test.summary();
                let reason = Reason::Alarm {
                    stream: s,
                    log_m: sum.log_m,
                    alarm_at: sum.alarm_at,
                    gray: sum.gray,
                    baseline: sum.baseline,
                    leading_ratio: sum.leading_ratio,
                };
                return Some(self.roll_back(now, reason));
            }
        }
        let trip = self.kill.check(now)?;
        Some(self.roll_back(now, Reason::KillSwitch(trip)))
    }

    /// The shadow phase's evidence: each source's judged counts beyond what was consumed
    /// of it, fed to the judge's tests as one batch each; an alarm rolls the rollout back.
    fn observe_shadow(&mut self, now: Duration, reports: &[Report]) -> Option<Transition> {
        self.state.last_evidence = Some(self.state.last_evidence.map_or(now, |t| t.max(now)));
        let fresh = &self.shadow;
        let shadow = self
            .state
            .shadow
            .get_or_insert_with(|| ShadowEvidence::new(fresh.0.clone(), fresh.1.clone(), now));
        for report in reports {
            let Some(counts) = &report.shadow else {
                continue;
            };
            let before = shadow
                .consumed
                .get(&report.source)
                .copied()
                .unwrap_or_default();
            let delta = counts.since(&before);
            shadow.consumed.insert(report.source, before.max(counts));
            shadow.counts = shadow.counts.add(&delta);
            delta.feed(now, &mut shadow.mismatch, &mut shadow.slow);
        }
        let (stream, test) = if shadow.mismatch.alarm() {
            ("mismatch", &shadow.mismatch)
        } else if shadow.slow.alarm() {
            ("slow", &shadow.slow)
        } else {
            return None;
        };
        let reason = Reason::ShadowAlarm {
            stream: stream.to_owned(),
            log_m: test.log_m(),
            alarm_at: test.log_threshold(),
            counts: shadow.counts,
        };
        Some(self.roll_back(now, reason))
    }

    /// The counters `report` has beyond what was consumed of its source, per epoch; with a
    /// user log, its user counts are left to the union.
    fn consume_counts(&mut self, now: Duration, report: &Report) {
        let logged = report.users.is_some();
        for counts in &report.epochs {
            let current = counts.epoch == self.state.epoch.index;
            let consumed = &mut self.state.consumed;
            let (weight, ledger) = match self.state.previous_epoch {
                _ if current => (self.state.epoch.weight, &mut consumed.current),
                Some(prev) if prev.index == counts.epoch => (prev.weight, &mut consumed.previous),
                _ => continue,
            };
            let before = ledger.get(&report.source).copied().unwrap_or_default();
            let mut delta = counts.counters.since(&before);
            ledger.insert(report.source, before.max(&counts.counters));
            if current {
                self.latencies
                    .insert(report.source, counts.baseline_latency.clone());
            }
            if logged {
                // the union counts this source's users
                delta.gray_users = 0;
                delta.bad_users = PerStream::default();
            }
            self.apply(now, weight / 100.0, &delta);
        }
    }

    fn apply(&mut self, now: Duration, w: f64, delta: &Counters) {
        let ev = &mut self.state.evidence;
        ev.requests = ev.requests + delta.requests;
        ev.errors = ev.errors + delta.errors;
        if delta.requests.gray > 0 {
            self.state.last_gray_request = Some(now);
        }
        for s in Stream::ALL {
            let bad = delta.bad_users.get(s);
            ev.streams.get_mut(s).update(now, w, bad.gray, bad.baseline);
        }
    }

    fn kill_counts(&self) -> KillCounts {
        let ev = &self.state.evidence;
        KillCounts::new(ev.requests, ev.errors, ev.streams.errors.counts().0)
    }

    fn baseline_latencies(&self) -> Snapshot {
        let mut sum = Snapshot::empty();
        for l in self.latencies.values() {
            sum.merge(l);
        }
        sum
    }

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

    // --- transitions ---

    /// Enters step `index` (promoted when it is 100 %).
    fn enter(&mut self, now: Duration, index: usize, reason: Reason) -> Transition {
        let weight = self.config.steps[index.min(self.config.steps.len() - 1)];
        let to = if weight >= 100.0 {
            Phase::Promoted
        } else {
            Phase::Step
        };
        self.transition(now, to, None, Some(index), weight, reason)
    }

    fn roll_back(&mut self, now: Duration, reason: Reason) -> Transition {
        let step = self.state.step;
        self.transition(now, Phase::RolledBack, None, step, 0.0, reason)
    }

    fn transition(
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
    fn new_epoch(&mut self, now: Duration, weight: f64) {
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

#[cfg(test)]
mod tests;
