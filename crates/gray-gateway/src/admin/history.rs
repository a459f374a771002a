//! The short history the admin page draws, and `GET /services/history` and
//! `GET /rollouts/{service}/history` serve: one point a second over the last
//! [`WINDOW`] points.
//!
//! - Per service and lane: requests and errors (5xx, and the gateway's own failures) per
//!   second, and the p50 and p99 latency of that second, from the counters every request
//!   already updates (the lane series of `gray_gateway_request_duration_seconds`): the
//!   request path does nothing more for it.
//! - Per rollout: its phase and weight, ln M of each of its test's streams and of the
//!   shadow judge's two, and their alarm lines.
//!
//! A sampler task takes a point each second, off the request path. The points are kept in
//! fixed rings: 24 bytes a point, so 14 KiB per service and lane (at most
//! `metrics_max_lanes` + 2 lanes per service), plus the 3.4 KiB of the latency counts it
//! subtracts from; 40 bytes a point per rollout, 23 KiB. A gateway with 10 services of
//! 3 lanes and 2 rollouts keeps about 0.6 MiB.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use gray_rollout::{Phase, histogram::Snapshot};
use serde_json::{Value, json};

use super::Admin;

/// How many points each ring keeps: ten minutes at one a second.
pub(crate) const WINDOW: usize = 600;

/// How often the sampler takes a point.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// One second of one lane.
#[derive(Debug, Clone, Copy)]
struct LanePoint {
    /// Unix time, in milliseconds.
    at_ms: u64,
    requests_per_s: f32,
    errors_per_s: f32,
    /// NaN: no request in the second.
    p50_ms: f32,
    p99_ms: f32,
}

/// One second of one rollout.
#[derive(Debug, Clone, Copy)]
struct RolloutPoint {
    at_ms: u64,
    phase: Phase,
    weight: f32,
    /// ln M of the errors, latency_p99 and latency_p50 streams, then the shadow's mismatch
    /// and slow streams; NaN when the rollout has no such evidence at that moment.
    log_m: [f32; 5],
}

/// The names of [`RolloutPoint::log_m`]'s streams, in order.
const STREAMS: [&str; 5] = [
    "errors",
    "latency_p99",
    "latency_p50",
    "shadow_mismatch",
    "shadow_slow",
];

/// A ring of at most [`WINDOW`] points, oldest first.
#[derive(Debug)]
struct Ring<T>(VecDeque<T>);

impl<T> Ring<T> {
    fn new() -> Self {
        Ring(VecDeque::with_capacity(WINDOW))
    }

    fn push(&mut self, point: T) {
        if self.0.len() == WINDOW {
            self.0.pop_front();
        }
        self.0.push_back(point);
    }
}

/// One lane's ring, and the counts its next point is taken from.
#[derive(Debug)]
struct LaneRing {
    last: (u64, u64, Snapshot, u64),
    points: Ring<LanePoint>,
}

/// One rollout's ring, and its alarm lines as last seen.
#[derive(Debug)]
struct RolloutRing {
    points: Ring<RolloutPoint>,
    alarm_at: Option<f64>,
    shadow_alarm_at: Option<f64>,
}

/// The history; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By service, then lane.
    lanes: BTreeMap<String, BTreeMap<String, LaneRing>>,
    rollouts: BTreeMap<String, RolloutRing>,
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Option<Duration>) -> f32 {
    d.map_or(f32::NAN, |d| d.as_secs_f32() * 1000.0)
}

/// `value` for JSON: `null` for NaN.
fn num(value: f32) -> Value {
    if value.is_finite() {
        // rounded to what a chart shows, so that the document stays short
        json!((f64::from(value) * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

fn seconds(at_ms: u64) -> Value {
    json!(at_ms as f64 / 1000.0)
}

// === impl History ===

impl History {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a point of every service's lanes and every rollout, as of `at`.
    pub(crate) fn sample(&self, admin: &Admin, at: SystemTime) {
        let at_ms = unix_ms(at);
        // read everything first: the lock is held only to push
        let lanes: Vec<(String, Vec<gray_rollout::lanes::LaneSnapshot>)> = admin
            .routes
            .services
            .iter()
            .map(|(name, upstream)| (name.to_string(), upstream.evidence.lanes.snapshot()))
            .collect();
        let rollouts: Vec<(String, crate::rollout::View)> = admin
            .rollouts
            .0
            .iter()
            .map(|(name, c)| (name.clone(), c.view()))
            .collect();
        let mut inner = self.lock();
        for (service, snapshots) in lanes {
            let rings = inner.lanes.entry(service).or_default();
            for lane in snapshots {
                let now = (lane.requests, lane.bad, lane.latency, at_ms);
                let Some(ring) = rings.get_mut(&lane.lane) else {
                    // its first point is the next one: a rate needs two readings
                    rings.insert(
                        lane.lane,
                        LaneRing {
                            last: now,
                            points: Ring::new(),
                        },
                    );
                    continue;
                };
                let (requests, bad, latency, then) = &ring.last;
                let span = (at_ms.saturating_sub(*then) as f32 / 1000.0).max(0.001);
                let second = now.2.since(latency);
                ring.points.push(LanePoint {
                    at_ms,
                    requests_per_s: now.0.saturating_sub(*requests) as f32 / span,
                    errors_per_s: now.1.saturating_sub(*bad) as f32 / span,
                    p50_ms: ms(second.quantile(0.5)),
                    p99_ms: ms(second.quantile(0.99)),
                });
                ring.last = now;
            }
        }
        for (service, view) in rollouts {
            let ring = inner
                .rollouts
                .entry(service)
                .or_insert_with(|| RolloutRing {
                    points: Ring::new(),
                    alarm_at: None,
                    shadow_alarm_at: None,
                });
            let mut log_m = [f32::NAN; 5];
            if let Some(evidence) = &view.evidence {
                for (i, stream) in gray_rollout::Stream::ALL.into_iter().enumerate() {
                    let summary = evidence.streams.get(stream);
                    log_m[i] = summary.log_m as f32;
                    ring.alarm_at = Some(summary.alarm_at);
                }
            }
            if let Some(shadow) = &view.shadow {
                log_m[3] = shadow.mismatch_log_m as f32;
                log_m[4] = shadow.slow_log_m as f32;
                ring.shadow_alarm_at = Some(shadow.alarm_at);
            }
            ring.points.push(RolloutPoint {
                at_ms,
                phase: view.phase,
                weight: view.weight as f32,
                log_m,
            });
        }
    }

    /// `GET /services/history`: every service's lanes, as columns (`t` in Unix seconds).
    pub(crate) fn services(&self) -> Value {
        let inner = self.lock();
        let services: serde_json::Map<String, Value> = inner
            .lanes
            .iter()
            .map(|(service, lanes)| {
                let lanes: serde_json::Map<String, Value> = lanes
                    .iter()
                    .map(|(lane, ring)| {
                        let p = &ring.points.0;
                        (
                            lane.clone(),
                            json!({
                                "t": p.iter().map(|p| seconds(p.at_ms)).collect::<Vec<_>>(),
                                "requests_per_s": p.iter().map(|p| num(p.requests_per_s)).collect::<Vec<_>>(),
                                "errors_per_s": p.iter().map(|p| num(p.errors_per_s)).collect::<Vec<_>>(),
                                "p50_ms": p.iter().map(|p| num(p.p50_ms)).collect::<Vec<_>>(),
                                "p99_ms": p.iter().map(|p| num(p.p99_ms)).collect::<Vec<_>>(),
                            }),
                        )
                    })
                    .collect();
                (service.clone(), Value::Object(lanes))
            })
            .collect();
        json!({
            "interval_ms": INTERVAL.as_millis() as u64,
            "window": WINDOW,
            "services": services,
        })
    }

    /// `GET /rollouts/{service}/history`: the rollout's points as columns, `None` before
    /// its first.
    pub(crate) fn rollout(&self, service: &str) -> Option<Value> {
        let inner = self.lock();
        let ring = inner.rollouts.get(service)?;
        let p = &ring.points.0;
        let log_m: serde_json::Map<String, Value> = STREAMS
            .iter()
            .enumerate()
            .map(|(i, name)| {
                (
                    (*name).to_owned(),
                    p.iter().map(|p| num(p.log_m[i])).collect(),
                )
            })
            .collect();
        Some(json!({
            "service": service,
            "interval_ms": INTERVAL.as_millis() as u64,
            "window": WINDOW,
            "t": p.iter().map(|p| seconds(p.at_ms)).collect::<Vec<_>>(),
            "phase": p.iter().map(|p| serde_json::to_value(p.phase).unwrap_or(Value::Null)).collect::<Vec<_>>(),
            "weight": p.iter().map(|p| num(p.weight)).collect::<Vec<_>>(),
            "log_m": log_m,
            "alarm_at": {"rollout": ring.alarm_at, "shadow": ring.shadow_alarm_at},
        }))
    }
}

/// Takes a point every [`INTERVAL`] until `stopped`.
pub(crate) async fn run(
    history: Arc<History>,
    admin: Admin,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => history.sample(&admin, SystemTime::now()),
            () = crate::serve::until_stopped(&mut stopped) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_latest_window() {
        let mut ring = Ring::new();
        for i in 0..WINDOW + 10 {
            ring.push(i);
        }
        assert_eq!(ring.0.len(), WINDOW);
        assert_eq!(ring.0.front(), Some(&10));
        assert_eq!(ring.0.back(), Some(&(WINDOW + 9)));
    }

    #[test]
    fn sizes_are_what_the_docs_say() {
        assert_eq!(std::mem::size_of::<LanePoint>(), 24);
        assert_eq!(std::mem::size_of::<RolloutPoint>(), 40);
        assert_eq!(num(f32::NAN), Value::Null);
        assert_eq!(num(1.5), json!(1.5));
    }
}
