//! The per-process recorder of a rollout's observations.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::log::{Entry, Kind, Ring};
use super::userset::{Insert, UserSet};
use super::{
    Arm, Counters, EpochCounts, EpochSpec, Observation, Outcome, Pair, PerStream, Report, Stream,
    Thresholds, mix,
};
use crate::histogram::{Histogram, Snapshot};

/// The default number of distinct users each set holds.
pub const DEFAULT_CAPACITY: usize = 8_192;

const GRAY: usize = 0;
const BASELINE: usize = 1;
const NO_THRESHOLD: u64 = u64::MAX;

/// Records a rollout's observations, from any number of threads at once, into latency
/// histograms per arm and user-level evidence per epoch; see the
/// [module docs](super).
///
/// [`record`](Self::record) takes no lock and allocates nothing: a histogram record, a
/// few relaxed atomic loads, and for a gray request or a bad event a probe of a user set
/// (one compare-exchange the first time a user is seen). Memory is fixed at construction:
/// 4 user sets (gray users seen in the epoch; bad users of each stream in the run) of
/// 2 × capacity words each, 512 KiB at the default capacity, the log of first-counted
/// users ([`UserLog`](super::UserLog)) of 4 × capacity words, 256 KiB, and two
/// histograms of 13.5 KiB.
///
/// [`follow`](Self::follow) and [`report`](Self::report) are the control side, called
/// from a background task: they take a mutex that `record` never touches.
pub struct Recorder {
    source: u64,
    capacity: u64,
    hot: Hot,
    latency: [Histogram; 2],
    slots: [Slot; 2],
    seen: UserSet,
    bad: [UserSet; 3],
    log: Ring,
    control: Mutex<Control>,
}

/// What every record reads: the epoch, its thresholds, and the generation of each
/// stream's user sets.
struct Hot {
    epoch: AtomicU64,
    p99_ns: AtomicU64,
    p50_ns: AtomicU64,
    /// Per stream: the tag of its set's current generation. A new run, or the set
    /// filling up, starts a new generation (the set empties).
    generation: [AtomicU64; 3],
    /// Per stream: users in the current generation.
    in_generation: [AtomicU64; 3],
}

/// The counters of one epoch; two of them, by epoch parity, so that the late records of
/// the previous epoch land in its own slot.
struct Slot {
    epoch: AtomicU64,
    errors: [AtomicU64; 2],
    gray_users: AtomicU64,
    bad: [[AtomicU64; 2]; 3],
}

/// The control side's view: where the current epoch started, and the epoch before.
struct Control {
    epoch: u64,
    run: u64,
    thresholds: Option<Thresholds>,
    /// Gray requests and baseline latencies when the current epoch started.
    start_gray: u64,
    start_baseline: Snapshot,
    previous: Option<Frozen>,
}

/// The previous epoch as it stood when it ended.
struct Frozen {
    epoch: u64,
    requests: Pair,
    counters: Counters,
    baseline_latency: Snapshot,
}

// === impl Recorder ===

impl Recorder {
    /// A recorder for `source` (unique per process start, e.g.
    /// `gray_core::rand::random_u64()`), at epoch 0 of run 0 with no thresholds, holding
    /// [`DEFAULT_CAPACITY`] users per set.
    #[must_use]
    pub fn new(source: u64) -> Self {
        Recorder::with_capacity(source, DEFAULT_CAPACITY)
    }

    /// A recorder whose user sets hold `capacity` users each (at least 1).
    #[must_use]
    pub fn with_capacity(source: u64, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let set = || UserSet::new(capacity);
        let zero = || AtomicU64::new(0);
        Recorder {
            source,
            capacity: capacity as u64,
            hot: Hot {
                epoch: zero(),
                p99_ns: AtomicU64::new(NO_THRESHOLD),
                p50_ns: AtomicU64::new(NO_THRESHOLD),
                generation: [zero(), zero(), zero()],
                in_generation: [zero(), zero(), zero()],
            },
            latency: [Histogram::new(), Histogram::new()],
            slots: [Slot::new(0), Slot::new(1)],
            seen: set(),
            bad: [set(), set(), set()],
            log: Ring::new(capacity.saturating_mul(4)),
            control: Mutex::new(Control {
                epoch: 0,
                run: 0,
                thresholds: None,
                start_gray: 0,
                start_baseline: Snapshot::empty(),
                previous: None,
            }),
        }
    }

    /// The source id this recorder reports under.
    pub fn source(&self) -> u64 {
        self.source
    }

    /// The cumulative latency histogram of `arm` (every request recorded, all epochs): the
    /// series `gray_gateway_request_duration_seconds{lane=…}` can export.
    pub fn latency(&self, arm: Arm) -> &Histogram {
        &self.latency[arm.index()]
    }

    /// Counts one request: no lock, no allocation.
    pub fn record(&self, obs: &Observation) {
        let ns = u64::try_from(obs.latency.as_nanos()).unwrap_or(u64::MAX);
        let arm = obs.arm.index();
        self.latency[arm].record_ns(ns);

        let epoch = self.hot.epoch.load(Ordering::Acquire);
        let slot = &self.slots[(epoch & 1) as usize];
        let user = mix(obs.user);
        if arm == GRAY
            && slot.gray_users.load(Ordering::Relaxed) < self.capacity
            && self.seen.insert(user, epoch as u16) == Insert::New
        {
            slot.gray_users.fetch_add(1, Ordering::Relaxed);
            self.log.push(Entry::new(Kind::Gray, epoch, user));
        }
        let bad = |stream| self.count_bad(slot, epoch, stream, obs.arm, user);
        if obs.outcome == Outcome::Error {
            slot.errors[arm].fetch_add(1, Ordering::Relaxed);
            bad(Stream::Errors);
        }
        if ns > self.hot.p50_ns.load(Ordering::Relaxed) {
            bad(Stream::LatencyP50);
            if ns > self.hot.p99_ns.load(Ordering::Relaxed) {
                bad(Stream::LatencyP99);
            }
        }
    }

    fn count_bad(&self, slot: &Slot, epoch: u64, stream: Stream, arm: Arm, user: u64) {
        let s = stream.index();
        let generation = self.hot.generation[s].load(Ordering::Acquire);
        match self.bad[s].insert(user, generation as u16) {
            Insert::Present => {}
            Insert::New => {
                slot.bad[s][arm.index()].fetch_add(1, Ordering::Relaxed);
                self.log
                    .push(Entry::new(Kind::Bad(stream, arm), epoch, user));
                let n = self.hot.in_generation[s].fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.capacity {
                    self.next_generation(s, generation);
                }
            }
            Insert::Full => self.next_generation(s, generation),
        }
    }

    /// Empties stream `s`'s set (of generation `from`), decided by past counts only.
    fn next_generation(&self, s: usize, from: u64) {
        let g = &self.hot.generation[s];
        if g.compare_exchange(from, from + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.hot.in_generation[s].store(0, Ordering::Relaxed);
        }
    }

    /// Follows the rollout's epoch, run and thresholds (idempotent: call it whenever the
    /// state may have changed). A new epoch number freezes the current epoch's counts
    /// (reported as the previous epoch, with any late records added) and counts the
    /// epoch's gray users from zero; a new run also empties every set of bad users; the
    /// same numbers with new thresholds only change them.
    pub fn follow(&self, spec: &EpochSpec) {
        let mut control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        if spec.run != control.run {
            control.run = spec.run;
            for s in 0..3 {
                let from = self.hot.generation[s].load(Ordering::Acquire);
                self.next_generation(s, from);
            }
        }
        if spec.epoch != control.epoch {
            let gray = self.latency[GRAY].count();
            let baseline = self.latency[BASELINE].snapshot();
            let slot = &self.slots[(control.epoch & 1) as usize];
            control.previous = Some(Frozen {
                epoch: control.epoch,
                requests: Pair::new(
                    gray.saturating_sub(control.start_gray),
                    baseline
                        .count()
                        .saturating_sub(control.start_baseline.count()),
                ),
                counters: slot.counters(),
                baseline_latency: baseline.since(&control.start_baseline),
            });
            self.slots[(spec.epoch & 1) as usize].reset(spec.epoch);
            control.epoch = spec.epoch;
            control.start_gray = gray;
            control.start_baseline = baseline;
        }
        control.thresholds = spec.thresholds;
        let (p99, p50) = spec.thresholds.map_or((NO_THRESHOLD, NO_THRESHOLD), |t| {
            let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            (ns(t.p99), ns(t.p50))
        });
        self.hot.p99_ns.store(p99, Ordering::Relaxed);
        self.hot.p50_ns.store(p50, Ordering::Relaxed);
        self.hot.epoch.store(spec.epoch, Ordering::Release);
    }

    /// The epoch, run and thresholds this recorder follows.
    pub fn spec(&self) -> EpochSpec {
        let control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        EpochSpec::new(control.epoch)
            .with_run(control.run)
            .with_thresholds(control.thresholds)
    }

    /// Forgets the log's entries below `position`: what a *saved* state says the leader
    /// consumed of this source ([`State::users`](crate::machine::State::users),
    /// [`Users::cursor`](crate::machine::Users::cursor)). Call it with every state read
    /// from, or accepted by, the store; never with a state the store has not accepted, or
    /// a new leader restoring the last saved one would not find those entries again.
    pub fn acknowledge(&self, position: u64) {
        let _control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        self.log.acknowledge(position);
    }

    /// The cumulative counts of the current epoch and of the previous one, and the users
    /// this recorder counted first that no saved state acknowledged yet: what this
    /// process sends to the leader.
    pub fn report(&self) -> Report {
        let control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let gray = self.latency[GRAY].count();
        let baseline = self.latency[BASELINE].snapshot();
        let slot = &self.slots[(control.epoch & 1) as usize];
        let mut counters = slot.counters();
        counters.requests = Pair::new(
            gray.saturating_sub(control.start_gray),
            baseline
                .count()
                .saturating_sub(control.start_baseline.count()),
        );
        let mut epochs = vec![EpochCounts {
            epoch: control.epoch,
            counters,
            baseline_latency: baseline.since(&control.start_baseline),
        }];
        if let Some(prev) = &control.previous {
            let mut counters = prev.counters;
            // late records of the previous epoch, while its slot is still its own
            let slot = &self.slots[(prev.epoch & 1) as usize];
            if prev.epoch & 1 != control.epoch & 1
                && slot.epoch.load(Ordering::Relaxed) == prev.epoch
            {
                counters = counters.max(&slot.counters());
            }
            counters.requests = prev.requests;
            epochs.push(EpochCounts {
                epoch: prev.epoch,
                counters,
                baseline_latency: prev.baseline_latency.clone(),
            });
        }
        Report::new(self.source, epochs).with_users(self.log.read())
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("source", &self.source)
            .field("capacity", &self.capacity)
            .field("epoch", &self.hot.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

// === impl Slot ===

impl Slot {
    fn new(epoch: u64) -> Self {
        let zero = || AtomicU64::new(0);
        Slot {
            epoch: AtomicU64::new(epoch),
            errors: [zero(), zero()],
            gray_users: zero(),
            bad: [[zero(), zero()], [zero(), zero()], [zero(), zero()]],
        }
    }

    fn reset(&self, epoch: u64) {
        let counters = self.errors.iter().chain([&self.gray_users]);
        for c in counters.chain(self.bad.iter().flatten()) {
            c.store(0, Ordering::Relaxed);
        }
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    fn counters(&self) -> Counters {
        let pair = |a: &[AtomicU64; 2]| {
            Pair::new(
                a[GRAY].load(Ordering::Relaxed),
                a[BASELINE].load(Ordering::Relaxed),
            )
        };
        Counters {
            requests: Pair::default(),
            errors: pair(&self.errors),
            gray_users: self.gray_users.load(Ordering::Relaxed),
            bad_users: PerStream::from_fn(|s| pair(&self.bad[s.index()])),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn obs(arm: Arm, user: u64, outcome: Outcome, ms: u64) -> Observation {
        Observation::new(arm, user, outcome, MS(ms))
    }

    fn spec(epoch: u64) -> EpochSpec {
        EpochSpec::new(epoch)
            .with_run(1)
            .with_thresholds(Some(Thresholds::new(MS(100), MS(10))))
    }

    #[test]
    fn a_user_counts_once_per_stream_in_a_run() {
        let r = Recorder::new(9);
        r.follow(&spec(1));
        for _ in 0..1000 {
            r.record(&obs(Arm::Gray, 1, Outcome::Error, 500));
        }
        r.record(&obs(Arm::Gray, 2, Outcome::Ok, 5));
        let report = r.report();
        assert_eq!(report.source, 9);
        let c = report.epochs[0].counters;
        assert_eq!(c.requests, Pair::new(1001, 0));
        assert_eq!(c.errors, Pair::new(1000, 0));
        assert_eq!(c.gray_users, 2);
        for s in Stream::ALL {
            assert_eq!(*c.bad_users.get(s), Pair::new(1, 0), "{s}");
        }
        // the next epoch of the run counts the epoch's gray users again, not the bad
        // ones; it reports the epoch before
        r.follow(&spec(2));
        r.record(&obs(Arm::Gray, 1, Outcome::Error, 500));
        let report = r.report();
        assert_eq!(report.epochs.len(), 2);
        assert_eq!((report.epochs[0].epoch, report.epochs[1].epoch), (2, 1));
        let now = report.epochs[0].counters;
        assert_eq!(
            (now.requests, now.errors, now.gray_users),
            (Pair::new(1, 0), Pair::new(1, 0), 1)
        );
        assert_eq!(now.bad_users, PerStream::default());
        assert_eq!(report.epochs[1].counters, c);
        // a new run counts him again
        r.follow(&spec(3).with_run(3));
        r.record(&obs(Arm::Gray, 1, Outcome::Error, 500));
        let now = r.report().epochs[0].counters;
        assert_eq!(now.bad_users.errors, Pair::new(1, 0));
        assert_eq!(now.bad_users.latency_p99, Pair::new(1, 0));
    }

    #[test]
    fn latency_streams_wait_for_thresholds() {
        let r = Recorder::new(1);
        r.record(&obs(Arm::Baseline, 1, Outcome::Ok, 5_000));
        assert_eq!(
            r.report().epochs[0].counters.bad_users,
            PerStream::default()
        );
        // thresholds set within the epoch: same epoch, counting from then on
        r.follow(&spec(0));
        r.record(&obs(Arm::Baseline, 1, Outcome::Ok, 5_000));
        r.record(&obs(Arm::Baseline, 2, Outcome::Ok, 50));
        let report = r.report();
        assert_eq!(report.epochs.len(), 1);
        let c = report.epochs[0].counters;
        assert_eq!(c.bad_users.latency_p99, Pair::new(0, 1));
        assert_eq!(c.bad_users.latency_p50, Pair::new(0, 2));
        assert_eq!(c.requests.baseline, 3);
        assert_eq!(report.epochs[0].baseline_latency.count(), 3);
    }

    #[test]
    fn a_user_counts_once_whatever_the_arm() {
        // a baseline user counted, then moved to gray by a larger weight: not again
        let r = Recorder::new(1);
        r.follow(&spec(1));
        r.record(&obs(Arm::Baseline, 7, Outcome::Error, 1));
        r.follow(&spec(2));
        r.record(&obs(Arm::Gray, 7, Outcome::Error, 1));
        let report = r.report();
        assert_eq!(report.epochs[0].counters.bad_users.errors, Pair::default());
        assert_eq!(report.epochs[1].counters.bad_users.errors, Pair::new(0, 1));
    }

    #[test]
    fn a_full_set_empties() {
        let r = Recorder::with_capacity(1, 4);
        r.follow(&spec(1));
        r.record(&obs(Arm::Gray, 100, Outcome::Error, 1));
        for user in 0..3 {
            r.record(&obs(Arm::Baseline, user, Outcome::Error, 1));
        }
        // the set reached 4 users: it starts empty again, so the users already counted
        // count once more
        r.record(&obs(Arm::Gray, 100, Outcome::Error, 1));
        r.record(&obs(Arm::Baseline, 0, Outcome::Error, 1));
        r.record(&obs(Arm::Baseline, 0, Outcome::Error, 1));
        let c = r.report().epochs[0].counters;
        assert_eq!(c.bad_users.errors, Pair::new(2, 4));
        assert_eq!(c.errors, Pair::new(2, 5));
        // the other streams are untouched
        assert_eq!(c.bad_users.latency_p50, Pair::default());
    }

    #[test]
    fn concurrent_records_sum_exactly() {
        let r = Arc::new(Recorder::new(1));
        r.follow(&spec(3));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        // 1000 users, every one of them in all four threads
                        let arm = if i % 10 == 0 {
                            Arm::Gray
                        } else {
                            Arm::Baseline
                        };
                        let outcome = if i % 7 == t {
                            Outcome::Error
                        } else {
                            Outcome::Ok
                        };
                        r.record(&obs(arm, i % 1000, outcome, i % 200));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let c = r.report().epochs[0].counters;
        assert_eq!(c.requests.gray + c.requests.baseline, 80_000);
        assert_eq!(c.requests.gray, 8_000);
        assert_eq!(c.gray_users, 100);
        // users with i % 1000 ≡ u: gray when u % 10 == 0; every user has some error
        assert_eq!(c.bad_users.errors, Pair::new(100, 900));
        // latency i % 200 > 100 ms: users u with u % 200 > 100
        let slow: Vec<u64> = (0..1000).filter(|u| u % 200 > 100).collect();
        let slow_gray = slow.iter().filter(|u| *u % 10 == 0).count() as u64;
        assert_eq!(
            c.bad_users.latency_p99,
            Pair::new(slow_gray, slow.len() as u64 - slow_gray)
        );
        assert_eq!(r.latency(Arm::Gray).count(), 8_000);
    }

    #[test]
    fn late_records_of_the_previous_epoch_still_count_there() {
        let r = Recorder::new(1);
        r.follow(&spec(4));
        r.record(&obs(Arm::Gray, 1, Outcome::Error, 1));
        r.follow(&spec(5));
        // a request that read epoch 4 before the switch, recorded after it
        let slot = &r.slots[0];
        assert_eq!(slot.epoch.load(Ordering::Relaxed), 4);
        slot.bad[0][GRAY].fetch_add(1, Ordering::Relaxed);
        let report = r.report();
        assert_eq!(report.epochs[1].epoch, 4);
        assert_eq!(report.epochs[1].counters.bad_users.errors.gray, 2);
        assert_eq!(report.epochs[0].counters.bad_users.errors.gray, 0);
    }
}
