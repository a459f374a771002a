//! One service's rollout in the gateway: the commands of the admin API, the look about
//! once an `interval` (every gateway's report into [`Rollout::observe`], then
//! [`Rollout::tick`]), and what each transition does: the weight put on the rule at once,
//! the recorder following the new epoch, a log line, the metrics, the history and the
//! store.
//!
//! Who transitions is decided here, not in the store: only the leader
//! ([`RolloutStore::is_leader`]) observes and advances; any gateway may abort. A gateway
//! that does not lead applies the weight of the states others write (the store's watch).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use gray_rollout::{Phase, Recorder, Rollout, RolloutConfig, Transition, machine::EvidenceSummary};
use gray_tower::edge::LiveRules;
use serde::Serialize;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tower::BoxError;

use super::{
    Probe, ServiceEvidence,
    store::{Fence, RolloutStore, Saved},
};

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
    rollout: AsyncMutex<Option<Rollout>>,
    view: Mutex<View>,
}

/// The clock the states are written in: milliseconds since the Unix epoch, so that a
/// restarted gateway reads the times it wrote.
fn now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
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
        history: usize,
    ) -> Result<Arc<Controller>, BoxError> {
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
        };
        let controller = Arc::new(Controller {
            service: service.to_owned(),
            rules,
            evidence,
            recorder: Arc::new(Recorder::new(source)),
            store,
            history,
            rollout: AsyncMutex::new(None),
            view: Mutex::new(view),
            config,
        });
        if let Some(stored) = stored {
            let rollout = Rollout::restore(controller.config.clone(), stored.state)
                .map_err(|e| format!("rollout of `{service}`: its saved state does not fit its configuration: {e}"))?;
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
            controller.put_in_force(&rollout);
            *controller.rollout.lock().await = Some(rollout);
        }
        Ok(controller)
    }

    fn lock_view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the admin API shows.
    pub(crate) fn view(&self) -> View {
        let mut view = self.lock_view().clone();
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

    /// Puts `rollout`'s weight on the rule (but for a rollout never started), records
    /// evidence while it is active, and has the recorder follow its epoch.
    fn put_in_force(&self, rollout: &Rollout) {
        let state = rollout.state();
        if state.phase != Phase::Pending {
            if let Err(e) = self.rules.override_percent(&self.config.rule, state.weight) {
                tracing::error!(target: "gray::rollout", service = %self.service, rule = %self.config.rule, error = %e, "cannot put the rollout's weight on its rule");
            }
        }
        self.recorder.follow(&rollout.epoch_spec());
        let probe = state.phase.is_active().then(|| {
            Arc::new(Probe {
                recorder: self.recorder.clone(),
                rule: self.config.rule.as_str().into(),
                rules: self.rules.clone(),
            })
        });
        self.evidence.set_probe(probe);
        let mut view = self.lock_view();
        view.phase = state.phase;
        view.pause_reason = state.pause;
        view.weight = state.weight;
        view.step = state.step;
        view.evidence = Some(state.evidence.summary());
        view.last_transition = state.last_transition.clone();
    }

    /// Runs `command`.
    pub(crate) async fn command(&self, command: Command) -> Result<View, Refused> {
        let mut slot = self.rollout.lock().await;
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
        let transition = done.map_err(|e| Refused {
            status: 409,
            reason: e.to_string(),
        })?;
        let fence = if command == Command::Abort {
            Fence::Any
        } else {
            Fence::Leader
        };
        if let Some(rollout) = slot.as_mut() {
            self.transitioned(rollout, &transition);
            self.save(rollout, fence).await;
        }
        drop(slot);
        Ok(self.view())
    }

    /// One look: this gateway's report to the store; as the leader, every gateway's report
    /// into the test, then the clock; every transition applied and saved.
    pub(crate) async fn look(&self) {
        let mut slot = self.rollout.lock().await;
        let Some(rollout) = slot.as_mut() else {
            return;
        };
        if !rollout.state().phase.is_active() {
            return;
        }
        let report = self.recorder.report();
        if let Err(e) = self.store.publish_report(&self.service, &report).await {
            tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot publish this gateway's evidence");
        }
        if !self.store.is_leader(&self.service) {
            return;
        }
        let reports = match self.store.reports(&self.service).await {
            Ok(reports) => reports,
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot read the gateways' evidence");
                return;
            }
        };
        let now = now();
        let mut transitions = Vec::new();
        for report in &reports {
            transitions.extend(rollout.observe(now, report));
        }
        transitions.extend(rollout.tick(now));
        for t in &transitions {
            self.transitioned(rollout, t);
        }
        if transitions.is_empty() {
            self.put_in_force(rollout);
        }
        self.save(rollout, Fence::Leader).await;
    }

    /// Everything a transition does but the save.
    fn transitioned(&self, rollout: &Rollout, t: &Transition) {
        self.put_in_force(rollout);
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
    async fn save(&self, rollout: &mut Rollout, fence: Fence) {
        let expected = self.lock_view().version;
        match self
            .store
            .save(&self.service, rollout.state(), expected, fence)
            .await
        {
            Ok(Saved::Won(version)) => self.lock_view().version = Some(version),
            Ok(Saved::Lost(current)) => {
                let Some(current) = current.map(|c| *c) else {
                    self.lock_view().version = None;
                    return;
                };
                match Rollout::restore(self.config.clone(), current.state) {
                    Ok(theirs) => {
                        tracing::info!(target: "gray::rollout", service = %self.service, version = current.version, "another writer saved the rollout first: its state is adopted");
                        *rollout = theirs;
                        self.put_in_force(rollout);
                        self.lock_view().version = Some(current.version);
                    }
                    Err(e) => {
                        tracing::error!(target: "gray::rollout", service = %self.service, error = %e, "the stored rollout state does not fit the configuration");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(target: "gray::rollout", service = %self.service, error = %e, "cannot save the rollout's state");
            }
        }
    }

    /// Looks every `interval` until `stopped`.
    pub(crate) async fn run(
        self: Arc<Self>,
        interval: Duration,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.look().await,
                () = crate::serve::until_stopped(&mut stopped) => return,
            }
        }
    }
}
