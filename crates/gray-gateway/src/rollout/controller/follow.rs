//! The states others write to the store: followed through its watch, adopted when
//! newer, and a stored state this gateway's configuration does not fit kept as a
//! [`Skew`].

use std::sync::atomic::Ordering;

use gray_rollout::{Rollout, machine::RestoreError};

use super::{Controller, Skew};
use crate::rollout::store::Stored;

// === impl Controller ===

impl Controller {
    /// A state written to the store: adopted if it is newer than this gateway's.
    ///
    /// Versions only grow within one history of the store: a state watched at a version
    /// below the one watched before means the store's history began again (etcd lost its
    /// data, or was replaced: its revisions start again from 1), and what it holds now is
    /// adopted whatever the version this gateway had. A state gone from the store (deleted,
    /// or lost) leaves this gateway's rollout as it is, and the next state written is
    /// adopted whatever its version.
    pub(super) async fn follow(&self, stored: Option<Stored>) {
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

    /// Takes `stored`, a state another writer saved: its weight on the rule at once, its
    /// last transition in the history.
    pub(super) fn adopt(&self, slot: &mut Option<Rollout>, stored: Option<Stored>) {
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
    pub(super) fn unfit(&self, stored: Stored, e: &RestoreError) {
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
        // then the store: it gives up this gateway's leadership, and takes none
        self.store.unfit(&self.service);
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
    pub(super) fn fits_again(&self) {
        if self.lock_unfit().take().is_some() {
            self.lock_view().config_skew = None;
            tracing::info!(target: "gray::rollout", service = %self.service, "the stored rollout state fits this gateway's configuration again");
        }
    }

    pub(super) fn lock_unfit(&self) -> std::sync::MutexGuard<'_, Option<Stored>> {
        self.unfit.lock().unwrap_or_else(|p| p.into_inner())
    }
}
