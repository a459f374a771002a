//! One service's rollout in the gateway: the commands of the admin API, the look about
//! once an `interval` (every gateway's report into [`Rollout::observe_all`], then
//! [`Rollout::tick`]), and what each transition does: the weight put on the rule at once,
//! the recorder following the new epoch, a log line, the metrics, the history and the
//! store. What is written when (the state on a transition, else every `save_every`; a
//! follower's report when it changed, every `report_every` or at once with news against
//! gray) is [`cadence`](super::cadence)'s.
//!
//! Who transitions is decided here, not in the store: only the leader
//! ([`RolloutStore::is_leader`]) observes and advances, in saves fenced by
//! [`Fence::Leader`](super::store::Fence::Leader). The admin API's commands (start, pause,
//! resume, promote, abort) may come to any gateway: they are saved fenced by the state's
//! version only ([`Fence::Any`](super::store::Fence::Any): an operator's command on the
//! latest state wins, and abort is the safe direction); a command that loses to another
//! writer is tried again on what is stored. Every gateway applies the weight of the states
//! others write at once (the store's [`watch`](RolloutStore::watch)).
//!
//! A gateway cut off from the store (no answer for `[rollouts] partition_hold_ms`,
//! [`RolloutStore::contact`]) puts 0 on the rule of a rollout in progress until contact
//! returns, then the stored weight again; a final weight (promoted, rolled back) is held.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the [`Controller`], restored from the store, and its task ([`Controller::run`]) |
//! | `command.rs` | the admin API's commands ([`Controller::command`]) |
//! | `look.rs` | a look ([`Controller::look`]), bounded and caught; the partition rule |
//! | `save.rs` | the leader's saves |
//! | `follow.rs` | the states others write: followed, adopted, or kept as a skew |
//! | `in_force.rs` | what a state puts in force on this gateway: `weight_in_force` |
//! | `view.rs` | what the admin API and the metrics show ([`View`]) |

mod command;
mod follow;
mod in_force;
mod look;
mod save;
mod view;

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64},
    },
    time::{Duration, SystemTime},
};

use gray_rollout::{Phase, Recorder, Rollout, RolloutConfig, State};
use gray_tower::edge::LiveRules;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tower::BoxError;

pub(crate) use command::{Command, Refused};
pub(crate) use view::View;
use view::{LookFailures, ShadowView, Skew};

use super::{
    ServiceEvidence,
    cadence::Cadence,
    store::{RolloutStore, Stored},
};
use crate::config::RolloutSettings;

/// One service's rollout; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Controller {
    service: String,
    config: RolloutConfig,
    rules: LiveRules,
    evidence: Arc<ServiceEvidence>,
    recorder: Arc<Recorder>,
    store: Arc<dyn RolloutStore>,
    history: usize,
    partition_hold: Duration,
    /// How long one look may take before it is cancelled (`[rollouts] lease_ttl_ms`: a
    /// leader that cannot complete looks for that long also gives up leading).
    look_bound: Duration,
    /// A state without a transition is saved at most this often (`save_every_ms`).
    save_every: Duration,
    /// A changed report without news against gray is published at most this often
    /// (`report_every_ms`, at most a third of `stale_ms`).
    report_every: Duration,
    cadence: Mutex<Cadence>,
    /// The version of the last state the store's watch delivered.
    watched: AtomicU64,
    cut_off: AtomicBool,
    rollout: AsyncMutex<Option<Rollout>>,
    /// The stored state this gateway's configuration does not fit, while it does not
    /// ([`Skew`]); the rollout's slot is then empty.
    unfit: Mutex<Option<Stored>>,
    view: Mutex<View>,
    /// The upgraded connections, which a rollback closes for the rule's lane.
    tunnels: Arc<crate::upgrade::Tunnels>,
    /// The service's mirror: with a `shadow` phase, it copies only while the rollout is in
    /// it, and its judge's counts go into this gateway's reports.
    mirror: Option<Arc<crate::mirror::Mirror>>,
    /// The rollback's closing of the lane's upgraded connections was started (once per
    /// rollback).
    tunnels_closed: AtomicBool,
}

/// The clock the states are written in: milliseconds since the Unix epoch, so that a
/// restarted gateway reads the times it wrote.
fn now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// What a rollout governs beyond its rule's weight: the upgraded connections a rollback
/// closes, and the mirror that copies in its shadow phase.
#[derive(Debug)]
pub(crate) struct Traffic {
    pub(crate) tunnels: Arc<crate::upgrade::Tunnels>,
    pub(crate) mirror: Option<Arc<crate::mirror::Mirror>>,
}

// === impl Controller ===

impl Controller {
    /// The controller of `service`'s rollout, with the state the store holds (restored:
    /// the same step, the same evidence, its weight on the rule at once).
    pub(crate) async fn restore(
        service: &str,
        config: RolloutConfig,
        rules: LiveRules,
        evidence: Arc<ServiceEvidence>,
        store: Arc<dyn RolloutStore>,
        settings: &RolloutSettings,
        traffic: Traffic,
    ) -> Result<Arc<Controller>, BoxError> {
        let Traffic { tunnels, mirror } = traffic;
        if let Some(mirror) = &mirror
            && config.shadow.is_some()
        {
            // Copies only in the shadow phase (enabled when it is put in force).
            mirror.set_enabled(false);
        }
        let stored = store
            .load(service)
            .await
            .map_err(|e| format!("rollout of `{service}`: cannot read its state: {e}"))?;
        let source = gray_core::rand::Rng::new().next_u64();
        let view = View {
            service: service.to_owned(),
            rule: config.rule.clone(),
            phase: Phase::Pending,
            pause_reason: None,
            weight: 0.0,
            step: None,
            steps: config.steps.clone(),
            source_percent: None,
            evidence: None,
            last_transition: None,
            transitions: VecDeque::new(),
            counts: BTreeMap::new(),
            version: stored.as_ref().map(|s| s.version),
            cut_off: false,
            leader: false,
            look_failures: LookFailures::default(),
            unsaved: false,
            config_skew: None,
            shadow: None,
        };
        let controller = Arc::new(Controller {
            service: service.to_owned(),
            rules,
            evidence,
            recorder: Arc::new(Recorder::new(source)),
            store,
            history: settings.history,
            partition_hold: settings.partition_hold,
            look_bound: settings.lease_ttl,
            save_every: settings.save_every,
            report_every: settings
                .report_every
                .min(config.stale_after / 3)
                .max(Duration::from_millis(1)),
            cadence: Mutex::new(Cadence::default()),
            watched: AtomicU64::new(0),
            cut_off: AtomicBool::new(false),
            rollout: AsyncMutex::new(None),
            unfit: Mutex::new(None),
            view: Mutex::new(view),
            tunnels,
            tunnels_closed: AtomicBool::new(false),
            mirror,
            config,
        });
        if let Some(stored) = stored {
            let rollout = match Rollout::restore(controller.config.clone(), stored.state.clone()) {
                Ok(rollout) => rollout,
                Err(e) => {
                    controller.unfit(stored, &e);
                    return Ok(controller);
                }
            };
            if let Some(t) = &rollout.state().last_transition {
                controller.lock_view().transitions.push_back(t.clone());
            }
            tracing::info!(
                target: "gray::rollout",
                service,
                phase = %rollout.state().phase,
                weight = rollout.state().weight,
                step = ?rollout.state().step,
                "rollout restored from its saved state",
            );
            controller.acknowledge(&rollout);
            controller.put_in_force(rollout.state());
            *controller.rollout.lock().await = Some(rollout);
        }
        Ok(controller)
    }

    /// Has the recorder forget the user log entries `saved` consumed: only ever with a
    /// state the store holds (read from it, or accepted by it), so that a leader that
    /// dies before its next save leaves them to be read again by the next.
    pub(super) fn acknowledge(&self, saved: &Rollout) {
        self.acknowledge_state(saved.state());
    }

    pub(super) fn acknowledge_state(&self, saved: &State) {
        let cursor = saved.users.cursor(self.recorder.source());
        self.recorder.acknowledge(cursor);
    }

    pub(super) fn lock_view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lock_cadence(&self) -> std::sync::MutexGuard<'_, Cadence> {
        self.cadence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the admin API shows.
    pub(crate) fn view(&self) -> View {
        let mut view = self.lock_view().clone();
        view.leader = self.store.is_leader(&self.service);
        view.source_percent = match self.rules.percent_override(&self.config.rule) {
            Some(o) => o.source_percent,
            None => self
                .rules
                .load()
                .rules()
                .sticky_rule(&self.config.rule)
                .ok()
                .map(|s| s.percent()),
        };
        view
    }

    /// Looks every `interval`, and follows the states written to the store, until
    /// `stopped`.
    pub(crate) async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut states = self.store.watch(&self.service);
        let mut watching = true;
        loop {
            tokio::select! {
                _ = ticker.tick() => self.guarded_look().await,
                changed = states.changed(), if watching => match changed {
                    Ok(()) => {
                        let stored = states.borrow_and_update().clone();
                        self.follow(stored).await;
                    }
                    Err(_) => watching = false,
                },
                () = crate::serve::until_stopped(&mut stopped) => {
                    self.save_on_stop().await;
                    return;
                }
            }
        }
    }
}
