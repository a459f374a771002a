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
//! [`Fence::Leader`]. The admin API's commands (start, pause, resume, promote, abort) may
//! come to any gateway: they are saved fenced by the state's version only ([`Fence::Any`]:
//! an operator's command on the latest state wins, and abort is the safe direction); a
//! command that loses to another writer is tried again on what is stored. Every gateway
//! applies the weight of the states others write at once (the store's
//! [`watch`](RolloutStore::watch)).
//!
//! A gateway cut off from the store (no answer for `[rollouts] partition_hold_ms`,
//! [`RolloutStore::contact`]) puts 0 on the rule of a rollout in progress until contact
//! returns, then the stored weight again; a final weight (promoted, rolled back) is held.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use gray_rollout::{
    Phase, Recorder, Rollout, RolloutConfig, State, Transition,
    machine::{EvidenceSummary, RestoreError},
};
use gray_tower::edge::LiveRules;
use serde::Serialize;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tower::BoxError;

use super::{
    Population, ServiceEvidence,
    cadence::Cadence,
    store::{Fence, RolloutStore, Saved, Stored},
};
use crate::config::RolloutSettings;

/// A command of the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Start,
    Pause,
    Resume,
    Promote,
    Abort,
}

/// A command refused: the status to answer with, and why.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) status: u16,
    pub(crate) reason: String,
}

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

// === impl Controller ===

/// What a rollout governs beyond its rule's weight: the upgraded connections a rollback
/// closes, and the mirror that copies in its shadow phase.
#[derive(Debug)]
pub(crate) struct Traffic {
    pub(crate) tunnels: Arc<crate::upgrade::Tunnels>,
    pub(crate) mirror: Option<Arc<crate::mirror::Mirror>>,
}

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
    fn acknowledge(&self, saved: &Rollout) {
        self.acknowledge_state(saved.state());
    }

    fn acknowledge_state(&self, saved: &State) {
        let cursor = saved.users.cursor(self.recorder.source());
        self.recorder.acknowledge(cursor);
    }

    fn lock_view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_cadence(&self) -> std::sync::MutexGuard<'_, Cadence> {
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

    /// Puts `state`'s weight on the rule (but for a rollout never started), records
    /// evidence while it is active, and has the recorder follow its epoch.
    fn put_in_force(&self, state: &State) {
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

    /// This gateway's report: its recorder's, with its mirror's judged counts while the
    /// rollout is in its shadow phase.
    fn report(&self, phase: Phase) -> gray_rollout::evidence::Report {
        let report = self.recorder.report();
        match (&self.mirror, phase) {
            (Some(mirror), Phase::Shadow) => report.with_shadow(mirror.counts()),
            _ => report,
        }
    }

    /// Runs `command` on the stored state: saved fenced by the state's version only, and
    /// tried again on what is stored when another writer saved first.
    pub(crate) async fn command(&self, command: Command) -> Result<View, Refused> {
        let mut slot = self.rollout.lock().await;
        for _ in 0..3 {
            let before = slot.as_ref().map(|r| r.state().clone());
            let unfit = self.lock_unfit().clone();
            let transition = match unfit {
                Some(unfit) => self.abort_unfit(command, unfit, &mut slot)?,
                None => self.apply(command, &mut slot)?,
            };
            let Some(rollout) = slot.as_mut() else {
                break;
            };
            let expected = self.lock_view().version;
            match self
                .store
                .save(&self.service, rollout.state(), expected, Fence::Any)
                .await
            {
                Ok(Saved::Won(version)) => {
                    self.lock_view().version = Some(version);
                    self.fits_again();
                    self.acknowledge(rollout);
                    self.transitioned(rollout, &transition);
                    drop(slot);
                    return Ok(self.view());
                }
                Ok(Saved::Lost(Some(current))) => self.adopt(&mut slot, Some(*current)),
                Ok(Saved::Lost(None)) => {
                    // The state was deleted under the command: try it again on the state
                    // before it, which the next save creates.
                    self.lock_view().version = None;
                    *slot = before.and_then(|b| Rollout::restore(self.config.clone(), b).ok());
                }
                Err(e) => {
                    // Not saved: nothing happened; the state before stays.
                    *slot = before.and_then(|b| Rollout::restore(self.config.clone(), b).ok());
                    return Err(Refused {
                        status: 503,
                        reason: format!("cannot save the rollout's state: {e}"),
                    });
                }
            }
        }
        Err(Refused {
            status: 409,
            reason: "the rollout's state kept changing under the command: try again".into(),
        })
    }

    /// `command` on a stored state this gateway's configuration does not fit: an abort
    /// rolls it back ([`Rollout::abort_unfit`]: then it fits every configuration), any
    /// other command is refused (409), naming the skew.
    fn abort_unfit(
        &self,
        command: Command,
        unfit: Stored,
        slot: &mut Option<Rollout>,
    ) -> Result<Transition, Refused> {
        let refused = |reason: String| Refused {
            status: 409,
            reason: format!(
                "this gateway's configuration of the rollout of `{}` does not fit its stored state ({reason}): it takes only an abort; send other commands to a gateway whose configuration fits, or roll the configuration out to every gateway, abort, and start again",
                self.service
            ),
        };
        if command != Command::Abort {
            return Err(refused(
                self.lock_view()
                    .config_skew
                    .as_ref()
                    .map_or_else(String::new, |k| k.reason.clone()),
            ));
        }
        let (rollout, transition) = Rollout::abort_unfit(self.config.clone(), unfit.state, now())
            .map_err(|e| refused(e.to_string()))?;
        *slot = Some(rollout);
        Ok(transition)
    }

    /// The state machine's part of `command`.
    fn apply(&self, command: Command, slot: &mut Option<Rollout>) -> Result<Transition, Refused> {
        let now = now();
        let done = match (command, slot.as_mut()) {
            (Command::Start, None) => {
                let mut rollout = Rollout::new(self.config.clone()).map_err(|e| Refused {
                    status: 500,
                    reason: e.to_string(),
                })?;
                let t = rollout.start(now);
                *slot = Some(rollout);
                t
            }
            (_, None) => {
                return Err(Refused {
                    status: 409,
                    reason: format!(
                        "the rollout of `{}` is pending: start it first (POST /rollouts/{})",
                        self.service, self.service
                    ),
                });
            }
            (Command::Start, Some(r)) => r.start(now),
            (Command::Pause, Some(r)) => r.pause(now),
            (Command::Resume, Some(r)) => r.resume(now),
            (Command::Promote, Some(r)) => r.promote(now),
            (Command::Abort, Some(r)) => r.abort(now),
        };
        done.map_err(|e| Refused {
            status: 409,
            reason: e.to_string(),
        })
    }

    /// One look: this gateway's report to the store; as the leader, every gateway's report
    /// into the test, then the clock; every transition applied and saved.
    ///
    /// Reports that cannot be read are no evidence: the clock still runs, so the rollout
    /// pauses as stale after `stale_ms`. What is in force is what the store accepted: when
    /// the save fails, a rollback is put in force all the same (the safe direction; saved
    /// again at the next looks), and any other transition is dropped, to be derived again
    /// from the same cumulative counts at the next look.
    pub(crate) async fn look(&self) {
        let mut slot = self.rollout.lock().await;
        let unfit = self.lock_unfit().clone();
        if let Some(unfit) = unfit {
            // a skewed gateway does not lead: it reports its evidence and keeps the weight
            self.check_contact(Some(&unfit.state));
            if unfit.state.phase.is_active() {
                self.publish(&self.report(unfit.state.phase)).await;
            }
            return;
        }
        self.check_contact(slot.as_ref().map(Rollout::state));
        #[cfg(feature = "fault-injection")]
        crate::faults::look(&self.service).await;
        if self.lock_view().unsaved {
            self.save_unsaved(&mut slot).await;
        }
        let Some(rollout) = slot.as_mut() else {
            return;
        };
        if !rollout.state().phase.is_active() {
            return;
        }
        let report = self.report(rollout.state().phase);
        if !self.store.is_leader(&self.service) {
            self.publish(&report).await;
            return;
        }
        // the leader reads its own report here; published, it would serve only a next
        // leader while this one lives, and as a follower it publishes at its next look
        let reports = match self.store.reports(&self.service).await {
            Ok(mut reports) => {
                // its own evidence fresh, not as last published
                reports.retain(|r| r.source != report.source);
                reports.push(report);
                reports
            }
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, stale_after = ?self.config.stale_after, "cannot read the gateways' evidence: no evidence this look (the rollout pauses as stale if this lasts)");
                Vec::new()
            }
        };
        let before = rollout.state().clone();
        let now = now();
        let mut transitions = Vec::new();
        transitions.extend(rollout.observe_all(now, &reports));
        transitions.extend(rollout.tick(now));
        if transitions.is_empty()
            && !self
                .lock_cadence()
                .save_due(Instant::now(), self.save_every)
        {
            // nothing transitioned and the state's turn has not come: the evidence is in
            // this gateway's view, and in the store at the next save
            self.put_in_force(rollout.state());
            return;
        }
        match self.save(&mut slot, Fence::Leader).await {
            Save::Won => {
                let Some(rollout) = slot.as_ref() else {
                    return;
                };
                for t in &transitions {
                    self.transitioned(rollout, t);
                }
                if transitions.is_empty() {
                    self.put_in_force(rollout.state());
                }
            }
            // a deposed leader's transitions are dropped for the stored state
            Save::Lost => {}
            Save::Failed if transitions.iter().any(|t| t.to == Phase::RolledBack) => {
                let Some(rollout) = slot.as_ref() else {
                    return;
                };
                tracing::warn!(target: "gray::rollout", service = %self.service, "the rollback is in force on this gateway before the store accepted it: saved again at the next looks");
                self.lock_view().unsaved = true;
                for t in &transitions {
                    self.transitioned(rollout, t);
                }
            }
            Save::Failed => {
                if !transitions.is_empty() {
                    tracing::warn!(target: "gray::rollout", service = %self.service, transitions = transitions.len(), "the transition is not in force: the store did not accept it (derived again at the next look)");
                }
                *slot = Rollout::restore(self.config.clone(), before).ok();
            }
        }
    }

    /// Publishes this gateway's `report` when it is due ([`Cadence::publish_due`]).
    async fn publish(&self, report: &gray_rollout::evidence::Report) {
        let holder = self.store.reports_holder();
        let due =
            self.lock_cadence()
                .publish_due(report, holder, Instant::now(), self.report_every);
        if !due {
            return;
        }
        match self.store.publish_report(&self.service, report).await {
            Ok(()) => self
                .lock_cadence()
                .published(report.clone(), holder, Instant::now()),
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot publish this gateway's evidence");
            }
        }
    }

    /// On the way out, the leader saves the evidence it consumed since its last save (at
    /// most `save_every` of it), so that a restart of every gateway resumes from it; a
    /// bounded try, as a look.
    async fn save_on_stop(&self) {
        let save = async {
            let mut slot = self.rollout.lock().await;
            let active = slot.as_ref().is_some_and(|r| r.state().phase.is_active());
            if active && self.store.is_leader(&self.service) {
                let _ = self.save(&mut slot, Fence::Leader).await;
            }
        };
        if tokio::time::timeout(self.look_bound, save).await.is_err() {
            tracing::warn!(target: "gray::rollout", service = %self.service, "the rollout's state could not be saved on the way out: the next leader resumes from the last save");
        }
    }

    /// Saves a rollback that is in force but that the store did not accept, fenced by the
    /// version only (like an abort: the safe direction, whoever leads now). A newer state
    /// stored meanwhile is adopted instead.
    async fn save_unsaved(&self, slot: &mut Option<Rollout>) {
        if !matches!(self.save(slot, Fence::Any).await, Save::Failed) {
            self.lock_view().unsaved = false;
            tracing::info!(target: "gray::rollout", service = %self.service, "the rollback put in force unsaved is now in the store (or a newer state was adopted)");
        }
    }

    /// The partition rule: cut off from the store for longer than `partition_hold`, 0 on
    /// the rule; in contact again, the stored weight.
    fn check_contact(&self, state: Option<&State>) {
        let last = self.store.contact().last;
        let cut_off = last.is_none_or(|t| t.elapsed() > self.partition_hold);
        if self.cut_off.swap(cut_off, Ordering::Relaxed) == cut_off {
            return;
        }
        if cut_off {
            tracing::warn!(target: "gray::rollout", service = %self.service, hold = ?self.partition_hold, "cut off from the rollouts' store for longer than the partition hold: weight 0 until contact returns");
        } else {
            tracing::info!(target: "gray::rollout", service = %self.service, "in contact with the rollouts' store again: its weight is put back");
        }
        match state {
            Some(state) => self.put_in_force(state),
            None => self.lock_view().cut_off = cut_off,
        }
    }

    /// Takes `stored`, a state another writer saved: its weight on the rule at once, its
    /// last transition in the history.
    fn adopt(&self, slot: &mut Option<Rollout>, stored: Option<Stored>) {
        let Some(stored) = stored else {
            // nothing stored (any more): the next save creates it
            self.lock_view().version = None;
            self.fits_again();
            return;
        };
        match Rollout::restore(self.config.clone(), stored.state.clone()) {
            Ok(theirs) => {
                self.fits_again();
                {
                    let mut view = self.lock_view();
                    let last = &theirs.state().last_transition;
                    if let Some(t) = last.as_ref().filter(|_| *last != view.last_transition) {
                        view.transitions.push_back(t.clone());
                        while view.transitions.len() > self.history {
                            view.transitions.pop_front();
                        }
                    }
                    view.version = Some(stored.version);
                }
                tracing::debug!(target: "gray::rollout", service = %self.service, version = stored.version, "the stored rollout state is adopted");
                self.acknowledge(&theirs);
                self.put_in_force(theirs.state());
                *slot = Some(theirs);
            }
            Err(e) => {
                *slot = None;
                self.unfit(stored, &e);
            }
        }
    }

    /// `stored` does not fit this gateway's configuration ([`Skew`]): its weight in force,
    /// its epoch followed, a WARN (once per skew) naming what differs, and the skew in the
    /// API and the metrics.
    fn unfit(&self, stored: Stored, e: &RestoreError) {
        let state = &stored.state;
        let config = &self.config;
        let ours = format!(
            "steps {:?}, gates {:?}, tolerance {:?}, ratios {:?}, alpha {}",
            config.steps, config.gates, config.tolerance, config.ratios, config.alpha
        );
        let reason = e.to_string();
        let repeated = {
            let mut view = self.lock_view();
            let last = &state.last_transition;
            if let Some(t) = last.as_ref().filter(|_| *last != view.last_transition) {
                view.transitions.push_back(t.clone());
                while view.transitions.len() > self.history {
                    view.transitions.pop_front();
                }
            }
            view.version = Some(stored.version);
            // once per skew, not per save of the fleet's leader
            view.config_skew
                .as_ref()
                .is_some_and(|k| k.reason == reason)
        };
        if !repeated {
            tracing::warn!(target: "gray::rollout", service = %self.service, version = stored.version, stored_phase = %state.phase, stored_weight = state.weight, stored_step = ?state.step, unfit = %e, this_gateway = %ours, "the stored rollout state was written under another configuration of the rollout than this gateway's (a configuration change rolling through the fleet?): this gateway puts the stored weight in force, records evidence for the leader, does not lead, and takes only an abort, until the configurations agree");
        }
        self.acknowledge_state(state);
        // the weight first, then the skew: whoever sees the skew sees the weight in force
        self.put_in_force(state);
        self.lock_view().config_skew = Some(Skew {
            version: stored.version,
            reason,
            config: ours,
            stored_phase: state.phase,
            stored_weight: state.weight,
        });
        *self.lock_unfit() = Some(stored);
    }

    /// The stored state fits again (or is gone): the skew ends.
    fn fits_again(&self) {
        if self.lock_unfit().take().is_some() {
            self.lock_view().config_skew = None;
            tracing::info!(target: "gray::rollout", service = %self.service, "the stored rollout state fits this gateway's configuration again");
        }
    }

    fn lock_unfit(&self) -> std::sync::MutexGuard<'_, Option<Stored>> {
        self.unfit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A state written to the store: adopted if it is newer than this gateway's.
    ///
    /// Versions only grow within one history of the store: a state watched at a version
    /// below the one watched before means the store's history began again (etcd lost its
    /// data, or was replaced: its revisions start again from 1), and what it holds now is
    /// adopted whatever the version this gateway had. A state gone from the store (deleted,
    /// or lost) leaves this gateway's rollout as it is, and the next state written is
    /// adopted whatever its version.
    async fn follow(&self, stored: Option<Stored>) {
        let Some(stored) = stored else {
            self.lock_view().version = None;
            return;
        };
        let before = self.watched.swap(stored.version, Ordering::Relaxed);
        let new_history = stored.version < before;
        let mut slot = self.rollout.lock().await;
        if new_history {
            tracing::warn!(target: "gray::rollout", service = %self.service, version = stored.version, before, "the rollouts' store began a new history (etcd lost its data, or was replaced): its state is adopted as it is now");
        } else if self
            .lock_view()
            .version
            .is_some_and(|v| stored.version <= v)
        {
            return;
        }
        self.adopt(&mut slot, Some(stored));
    }

    /// Everything a transition does but the save.
    fn transitioned(&self, rollout: &Rollout, t: &Transition) {
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

    /// Saves the state; a save that lost adopts what the store has.
    async fn save(&self, slot: &mut Option<Rollout>, fence: Fence) -> Save {
        let Some(rollout) = slot.as_ref() else {
            return Save::Lost;
        };
        let expected = self.lock_view().version;
        match self
            .store
            .save(&self.service, rollout.state(), expected, fence)
            .await
        {
            Ok(Saved::Won(version)) => {
                self.lock_view().version = Some(version);
                self.acknowledge(rollout);
                self.lock_cadence().saved(Some(Instant::now()));
                Save::Won
            }
            Ok(Saved::Lost(current)) => {
                self.adopt(slot, current.map(|c| *c));
                // should it lead again, its first look saves
                self.lock_cadence().saved(None);
                Save::Lost
            }
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot save the rollout's state");
                Save::Failed
            }
        }
    }

    /// A look that did not complete: counted, logged at ERROR, and the state read again
    /// from the store (a look cut short may have left it half-changed), but for a
    /// rollback in force that the store has not accepted yet: that one stays.
    async fn look_failed(&self, panicked: bool, detail: &str) {
        let unsaved = {
            let mut view = self.lock_view();
            if panicked {
                view.look_failures.panic += 1;
            } else {
                view.look_failures.timeout += 1;
            }
            view.unsaved
        };
        let kind = if panicked { "panic" } else { "timeout" };
        if unsaved {
            tracing::error!(target: "gray::rollout", service = %self.service, kind, detail, "a look of the rollout did not complete: the rollback in force (not yet saved) is kept");
            return;
        }
        tracing::error!(target: "gray::rollout", service = %self.service, kind, detail, "a look of the rollout did not complete: its state is read again from the store");
        let mut slot = self.rollout.lock().await;
        match self.store.load(&self.service).await {
            Ok(stored) => {
                self.lock_view().version = None;
                self.adopt(&mut slot, stored);
            }
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot read the rollout's state again after a failed look");
            }
        }
    }

    /// One look, bounded and caught: a look that panics, or takes longer than the look
    /// bound (then cancelled), is [`look_failed`](Self::look_failed); one that completes
    /// tells the store ([`RolloutStore::looked`]), whose leader key goes to another gateway
    /// when this one has not completed a look for a lease TTL.
    async fn guarded_look(&self) {
        use futures_util::FutureExt;
        let look = std::panic::AssertUnwindSafe(self.look()).catch_unwind();
        match tokio::time::timeout(self.look_bound, look).await {
            // a skewed gateway does not confirm its looks: the store's election moves
            // to a gateway whose configuration fits (etcd: within a lease TTL)
            Ok(Ok(())) if self.lock_unfit().is_some() => {}
            Ok(Ok(())) => self.store.looked(&self.service),
            Ok(Err(panic)) => {
                let detail = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                self.look_failed(true, &detail).await;
            }
            Err(_) => {
                let detail = format!("no answer within {:?}", self.look_bound);
                self.look_failed(false, &detail).await;
            }
        }
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

/// What a save did, for the caller.
enum Save {
    /// The store took it.
    Won,
    /// Another writer's state is newer (adopted), or the fence did not hold.
    Lost,
    /// The store did not answer, or failed: nothing is known to be stored.
    Failed,
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
