//! Requests, bad outcomes and latency per lane, recorded on the request path with no lock
//! and no allocation: [`LaneStats`], and [`RecordLanesLayer`], the tower layer that records
//! into it for any HTTP service (feature `tower`).
//!
//! A request's lane is the lane of its [`Stain`](gray_core::Stain) (no stain, or a stain
//! without a lane: `baseline`). The first `max_lanes` lanes seen get series of their own,
//! every later one is counted under `other`, so that the label set stays bounded whatever
//! the traffic. Each series counts requests, bad outcomes (a 5xx status, or an error
//! instead of a response: see [`Outcome::of_status`]) and latencies in a [`Histogram`]
//! (13.5 KiB, allocated when the lane is first seen).
//!
//! [`LaneStats::snapshot`] reads every series at once (for a scrape), and
//! [`LaneSnapshot::buckets`] turns a series' fine histogram into the cumulative counts of a
//! fixed set of Prometheus bucket bounds ([`PROMETHEUS_BOUNDS`], 1 ms … 10 s).
//!
//! ```
//! use std::time::Duration;
//! use gray_core::Lane;
//! use gray_rollout::{Outcome, lanes::LaneStats};
//!
//! let stats = LaneStats::new(1);
//! let gray = Lane::new("gray").unwrap();
//! let blue = Lane::new("blue").unwrap();
//! stats.record(None, Outcome::Ok, Duration::from_millis(3));
//! stats.record(Some(&gray), Outcome::of_status(503), Duration::from_millis(40));
//! // past `max_lanes`: `other`
//! stats.record(Some(&blue), Outcome::Ok, Duration::from_millis(1));
//!
//! let snapshot = stats.snapshot();
//! let gray = snapshot.iter().find(|s| s.lane == "gray").unwrap();
//! assert_eq!((gray.requests, gray.bad, gray.latency.count()), (1, 1, 1));
//! let other = snapshot.iter().find(|s| s.lane == "other").unwrap();
//! assert_eq!(other.requests, 1);
//! // 40 ms is above the 25 ms bound and at most the 50 ms one
//! let buckets = gray.buckets();
//! let below = |le: f64| buckets.iter().find(|(b, _)| *b == le).unwrap().1;
//! assert_eq!((below(0.025), below(0.05)), (0, 1));
//! ```

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use gray_core::Lane;

use crate::{
    Outcome,
    histogram::{Histogram, Snapshot},
};

#[cfg(feature = "tower")]
mod layer;

#[cfg(feature = "tower")]
pub use layer::{RecordLanes, RecordLanesFuture, RecordLanesLayer};

/// The upper bounds, in seconds, of the Prometheus buckets [`LaneSnapshot::buckets`]
/// gives (and `+Inf`).
pub const PROMETHEUS_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

// === impl Outcome ===

impl Outcome {
    /// The outcome of a response with `status`: [`Outcome::Error`] for a 5xx (an upstream's
    /// or a proxy's own 502, 503, 504), else [`Outcome::Ok`].
    #[must_use]
    pub fn of_status(status: u16) -> Outcome {
        if (500..600).contains(&status) {
            Outcome::Error
        } else {
            Outcome::Ok
        }
    }
}

// === impl LaneSeries ===

/// The counters of one lane.
#[derive(Debug, Default)]
pub struct LaneSeries {
    requests: AtomicU64,
    bad: AtomicU64,
    latency: Histogram,
}

impl LaneSeries {
    /// Counts one request: three relaxed atomic additions (four when bad).
    pub fn record(&self, outcome: Outcome, latency: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if outcome == Outcome::Error {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        self.latency.record(latency);
    }

    /// Requests counted.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Bad outcomes counted.
    #[must_use]
    pub fn bad(&self) -> u64 {
        self.bad.load(Ordering::Relaxed)
    }

    /// The latencies.
    #[must_use]
    pub fn latency(&self) -> &Histogram {
        &self.latency
    }
}

// === impl LaneStats ===

/// Where a lane's series is in a [`LaneStats`]: found once per request with
/// [`LaneStats::slot`], used with [`LaneStats::at`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(usize);

const BASELINE: usize = 0;
const OTHER: usize = 1;

/// Requests, bad outcomes and latencies per lane; see the [module docs](self).
#[derive(Debug)]
pub struct LaneStats {
    baseline: LaneSeries,
    other: LaneSeries,
    /// Filled in order, first come first served: a lane is in the first slot that holds it.
    named: Box<[OnceLock<(Lane, LaneSeries)>]>,
}

impl LaneStats {
    /// Empty counters, giving at most `max_lanes` lanes a series of their own (beside
    /// `baseline` and `other`).
    #[must_use]
    pub fn new(max_lanes: usize) -> Self {
        LaneStats {
            baseline: LaneSeries::default(),
            other: LaneSeries::default(),
            named: (0..max_lanes).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The slot of `lane`, taking a free one for a lane not seen before (its histogram is
    /// allocated then). No lock: slots are filled in order, each at most once.
    pub fn slot(&self, lane: Option<&Lane>) -> Slot {
        let Some(lane) = lane else {
            return Slot(BASELINE);
        };
        for (i, cell) in self.named.iter().enumerate() {
            let (held, _) = match cell.get() {
                Some(entry) => entry,
                None => cell.get_or_init(|| (lane.clone(), LaneSeries::default())),
            };
            if held == lane {
                return Slot(i + 2);
            }
        }
        Slot(OTHER)
    }

    /// The series in `slot`.
    #[must_use]
    pub fn at(&self, slot: Slot) -> &LaneSeries {
        match slot.0 {
            BASELINE => &self.baseline,
            OTHER => &self.other,
            i => self
                .named
                .get(i - 2)
                .and_then(OnceLock::get)
                .map_or(&self.other, |(_, series)| series),
        }
    }

    /// Counts one request of `lane`.
    pub fn record(&self, lane: Option<&Lane>, outcome: Outcome, latency: Duration) {
        self.at(self.slot(lane)).record(outcome, latency);
    }

    /// Every series with something counted, `baseline` first, then the lanes in the order
    /// they were first seen, then `other`.
    #[must_use]
    pub fn snapshot(&self) -> Vec<LaneSnapshot> {
        let named = self
            .named
            .iter()
            .filter_map(OnceLock::get)
            .map(|(lane, series)| (lane.as_str(), series));
        std::iter::once(("baseline", &self.baseline))
            .chain(named)
            .chain(std::iter::once(("other", &self.other)))
            .filter(|(_, s)| s.requests() > 0)
            .map(|(lane, s)| LaneSnapshot {
                lane: lane.to_owned(),
                requests: s.requests(),
                bad: s.bad(),
                latency: s.latency().snapshot(),
            })
            .collect()
    }
}

/// One lane's counters at one moment; see [`LaneStats::snapshot`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LaneSnapshot {
    /// The lane's label: its name, `baseline` or `other`.
    pub lane: String,
    /// Requests counted.
    pub requests: u64,
    /// Bad outcomes counted.
    pub bad: u64,
    /// The latencies.
    pub latency: Snapshot,
}

impl LaneSnapshot {
    /// The count of latencies at most each of [`PROMETHEUS_BOUNDS`] (cumulative, rounded
    /// down to the fine histogram's edge below each bound, by less than 6.25 %), then
    /// `(f64::INFINITY, count)`.
    #[must_use]
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        PROMETHEUS_BOUNDS
            .iter()
            .map(|&le| (le, self.latency.count_below(Duration::from_secs_f64(le))))
            .chain(std::iter::once((f64::INFINITY, self.latency.count())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_beyond_the_cap_are_other_and_slots_are_stable() {
        let stats = LaneStats::new(2);
        let lanes: Vec<Lane> = ["a", "b", "c"]
            .iter()
            .map(|l| Lane::new(l).unwrap())
            .collect();
        let slots: Vec<Slot> = lanes.iter().map(|l| stats.slot(Some(l))).collect();
        assert_eq!(slots, [Slot(2), Slot(3), Slot(OTHER)]);
        assert_eq!(stats.slot(Some(&lanes[1])), Slot(3));
        assert_eq!(stats.slot(None), Slot(BASELINE));
        for (i, lane) in lanes.iter().enumerate() {
            for _ in 0..=i {
                stats.record(Some(lane), Outcome::Ok, Duration::from_micros(100));
            }
        }
        stats.record(None, Outcome::of_status(500), Duration::from_secs(20));
        let snapshot = stats.snapshot();
        let labels: Vec<_> = snapshot
            .iter()
            .map(|s| (s.lane.as_str(), s.requests, s.bad))
            .collect();
        assert_eq!(
            labels,
            [
                ("baseline", 1, 1),
                ("a", 1, 0),
                ("b", 2, 0),
                ("other", 3, 0)
            ]
        );
        // 20 s: only in +Inf
        let buckets = snapshot[0].buckets();
        assert_eq!(buckets.len(), PROMETHEUS_BOUNDS.len() + 1);
        assert_eq!(buckets[buckets.len() - 2], (10.0, 0));
        assert_eq!(buckets[buckets.len() - 1], (f64::INFINITY, 1));
    }

    #[test]
    fn only_5xx_is_bad() {
        for (status, outcome) in [(200, Outcome::Ok), (404, Outcome::Ok), (499, Outcome::Ok)] {
            assert_eq!(Outcome::of_status(status), outcome);
        }
        for status in [500, 502, 503, 504, 599] {
            assert_eq!(Outcome::of_status(status), Outcome::Error);
        }
    }

    #[test]
    fn threads_racing_for_slots_give_each_lane_one_series() {
        let stats = std::sync::Arc::new(LaneStats::new(8));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    for i in 0..400 {
                        let lane = Lane::new(format!("l{}", (i + t) % 6)).unwrap();
                        stats.record(Some(&lane), Outcome::Ok, Duration::from_millis(1));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.len(), 6, "{snapshot:?}");
        assert_eq!(snapshot.iter().map(|s| s.requests).sum::<u64>(), 1600);
    }
}
