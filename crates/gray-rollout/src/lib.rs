#![doc = include_str!("../docs/rollout.md")]
#![forbid(unsafe_code)]

pub mod evidence;
pub mod histogram;
pub mod kill;
#[cfg(feature = "tower")]
pub mod lanes;
pub mod machine;
mod millis;
pub mod sequential;
pub mod shadow;

pub use evidence::{Arm, Observation, Outcome, Recorder, Report, Stream};
pub use histogram::Histogram;
pub use machine::{Phase, Rollout, RolloutConfig, State, Transition};
pub use sequential::MixtureTest;
