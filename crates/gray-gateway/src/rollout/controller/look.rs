//! A look, about once an `interval`: this gateway's report to the store; as the leader,
//! every gateway's report into the test, then the clock, every transition saved; a look
//! bounded and caught ([`Controller::guarded_look`]); the partition rule
//! ([`Controller::check_contact`]).

use std::{sync::atomic::Ordering, time::Instant};

use gray_rollout::{Phase, Rollout, State};

use super::{Controller, now, save::Save};
use crate::rollout::store::Fence;

// === impl Controller ===

impl Controller {
    /// One look, bounded and caught: a look that panics, or takes longer than the look
    /// bound (then cancelled), is [`look_failed`](Self::look_failed); one that completes
    /// tells the store ([`RolloutStore::looked`]), whose leader key goes to another gateway
    /// when this one has not completed a look for a lease TTL.
    ///
    /// [`RolloutStore::looked`]: crate::rollout::store::RolloutStore::looked
    pub(super) async fn guarded_look(&self) {
        use futures_util::FutureExt;
        let look = std::panic::AssertUnwindSafe(self.look()).catch_unwind();
        match tokio::time::timeout(self.look_bound, look).await {
            // a skewed gateway does not confirm its looks, and says why: the store's
            // election moves to a gateway whose configuration fits (etcd: at this
            // gateway's next campaign, within a third of a lease TTL)
            Ok(Ok(())) if self.lock_unfit().is_some() => self.store.unfit(&self.service),
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

    /// This gateway's report: its recorder's, with its mirror's judged counts while the
    /// rollout is in its shadow phase.
    fn report(&self, phase: Phase) -> gray_rollout::evidence::Report {
        let report = self.recorder.report();
        match (&self.mirror, phase) {
            (Some(mirror), Phase::Shadow) => report.with_shadow(mirror.counts()),
            _ => report,
        }
    }

    /// Publishes this gateway's `report` when it is due ([`Cadence::publish_due`]).
    ///
    /// [`Cadence::publish_due`]: crate::rollout::cadence::Cadence::publish_due
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
}
