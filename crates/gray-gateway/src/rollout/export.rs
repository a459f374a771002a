//! `gray_gateway_request_duration_seconds{service,lane}`, read from each service's
//! [`LaneStats`](gray_rollout::lanes::LaneStats) at each scrape.

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet},
    metrics::MetricType,
};

use super::ServiceEvidence;

/// The latency histograms of every service, by lane.
pub(crate) struct LaneDurations(pub(crate) Vec<(String, Arc<ServiceEvidence>)>);

impl fmt::Debug for LaneDurations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaneDurations")
            .field("services", &self.0.len())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LaneLabels {
    service: String,
    lane: String,
}

impl Collector for LaneDurations {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let mut family = encoder.encode_descriptor(
            "request_duration_seconds",
            "Time from routing a request to its response head (or the gateway's own answer), by service and lane",
            None,
            MetricType::Histogram,
        )?;
        for (service, evidence) in &self.0 {
            for lane in evidence.lanes.snapshot() {
                // The encoder adds the buckets up itself: per-bucket counts.
                let mut below = 0;
                let buckets: Vec<(f64, u64)> = lane
                    .buckets()
                    .into_iter()
                    .map(|(le, cumulative)| {
                        let n = cumulative.saturating_sub(below);
                        below = cumulative;
                        (le, n)
                    })
                    .collect();
                let labels = LaneLabels {
                    service: service.clone(),
                    lane: lane.lane.clone(),
                };
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(
                        lane.latency.sum().as_secs_f64(),
                        lane.latency.count(),
                        &buckets,
                        None,
                    )?;
            }
        }
        Ok(())
    }
}
