//! The admin API's commands (start, pause, resume, promote, abort) on a rollout: run on
//! the stored state, saved fenced by its version only ([`Fence::Any`]), and tried again on
//! what is stored when another writer saved first.

use gray_rollout::{Rollout, Transition};

use super::{Controller, View, now};
use crate::rollout::store::{Fence, Saved, Stored};

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

// === impl Controller ===

impl Controller {
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
}
