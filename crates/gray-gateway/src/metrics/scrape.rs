//! Metrics made at each scrape: the freshness of the rules and of discovery
//! ([`Freshness`]), the retries read from the balancers ([`RetryCounts`]), and [`gauge`],
//! with which a collector writes one gauge.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge, info::Info},
};

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
