//! The series of upgraded connections (WebSocket): opened, open now, closed by reason,
//! and their bytes in each direction, handed to each connection as an [`UpgradeSeries`].

use std::sync::Arc;

use gray_core::Lane;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use super::{Metrics, ServiceLane};

/// The labels of `gray_gateway_upgraded_closed_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct UpgradeClosedLabels {
    service: Arc<str>,
    lane: Arc<str>,
    reason: &'static str,
}

/// The labels of `gray_gateway_upgraded_bytes_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct UpgradeBytesLabels {
    service: Arc<str>,
    lane: Arc<str>,
    direction: &'static str,
}

/// The series of upgraded connections.
#[derive(Default)]
pub(super) struct UpgradeFamilies {
    pub(super) opened: Family<ServiceLane, Counter>,
    pub(super) open: Family<ServiceLane, Gauge>,
    pub(super) closed: Family<UpgradeClosedLabels, Counter>,
    pub(super) bytes: Family<UpgradeBytesLabels, Counter>,
}

/// The counters of the upgraded connections of one service and lane
/// ([`Metrics::upgrades`]).
#[derive(Debug, Clone)]
pub(crate) struct UpgradeSeries {
    service: Arc<str>,
    lane: Arc<str>,
    /// Open now.
    pub(crate) open: Gauge,
    /// Bytes from the client to the instance, and back.
    pub(crate) up: Counter,
    pub(crate) down: Counter,
    closed: Family<UpgradeClosedLabels, Counter>,
}

impl UpgradeSeries {
    /// Counts a connection closed for `reason`.
    pub(crate) fn closed(&self, reason: &'static str) {
        self.closed
            .get_or_create(&UpgradeClosedLabels {
                service: self.service.clone(),
                lane: self.lane.clone(),
                reason,
            })
            .inc();
    }
}

// === impl Metrics ===

impl Metrics {
    /// The counters of the upgraded connections of `service` and `lane`, one more of them
    /// counted as opened.
    pub(crate) fn upgrades(&self, service: &Arc<str>, lane: Option<&Lane>) -> UpgradeSeries {
        let lane = self.lanes.label(lane);
        let labels = ServiceLane {
            service: service.clone(),
            lane: lane.clone(),
        };
        self.upgrades.opened.get_or_create(&labels).inc();
        let bytes = |direction| {
            self.upgrades
                .bytes
                .get_or_create_owned(&UpgradeBytesLabels {
                    service: service.clone(),
                    lane: lane.clone(),
                    direction,
                })
        };
        UpgradeSeries {
            open: self.upgrades.open.get_or_create_owned(&labels),
            up: bytes("up"),
            down: bytes("down"),
            service: service.clone(),
            lane,
            closed: self.upgrades.closed.clone(),
        }
    }
}
