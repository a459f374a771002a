//! What a rollout refuses: a command its phase does not allow, a state that does not fit
//! its configuration.

use std::fmt;

use super::{ConfigError, PauseReason, Phase};

/// A manual command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// [`Rollout::start`](super::Rollout::start).
    Start,
    /// [`Rollout::pause`](super::Rollout::pause).
    Pause,
    /// [`Rollout::resume`](super::Rollout::resume).
    Resume,
    /// [`Rollout::promote`](super::Rollout::promote).
    Promote,
    /// [`Rollout::abort`](super::Rollout::abort).
    Abort,
}

/// A command the rollout's phase does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    pub(super) command: Command,
    pub(super) phase: Phase,
    pub(super) pause: Option<PauseReason>,
}

impl CommandError {
    /// The phase the rollout is in.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.phase
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let command = match self.command {
            Command::Start => "start",
            Command::Pause => "pause",
            Command::Resume => "resume",
            Command::Promote => "promote",
            Command::Abort => "abort",
        };
        write!(f, "cannot {command} the rollout: it is {}", self.phase)?;
        match self.pause {
            Some(PauseReason::Manual) => f.write_str(" (paused by hand)"),
            Some(PauseReason::Gate { step }) => write!(f, " (at the gate of step {step})"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for CommandError {}

/// A state that does not fit its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreError {
    field: String,
    problem: String,
}

impl RestoreError {
    pub(super) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        RestoreError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

impl From<ConfigError> for RestoreError {
    fn from(e: ConfigError) -> Self {
        RestoreError::new(e.field().to_owned(), e.to_string())
    }
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rollout state `{}`: {}", self.field, self.problem)
    }
}

impl std::error::Error for RestoreError {}
