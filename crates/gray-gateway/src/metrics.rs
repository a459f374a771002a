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

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
};

use arc_swap::ArcSwap;
use gray_core::Lane;
use gray_policy::OwnedSubset;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::Registry,
};

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

/// The labels of `gray_gateway_upgraded_closed_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UpgradeClosedLabels {
    service: Arc<str>,
    lane: Arc<str>,
    reason: &'static str,
}

/// The labels of `gray_gateway_upgraded_bytes_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UpgradeBytesLabels {
    service: Arc<str>,
    lane: Arc<str>,
    direction: &'static str,
}

/// The labels of `gray_gateway_mirror_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MirrorLabels {
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

/// The series of upgraded connections.
#[derive(Default)]
struct UpgradeFamilies {
    opened: Family<ServiceLane, Counter>,
    open: Family<ServiceLane, Gauge>,
    closed: Family<UpgradeClosedLabels, Counter>,
    bytes: Family<UpgradeBytesLabels, Counter>,
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

/// A histogram of durations from 1 ms to about 10 s (14 buckets, doubling).
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// An instance, by service and id.
type InstanceKey = (Arc<str>, Arc<str>);

/// The most `(lane, status)` counters an endpoint keeps at hand; more are found through
/// the family (a read lock).
const ENDPOINT_CACHE: usize = 64;

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

    /// The counters of `instance` of `service`, registered so that
    /// [`remove_endpoint`](Self::remove_endpoint) removes their series. An instance put again
    /// (relabelled) keeps its series.
    pub fn endpoint(self: &Arc<Self>, service: &str, instance: &str) -> Arc<EndpointMetrics> {
        let key: InstanceKey = (service.into(), instance.into());
        let series = lock(&self.instances)
            .entry(key.clone())
            .or_default()
            .clone();
        Arc::new(EndpointMetrics {
            service: key.0,
            instance: key.1,
            cache: ArcSwap::default(),
            series,
            metrics: self.clone(),
        })
    }

    /// `instance` left `service`: its series are removed, and the counters of its
    /// endpoints count no more.
    pub fn remove_endpoint(&self, service: &str, instance: &str) {
        let key: InstanceKey = (service.into(), instance.into());
        let Some(series) = lock(&self.instances).remove(&key) else {
            return;
        };
        let mut created = lock(&series.created);
        series.removed.store(true, Ordering::Release);
        for labels in created.drain() {
            self.requests.remove(&labels);
        }
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

// === impl EndpointMetrics ===

/// The counters of one instance; see [`Metrics::endpoint`].
pub struct EndpointMetrics {
    service: Arc<str>,
    instance: Arc<str>,
    /// The counters used so far, by lane and status.
    cache: ArcSwap<Vec<(Option<Lane>, u16, Counter)>>,
    series: Arc<InstanceSeries>,
    metrics: Arc<Metrics>,
}

/// The series of one instance, shared by its endpoints (one per version of its labels).
#[derive(Default)]
struct InstanceSeries {
    /// The label sets created in the family.
    created: Mutex<HashSet<RequestLabels>>,
    /// The instance left the registry.
    removed: AtomicBool,
}

impl fmt::Debug for EndpointMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointMetrics")
            .field("service", &self.service)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl EndpointMetrics {
    /// Counts one response with `status` to a request of `lane`.
    pub fn request(&self, lane: Option<&Lane>, status: u16) {
        if let Some((_, _, counter)) = self
            .cache
            .load()
            .iter()
            .find(|(l, s, _)| *s == status && l.as_ref() == lane)
        {
            counter.inc();
            return;
        }
        self.miss(lane, status);
    }

    #[cold]
    fn miss(&self, lane: Option<&Lane>, status: u16) {
        let labels = RequestLabels {
            service: self.service.clone(),
            lane: self.metrics.lanes.label(lane),
            instance: self.instance.clone(),
            status,
        };
        let counter = {
            let mut created = lock(&self.series.created);
            // Gone from the registry: its series are not brought back.
            if self.series.removed.load(Ordering::Acquire) {
                return;
            }
            created.insert(labels.clone());
            self.metrics.requests.get_or_create_owned(&labels)
        };
        counter.inc();
        if self.cache.load().len() < ENDPOINT_CACHE {
            self.cache.rcu(|cache| {
                let mut cache = Vec::clone(cache);
                cache.push((lane.cloned(), status, counter.clone()));
                cache
            });
        }
    }
}

// === impl LaneLabels ===

/// The lane label values: the first `max` lanes seen each get their own, later ones
/// `other`.
struct LaneLabels {
    max: usize,
    baseline: Arc<str>,
    other: Arc<str>,
    known: Mutex<Vec<(Lane, Arc<str>)>>,
}

impl LaneLabels {
    fn new(max: usize) -> Self {
        LaneLabels {
            max,
            baseline: Arc::from("baseline"),
            other: Arc::from("other"),
            known: Mutex::default(),
        }
    }

    fn label(&self, lane: Option<&Lane>) -> Arc<str> {
        let Some(lane) = lane else {
            return self.baseline.clone();
        };
        let mut known = lock(&self.known);
        if let Some((_, label)) = known.iter().find(|(l, _)| l == lane) {
            return label.clone();
        }
        if known.len() >= self.max {
            return self.other.clone();
        }
        let label: Arc<str> = Arc::from(lane.as_str());
        known.push((lane.clone(), label.clone()));
        label
    }
}

// === Metrics made at each scrape ===

/// The freshness of the rules and of discovery, read at each scrape.
pub(crate) struct Freshness {
    pub(crate) rules: gray_tower::edge::LiveRules,
    pub(crate) registry: gray_discovery::Registry,
}

impl fmt::Debug for Freshness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Freshness").finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DiscoveryLabels {
    source: String,
    cluster_id: String,
}

pub(crate) fn gauge<
    N: prometheus_client::encoding::EncodeGaugeValue + fmt::Debug + Send + Sync + 'static,
>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: N,
) -> fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for Freshness {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let rules = self.rules.status();
        gauge(
            &mut encoder,
            "rules_generation",
            "Generation of the staining rule set in force",
            rules.generation as i64,
        )?;
        gauge(
            &mut encoder,
            "rules_rejected",
            "Rule-set versions rejected since the start (the previous one stayed in force)",
            rules.rejected as i64,
        )?;
        let status = self.registry.status();
        gauge(
            &mut encoder,
            "discovery_connected",
            "Whether the discovery source is reachable and followed now",
            i64::from(status.connected),
        )?;
        if let Some(since) = status.since_last_contact() {
            gauge(
                &mut encoder,
                "discovery_seconds_since_contact",
                "Seconds since the discovery source last answered",
                since.as_secs_f64(),
            )?;
        }
        if let Some(revision) = status.revision {
            gauge(
                &mut encoder,
                "discovery_revision",
                "The etcd revision discovery has applied",
                revision,
            )?;
        }
        let info = Info::new(DiscoveryLabels {
            source: self.registry.source().to_owned(),
            cluster_id: status
                .cluster_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
        });
        info.encode(encoder.encode_descriptor(
            "discovery",
            "What discovery follows: its source and the etcd cluster ID",
            None,
            info.metric_type(),
        )?)
    }
}

// === Retries, read from the balancers at each scrape ===

/// The retries of each service, read from its balancer at each scrape.
pub(crate) struct RetryCounts(
    pub(crate)  Vec<(
        String,
        Box<dyn Fn() -> gray_balance::retry::RetryStats + Send + Sync>,
    )>,
);

impl fmt::Debug for RetryCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryCounts")
            .field("services", &self.0.len())
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RetryLabels {
    service: String,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

impl Collector for RetryCounts {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let stats: Vec<_> = self.0.iter().map(|(name, read)| (name, read())).collect();
        let mut family = encoder.encode_descriptor(
            "retries",
            "Requests sent again to another instance, by service and reason",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (service, s) in &stats {
            for (reason, n) in [
                ("refused", s.refused),
                ("unsent", s.unsent),
                ("broken", s.broken),
            ] {
                let labels = RetryLabels {
                    service: service.to_string(),
                    reason,
                };
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut refused = encoder.encode_descriptor(
            "retries_refused",
            "Retries the retry budget refused, by service",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (service, s) in &stats {
            ConstCounter::new(s.budget_exhausted).encode(refused.encode_family(
                &ServiceLabel {
                    service: service.to_string(),
                },
            )?)?;
        }
        Ok(())
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
