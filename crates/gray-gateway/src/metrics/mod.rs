//! `/metrics`: Prometheus metrics through `prometheus-client`, with bounded label sets.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gray_gateway_requests_total` | counter | `service`, `lane`, `instance`, `status` |
//! | `gray_gateway_fallbacks_total` | counter | `service`, `lane`, `subset` |
//! | `gray_gateway_retries_total` | counter | `service`, `reason`: requests sent again to another instance after a `refused` connection, another `unsent` one, or a `broken` or unresponsive one (idempotent requests) |
//! | `gray_gateway_retries_refused_total` | counter | `service`: retries the retry budget refused |
//! | `gray_gateway_request_duration_seconds` | histogram | `service`, `lane`: from routing to the response head (or the gateway's own answer), 1 ms … 10 s |
//! | `gray_gateway_rollout_transitions_total` | counter | `service`, `from`, `to`, `reason` |
//! | `gray_gateway_rollout_weight` | gauge | `service`: the percentage its rollout puts on its rule |
//! | `gray_gateway_rollout_phase` | gauge | `service`, `phase`: 1 for the rollout's phase |
//! | `gray_gateway_rollout_look_failures_total` | counter | `service`, `kind` (`panic`, `timeout`) |
//! | `gray_gateway_upgraded_opened_total` | counter | `service`, `lane`: upgraded connections (WebSocket) opened |
//! | `gray_gateway_upgraded_open` | gauge | `service`, `lane`: upgraded connections open now |
//! | `gray_gateway_upgraded_closed_total` | counter | `service`, `lane`, `reason` (`peer`, `error`, `idle`, `rollback`, `drain`) |
//! | `gray_gateway_upgraded_bytes_total` | counter | `service`, `lane`, `direction` (`up`: client to instance, `down`) |
//! | `gray_gateway_mirror_requests_total` | counter | `service`, `lane` (the mirror's), `outcome` (`sent`, `dropped_busy`, `dropped_body`, `no_instance`, `failed`, `matched`, `mismatched`, `unjudged`; a control's: `control_matched`, `control_mismatched`, `control_failed`): copies of baseline's requests (see the crate docs, *Mirroring*) |
//! | `gray_gateway_mirror_duration_seconds` | histogram | `service`, `lane`: a copy's time from its send to its answer's head, 1 ms … 10 s |
//! | `gray_gateway_mirror_alarm` | gauge | `service`, `lane`: 1 once the mirror's judge alarmed |
//! | `gray_gateway_rules_generation` | gauge | the generation of the rule set in force |
//! | `gray_gateway_rules_rejected` | gauge | rule-set versions rejected since the start |
//! | `gray_gateway_discovery_connected` | gauge | 1 while discovery's source is reachable and followed |
//! | `gray_gateway_discovery_seconds_since_contact` | gauge | seconds since the source last answered (absent before the first answer) |
//! | `gray_gateway_discovery_revision` | gauge | the etcd revision applied (etcd only) |
//! | `gray_gateway_discovery_info` | info | `source`, `cluster_id` (etcd's, decimal; empty for a file) |
//!
//! Label sets stay bounded whatever the traffic:
//!
//! - `instance` is an instance of the registry, or `-` for answers the gateway made itself
//!   (404, 502, 503, 504). An instance that sent a response head and then failed before
//!   the first byte of its body is counted as a `502` of that instance (the answer the
//!   client got). When an instance leaves the registry its series are removed.
//! - `lane` is `baseline` for unstained requests; the first `metrics_max_lanes` lanes seen
//!   (32 by default) get their own value, every later one is counted as `other`.
//! - `subset` is the kind of fallback subset: `lane`, `baseline` or `all`.
//! - `reason` is `refused`, `unsent` or `broken`.
//! - `status` is an HTTP status code.
//!
//! Counting a request served by an instance takes no lock: each instance keeps the
//! counters it has used in a small copy-on-write list, read with one atomic load.
//!
//! ```
//! use gray_gateway::metrics::Metrics;
//!
//! let metrics = Metrics::new(8);
//! let orders = metrics.endpoint("orders", "orders-1");
//! orders.request(None, 200);
//! let text = metrics.render();
//! assert!(text.contains(r#"gray_gateway_requests_total{service="orders",lane="baseline",instance="orders-1",status="200"} 1"#), "{text}");
//!
//! // The instance leaves the registry: its series go with it.
//! metrics.remove_endpoint("orders", "orders-1");
//! assert!(!metrics.render().contains("orders-1"));
//! ```

mod endpoint;
mod lanes;
mod mirror;
mod scrape;
mod upgrade;

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use gray_core::Lane;
use gray_policy::OwnedSubset;
use prometheus_client::{
    collector::Collector,
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

pub use endpoint::EndpointMetrics;
pub(crate) use mirror::MirrorSeries;
#[cfg(feature = "tls")]
pub(crate) use scrape::gauge;
pub(crate) use scrape::{Freshness, RetryCounts};
pub(crate) use upgrade::UpgradeSeries;

use endpoint::{InstanceKey, InstanceSeries};
use lanes::LaneLabels;
use mirror::MirrorLabels;
use upgrade::UpgradeFamilies;

/// The labels of `gray_gateway_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    service: Arc<str>,
    lane: Arc<str>,
    instance: Arc<str>,
    status: u16,
}

/// The labels of `gray_gateway_fallbacks_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FallbackLabels {
    service: Arc<str>,
    lane: Arc<str>,
    subset: &'static str,
}

/// The labels `service` and `lane` (upgraded connections, mirrors).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServiceLane {
    service: Arc<str>,
    lane: Arc<str>,
}

/// A histogram of durations from 1 ms to about 10 s (14 buckets, doubling).
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The gateway's metrics; see the [module docs](self).
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    fallbacks: Family<FallbackLabels, Counter>,
    lanes: LaneLabels,
    upgrades: UpgradeFamilies,
    mirrors: Family<MirrorLabels, Counter>,
    mirror_durations: Family<ServiceLane, Histogram>,
    mirror_alarms: Family<ServiceLane, Gauge>,
    /// The instances in the registry, by service and instance id.
    instances: Mutex<HashMap<InstanceKey, Arc<InstanceSeries>>>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

// === impl Metrics ===

impl Metrics {
    /// Empty metrics, giving at most `max_lanes` lanes a label value of their own.
    #[must_use]
    pub fn new(max_lanes: usize) -> Arc<Metrics> {
        let requests = Family::<RequestLabels, Counter>::default();
        let fallbacks = Family::<FallbackLabels, Counter>::default();
        let mut registry = Registry::with_prefix("gray_gateway");
        registry.register(
            "requests",
            "Requests answered, by service, lane, instance (- for the gateway's own answers) and status",
            requests.clone(),
        );
        registry.register(
            "fallbacks",
            "Requests served from a fallback subset, by service, lane and kind of subset",
            fallbacks.clone(),
        );
        let upgrades = UpgradeFamilies::default();
        registry.register(
            "upgraded_opened",
            "Upgraded connections (WebSocket) opened, by service and lane",
            upgrades.opened.clone(),
        );
        registry.register(
            "upgraded_open",
            "Upgraded connections open now, by service and lane",
            upgrades.open.clone(),
        );
        registry.register(
            "upgraded_closed",
            "Upgraded connections closed, by service, lane and reason",
            upgrades.closed.clone(),
        );
        registry.register(
            "upgraded_bytes",
            "Bytes through upgraded connections, by service, lane and direction (up: client to instance)",
            upgrades.bytes.clone(),
        );
        let mirrors = Family::<MirrorLabels, Counter>::default();
        registry.register(
            "mirror_requests",
            "Copies of baseline's requests sent to a mirror lane, by service, lane and outcome",
            mirrors.clone(),
        );
        let mirror_durations = Family::<ServiceLane, Histogram>::new_with_constructor(
            duration_histogram as fn() -> Histogram,
        );
        registry.register(
            "mirror_duration_seconds",
            "A copy's time from its send to its answer's head, by service and lane",
            mirror_durations.clone(),
        );
        let mirror_alarms = Family::<ServiceLane, Gauge>::default();
        registry.register(
            "mirror_alarm",
            "1 once a mirror's judge alarmed (its lane answers differently from baseline beyond the noise), by service and lane",
            mirror_alarms.clone(),
        );
        Arc::new(Metrics {
            registry: Mutex::new(registry),
            requests,
            fallbacks,
            upgrades,
            mirrors,
            mirror_durations,
            mirror_alarms,
            lanes: LaneLabels::new(max_lanes),
            instances: Mutex::default(),
        })
    }

    /// How many lanes get a label value of their own.
    #[must_use]
    pub fn max_lanes(&self) -> usize {
        self.lanes.max
    }

    /// Adds metrics computed at each scrape (rules, discovery).
    pub fn register_collector(&self, collector: impl Collector) {
        lock(&self.registry).register_collector(Box::new(collector));
    }

    /// Counts a request the gateway answered itself (no instance served it).
    pub fn answered(&self, service: &Arc<str>, lane: Option<&Lane>, status: u16) {
        let labels = RequestLabels {
            service: service.clone(),
            lane: self.lanes.label(lane),
            instance: Arc::from("-"),
            status,
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts a request served from the fallback `subset`.
    pub fn fallback(&self, service: &Arc<str>, lane: Option<&Lane>, subset: &OwnedSubset) {
        let subset = match subset {
            OwnedSubset::Lane(_) => "lane",
            OwnedSubset::Baseline => "baseline",
            OwnedSubset::Version(_) => "version",
            _ => "all",
        };
        let labels = FallbackLabels {
            service: service.clone(),
            lane: self.lanes.label(lane),
            subset,
        };
        self.fallbacks.get_or_create(&labels).inc();
    }

    /// The metrics in the Prometheus text format (OpenMetrics 1.0).
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &lock(&self.registry))
        {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_removes() {
        let m = Metrics::new(1);
        let svc: Arc<str> = "orders".into();
        let gray = Lane::new("gray").unwrap();
        let blue = Lane::new("blue").unwrap();
        let endpoint = m.endpoint("orders", "o-1");
        endpoint.request(Some(&gray), 200);
        endpoint.request(Some(&gray), 200);
        endpoint.request(None, 200);
        // Past the lane cap: `other`.
        endpoint.request(Some(&blue), 200);
        m.answered(&svc, None, 503);
        m.fallback(&svc, Some(&gray), &OwnedSubset::Baseline);
        let text = m.render();
        for line in [
            r#"gray_gateway_requests_total{service="orders",lane="gray",instance="o-1",status="200"} 2"#,
            r#"gray_gateway_requests_total{service="orders",lane="baseline",instance="o-1",status="200"} 1"#,
            r#"gray_gateway_requests_total{service="orders",lane="other",instance="o-1",status="200"} 1"#,
            r#"gray_gateway_requests_total{service="orders",lane="baseline",instance="-",status="503"} 1"#,
            r#"gray_gateway_fallbacks_total{service="orders",lane="gray",subset="baseline"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }

        // Relabelled: the same series go on.
        let again = m.endpoint("orders", "o-1");
        again.request(Some(&gray), 200);
        assert!(m.render().contains(
            r#"gray_gateway_requests_total{service="orders",lane="gray",instance="o-1",status="200"} 3"#
        ));
        // Gone: every series of the instance goes, and late answers bring none back.
        m.remove_endpoint("orders", "o-1");
        again.request(Some(&gray), 404);
        endpoint.request(Some(&gray), 500);
        let text = m.render();
        assert!(!text.contains("o-1"), "{text}");
        assert!(text.contains(r#"instance="-""#), "{text}");
    }
}
