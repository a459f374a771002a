//! The saves of the state: the leader's on a transition or when
//! [`cadence`](super::super::cadence) says so (a save that lost adopts what the store
//! has), a rollback in force that the store has not accepted yet, and the evidence on the
//! way out.

use std::time::Instant;

use gray_rollout::Rollout;

use super::Controller;
use crate::rollout::store::{Fence, Saved};

/// What a save did, for the caller.
pub(super) enum Save {
    /// The store took it.
    Won,
    /// Another writer's state is newer (adopted), or the fence did not hold.
    Lost,
    /// The store did not answer, or failed: nothing is known to be stored.
    Failed,
}

// === impl Controller ===

impl Controller {
    /// Saves the state; a save that lost adopts what the store has.
    pub(super) async fn save(&self, slot: &mut Option<Rollout>, fence: Fence) -> Save {
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

    /// Saves a rollback that is in force but that the store did not accept, fenced by the
    /// version only (like an abort: the safe direction, whoever leads now). A newer state
    /// stored meanwhile is adopted instead.
    pub(super) async fn save_unsaved(&self, slot: &mut Option<Rollout>) {
        if !matches!(self.save(slot, Fence::Any).await, Save::Failed) {
            self.lock_view().unsaved = false;
            tracing::info!(target: "gray::rollout", service = %self.service, "the rollback put in force unsaved is now in the store (or a newer state was adopted)");
        }
    }

    /// On the way out, the leader saves the evidence it consumed since its last save (at
    /// most `save_every` of it), so that a restart of every gateway resumes from it; a
    /// bounded try, as a look.
    pub(super) async fn save_on_stop(&self) {
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
}
