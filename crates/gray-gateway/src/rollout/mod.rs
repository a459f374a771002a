//! Evidence per lane, and the rollouts the gateway runs.
//!
//! - [`evidence`]: what the proxy records for each request (its lane's counters and
//!   latencies, and the observations of a running rollout's population);
//! - [`export`]: `gray_gateway_request_duration_seconds{service,lane}`.

mod evidence;
mod export;

pub(crate) use evidence::{Probe, ServiceEvidence, Timing};
pub(crate) use export::LaneDurations;
