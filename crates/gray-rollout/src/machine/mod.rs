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
//! feed every recorder's [`Report`](crate::Report) to [`observe`](Rollout::observe) (the
//! leader does it for every gateway's report), call [`tick`](Rollout::tick) about once a
//! second, and persist [`state`](Rollout::state) after each change.
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

mod commands;
mod config;
mod detect;
mod error;
mod observe;
mod outage;
mod restore;
mod state;
mod tick;
mod transition;
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

use crate::evidence::{Counters, EpochSpec, PerStream};
use crate::histogram::Snapshot;
use crate::kill::KillWindow;
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
}

#[cfg(test)]
mod tests;
