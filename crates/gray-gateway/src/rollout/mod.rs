//! Rollouts: the gateway steps a service's sticky-percentage rule through its steps,
//! judges gray against baseline on the requests it routes, and rolls a bad gray back by
//! itself (issue 20; the statistics are [`gray_rollout`]'s).
//!
//! - the evidence: for every request, its lane's counters and latencies
//!   (`gray_gateway_request_duration_seconds{service,lane}`), and, while a rollout runs,
//!   an [`Observation`](gray_rollout::Observation) for each request of the rollout's
//!   population (the users the percentage put in gray, and those it kept in baseline);
//! - a controller per configured rollout: the admin API's commands, a look every
//!   `[rollouts] interval_ms`, every transition applied to the rule at once, logged,
//!   counted and kept with its evidence;
//! - [`store`]: where the state lives. [`store::FileStore`] keeps one gateway's rollouts in
//!   local files; `etcd::EtcdStore` (feature `etcd`, used with an `[etcd]` table) keeps
//!   them in etcd, shared by several gateways: one leads, every gateway reports its counts
//!   and applies the stored weight, a gateway cut off drops its weight to 0 after
//!   `[rollouts] partition_hold_ms`. Both implement [`store::RolloutStore`].
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gray_gateway_request_duration_seconds` | histogram | `service`, `lane` |
//! | `gray_gateway_rollout_transitions_total` | counter | `service`, `from`, `to`, `reason` |
//! | `gray_gateway_rollout_weight` | gauge | `service`: the percentage in force |
//! | `gray_gateway_rollout_phase` | gauge | `service`, `phase`: 1 for the phase the rollout is in |
//! | `gray_gateway_rollout_look_failures_total` | counter | `service`, `kind` (`panic`, `timeout`): looks that did not complete |
//! | `gray_gateway_rollout_config_skew` | gauge | `service`: 1 while the stored state does not fit this gateway's configuration of the rollout |

mod admin;
mod cadence;
mod controller;
#[cfg(feature = "etcd")]
pub mod etcd;
mod evidence;
mod export;
pub mod store;

use std::{collections::BTreeMap, fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

pub(crate) use admin::router;
pub(crate) use controller::{Command, Controller, Refused, Traffic, View};
pub(crate) use evidence::{Population, ServiceEvidence, Timing};
pub(crate) use export::LaneDurations;

/// Every configured rollout, by service.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rollouts(pub(crate) Arc<BTreeMap<String, Arc<Controller>>>);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TransitionLabels {
    service: String,
    from: &'static str,
    to: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FailureLabels {
    service: String,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    service: String,
    phase: &'static str,
}

const PHASES: [gray_rollout::Phase; 6] = [
    gray_rollout::Phase::Pending,
    gray_rollout::Phase::Shadow,
    gray_rollout::Phase::Step,
    gray_rollout::Phase::Paused,
    gray_rollout::Phase::Promoted,
    gray_rollout::Phase::RolledBack,
];

impl Collector for Rollouts {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let views: Vec<View> = self.0.values().map(|c| c.view()).collect();
        let mut transitions = encoder.encode_descriptor(
            "rollout_transitions",
            "Rollout transitions since the gateway started, by service, phases and reason",
            None,
            MetricType::Counter,
        )?;
        for v in &views {
            for ((from, to, reason), n) in &v.counts {
                let labels = TransitionLabels {
                    service: v.service.clone(),
                    from,
                    to,
                    reason,
                };
                ConstCounter::new(*n).encode(transitions.encode_family(&labels)?)?;
            }
        }
        service_gauge(
            &mut encoder,
            &views,
            "rollout_weight",
            "The percentage a service's rollout puts on its rule",
            |v| v.weight,
        )?;
        let mut phase = encoder.encode_descriptor(
            "rollout_phase",
            "1 for the phase a service's rollout is in, else 0",
            None,
            MetricType::Gauge,
        )?;
        for v in &views {
            for p in PHASES {
                let labels = PhaseLabels {
                    service: v.service.clone(),
                    phase: p.as_str(),
                };
                ConstGauge::new(i64::from(v.phase == p)).encode(phase.encode_family(&labels)?)?;
            }
        }
        service_gauge(
            &mut encoder,
            &views,
            "rollout_config_skew",
            "1 while the stored state of a service's rollout does not fit this gateway's configuration of it, else 0",
            |v| i64::from(v.config_skew.is_some()),
        )?;
        let mut failures = encoder.encode_descriptor(
            "rollout_look_failures",
            "Looks of a service's rollout that did not complete, by why (panic, timeout)",
            None,
            MetricType::Counter,
        )?;
        for v in &views {
            for (kind, n) in [
                ("panic", v.look_failures.panic),
                ("timeout", v.look_failures.timeout),
            ] {
                let labels = FailureLabels {
                    service: v.service.clone(),
                    kind,
                };
                ConstCounter::new(n).encode(failures.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// A gauge `name` of one value per service, `value` of its view.
fn service_gauge<N>(
    encoder: &mut DescriptorEncoder<'_>,
    views: &[View],
    name: &str,
    help: &str,
    value: impl Fn(&View) -> N,
) -> fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    let mut gauge = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for v in views {
        let labels = ServiceLabel {
            service: v.service.clone(),
        };
        ConstGauge::new(value(v)).encode(gauge.encode_family(&labels)?)?;
    }
    Ok(())
}
