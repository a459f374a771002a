//! The series of the mirrors: the copies of baseline's requests by outcome, their
//! durations, and the judge's alarm, handed to each mirror as a [`MirrorSeries`].

use std::sync::Arc;

use gray_core::Lane;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, gauge::Gauge, histogram::Histogram},
};

use super::{Metrics, ServiceLane};

/// The labels of `gray_gateway_mirror_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct MirrorLabels {
    service: Arc<str>,
    lane: Arc<str>,
    outcome: &'static str,
}

/// The outcomes of a mirror's copies, as `gray_gateway_mirror_requests_total` names them.
pub(crate) const MIRROR_OUTCOMES: [&str; 11] = [
    "sent",
    "dropped_busy",
    "dropped_body",
    "no_instance",
    "failed",
    "matched",
    "mismatched",
    "unjudged",
    "control_matched",
    "control_mismatched",
    "control_failed",
];

/// The counters of one service's mirror ([`Metrics::mirror`]), one per outcome, made
/// once: counting a copy hashes no label set.
#[derive(Debug, Clone)]
pub(crate) struct MirrorSeries {
    outcomes: [Counter; MIRROR_OUTCOMES.len()],
    /// A copy's time from its send to its answer's head.
    pub(crate) duration: Histogram,
    /// 1 once the mirror's judge alarmed.
    pub(crate) alarm: Gauge,
}

impl MirrorSeries {
    /// Counts a copy's `outcome` (one of [`MIRROR_OUTCOMES`]).
    pub(crate) fn count(&self, outcome: &'static str) {
        if let Some(i) = MIRROR_OUTCOMES.iter().position(|o| *o == outcome) {
            self.outcomes[i].inc();
        }
    }
}

// === impl Metrics ===

impl Metrics {
    /// The counters of the mirror of `service` to `lane`.
    pub(crate) fn mirror(&self, service: &Arc<str>, lane: &Lane) -> MirrorSeries {
        let lane: Arc<str> = lane.as_str().into();
        MirrorSeries {
            duration: self.mirror_durations.get_or_create_owned(&ServiceLane {
                service: service.clone(),
                lane: lane.clone(),
            }),
            alarm: self.mirror_alarms.get_or_create_owned(&ServiceLane {
                service: service.clone(),
                lane: lane.clone(),
            }),
            outcomes: MIRROR_OUTCOMES.map(|outcome| {
                self.mirrors.get_or_create_owned(&MirrorLabels {
                    service: service.clone(),
                    lane: lane.clone(),
                    outcome,
                })
            }),
        }
    }
}
