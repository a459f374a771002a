//! What a rollout observes, per request and per arm, and the counts it hands to the test.
//!
//! Each request that the rollout's sticky percentage decided (not a tester stained by a
//! header, a cookie or an IP: they are no random sample) becomes an [`Observation`]: its
//! [`Arm`] (`Gray` or `Baseline`), the hash of its sticky key (`user`), its [`Outcome`]
//! (the caller decides what an error is: upstream 5xx, the gateway's own 502/503/504,
//! connect failures, timeouts) and its latency. A [`Recorder`] (one per rollout and
//! process, shared by every request task) turns observations into three streams of *bad
//! events* ([`Stream`]):
//!
//! - `errors`: an error;
//! - `latency_p99`: a latency above the baseline's recent p99;
//! - `latency_p50`: a latency above the baseline's recent p50.
//!
//! The two latency [`Thresholds`] are taken from the baseline's latencies before they are
//! used and **frozen for the epoch** (a period with a constant gray share; a new one starts
//! when the weight changes): the state machine sets them and every recorder follows
//! ([`Recorder::follow`] with an [`EpochSpec`]).
//!
//! **The unit is the user, not the request.** Within a run of the rollout (from its
//! start to its end, across every step), each user counts at most once per stream, in
//! the arm it was in at its first bad event: the recorder keeps a fixed-size set of user
//! hashes per stream ([`Recorder::with_capacity`] users each, 8,192 by default). One
//! heavy user who fails every request thus adds one bad event to each stream, not
//! thousands, and a single event can never roll a rollout back (see
//! [`sequential`](crate::sequential)). A user already counted in baseline who moves to
//! gray when the weight grows does not count again there: gray gets no fresh bad users
//! that baseline cannot have. When a stream's set holds `capacity` users it empties and
//! the stream goes on counting: a user may then count again, once per 8,192 bad users.
//! The moment depends on past counts only, so the test stays valid. The gray users seen
//! per step (for `min_users`) are counted per epoch in the same way.
//!
//! Counts are **cumulative** per (epoch, stream, arm) and serialisable ([`Report`],
//! [`EpochCounts`], [`Counters`]): each process reports its own under its own `source` id,
//! and the leader's [`Rollout`](crate::machine::Rollout) keeps what it consumed per source
//! and feeds the test only the new counts since its last look. Summing processes is
//! therefore exact, and a report that arrives twice counts once.
//!
//! **Users are not summed.** A user an L4 balancer spreads over three gateways is in the
//! sets of all three; summing would count them three times. So each report also carries
//! a [`UserLog`]: the users its recorder counted first, in order, until a saved state
//! acknowledges them ([`Recorder::acknowledge`]). The leader counts a user only when it is
//! new to the union it keeps ([`machine::users`](crate::machine::users)): what one
//! process serving every request would have counted.
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::evidence::{Arm, EpochSpec, Observation, Outcome, Recorder, Thresholds};
//!
//! let recorder = Recorder::new(1); // source id 1
//! let thresholds = Thresholds::new(Duration::from_millis(200), Duration::from_millis(20));
//! recorder.follow(&EpochSpec::new(1).with_run(1).with_thresholds(Some(thresholds)));
//!
//! let ms = Duration::from_millis;
//! // one gray user failing three times, slowly: one bad event in each stream
//! for _ in 0..3 {
//!     recorder.record(&Observation::new(Arm::Gray, 42, Outcome::Error, ms(300)));
//! }
//! // two baseline users, one slower than the p50
//! recorder.record(&Observation::new(Arm::Baseline, 7, Outcome::Ok, ms(10)));
//! recorder.record(&Observation::new(Arm::Baseline, 8, Outcome::Ok, ms(50)));
//!
//! let report = recorder.report();
//! let counts = &report.epochs[0].counters;
//! assert_eq!((counts.requests.gray, counts.errors.gray, counts.gray_users), (3, 3, 1));
//! assert_eq!(counts.bad_users.errors.gray, 1);
//! assert_eq!(counts.bad_users.latency_p99.gray, 1);
//! assert_eq!(counts.bad_users.latency_p50.gray, 1);
//! assert_eq!(counts.bad_users.latency_p50.baseline, 1);
//! assert_eq!(report.epochs[0].baseline_latency.count(), 2);
//! ```

mod log;
mod recorder;
mod userset;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::histogram::Snapshot;

pub use log::UserLog;
pub(crate) use log::{Entry, Kind};
pub use recorder::{DEFAULT_CAPACITY, Recorder};

/// Which side of the rollout served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Arm {
    /// The new version, for the share of users the rollout's percentage puts there.
    Gray,
    /// The current version, for everyone else.
    Baseline,
}

impl Arm {
    pub(crate) fn index(self) -> usize {
        match self {
            Arm::Gray => 0,
            Arm::Baseline => 1,
        }
    }
}

/// How a request ended, as the caller judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// A response the rollout counts as good.
    Ok,
    /// A bad outcome: an upstream 5xx, the gateway's own 502/503/504, a connect failure, a
    /// timeout (the caller decides).
    Error,
}

/// One request of the rollout's population; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observation {
    /// The arm that served it.
    pub arm: Arm,
    /// A 64-bit hash of the request's sticky key (any hash: the recorder mixes it again).
    pub user: u64,
    /// Good or bad.
    pub outcome: Outcome,
    /// From the request to the end of the response (or the failure).
    pub latency: Duration,
}

impl Observation {
    /// An observation.
    #[must_use]
    pub fn new(arm: Arm, user: u64, outcome: Outcome, latency: Duration) -> Self {
        Observation {
            arm,
            user,
            outcome,
            latency,
        }
    }
}

/// A stream of bad events, tested on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Stream {
    /// Errors.
    Errors,
    /// Latencies above the baseline's p99 of the epoch.
    LatencyP99,
    /// Latencies above the baseline's p50 of the epoch.
    LatencyP50,
}

impl Stream {
    /// The three streams, in the order of [`PerStream`].
    pub const ALL: [Stream; 3] = [Stream::Errors, Stream::LatencyP99, Stream::LatencyP50];

    /// `errors`, `latency_p99` or `latency_p50`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Errors => "errors",
            Stream::LatencyP99 => "latency_p99",
            Stream::LatencyP50 => "latency_p50",
        }
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Stream::Errors => 0,
            Stream::LatencyP99 => 1,
            Stream::LatencyP50 => 2,
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One value per stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerStream<T> {
    /// For [`Stream::Errors`].
    pub errors: T,
    /// For [`Stream::LatencyP99`].
    pub latency_p99: T,
    /// For [`Stream::LatencyP50`].
    pub latency_p50: T,
}

impl<T> PerStream<T> {
    /// The value for `stream`.
    pub fn get(&self, stream: Stream) -> &T {
        match stream {
            Stream::Errors => &self.errors,
            Stream::LatencyP99 => &self.latency_p99,
            Stream::LatencyP50 => &self.latency_p50,
        }
    }

    /// The value for `stream`, mutably.
    pub fn get_mut(&mut self, stream: Stream) -> &mut T {
        match stream {
            Stream::Errors => &mut self.errors,
            Stream::LatencyP99 => &mut self.latency_p99,
            Stream::LatencyP50 => &mut self.latency_p50,
        }
    }

    /// Builds one value per stream.
    pub fn from_fn(mut f: impl FnMut(Stream) -> T) -> Self {
        PerStream {
            errors: f(Stream::Errors),
            latency_p99: f(Stream::LatencyP99),
            latency_p50: f(Stream::LatencyP50),
        }
    }
}

/// A count for each arm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    /// Gray's count.
    pub gray: u64,
    /// Baseline's count.
    pub baseline: u64,
}

impl Pair {
    /// A pair.
    #[must_use]
    pub fn new(gray: u64, baseline: u64) -> Self {
        Pair { gray, baseline }
    }

    /// The count of `arm`.
    #[must_use]
    pub fn get(&self, arm: Arm) -> u64 {
        match arm {
            Arm::Gray => self.gray,
            Arm::Baseline => self.baseline,
        }
    }

    fn zip(self, other: Pair, f: impl Fn(u64, u64) -> u64) -> Pair {
        Pair::new(f(self.gray, other.gray), f(self.baseline, other.baseline))
    }
}

impl std::ops::Add for Pair {
    type Output = Pair;

    /// The sum, arm by arm (saturating).
    fn add(self, other: Pair) -> Pair {
        self.zip(other, u64::saturating_add)
    }
}

/// Cumulative counts of one epoch from one source (or summed over sources).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Counters {
    /// Requests per arm.
    pub requests: Pair,
    /// Requests that ended in an error, per arm (requests, not users: the kill switch's
    /// input).
    pub errors: Pair,
    /// Distinct users seen in gray (capped at the recorder's capacity).
    pub gray_users: u64,
    /// Distinct users with a bad event, per stream and arm: the test's input.
    pub bad_users: PerStream<Pair>,
}

impl Counters {
    fn zip(&self, other: &Counters, f: impl Fn(u64, u64) -> u64 + Copy) -> Counters {
        let bad = |s: Stream| self.bad_users.get(s).zip(*other.bad_users.get(s), f);
        Counters {
            requests: self.requests.zip(other.requests, f),
            errors: self.errors.zip(other.errors, f),
            gray_users: f(self.gray_users, other.gray_users),
            bad_users: PerStream::from_fn(bad),
        }
    }

    /// What these counts have beyond `earlier`, field by field (never below 0).
    #[must_use]
    pub fn since(&self, earlier: &Counters) -> Counters {
        self.zip(earlier, u64::saturating_sub)
    }

    /// The field-by-field maximum.
    #[must_use]
    pub fn max(&self, other: &Counters) -> Counters {
        self.zip(other, u64::max)
    }

    /// The field-by-field sum.
    #[must_use]
    pub fn add(&self, other: &Counters) -> Counters {
        self.zip(other, u64::saturating_add)
    }
}

/// The cumulative counts of one epoch from one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EpochCounts {
    /// The epoch they belong to.
    pub epoch: u64,
    /// The counts.
    pub counters: Counters,
    /// The baseline's latencies in this epoch: where the next epoch's thresholds come
    /// from.
    pub baseline_latency: Snapshot,
}

impl EpochCounts {
    /// Counts of `epoch`, with no baseline latencies.
    #[must_use]
    pub fn new(epoch: u64, counters: Counters) -> Self {
        EpochCounts {
            epoch,
            counters,
            baseline_latency: Snapshot::empty(),
        }
    }

    /// With the baseline's latencies of the epoch.
    #[must_use]
    pub fn with_baseline_latency(mut self, latencies: Snapshot) -> Self {
        self.baseline_latency = latencies;
        self
    }
}

/// What one source (a gateway process) reports: the cumulative counts of its current
/// epoch and, after a switch, of the epoch before (whose late requests still count).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Report {
    /// Who reports: unique per recorder (per process start), so that a restarted process
    /// is a new source whose counts start again from 0.
    pub source: u64,
    /// The current epoch first, then the previous one if the recorder knows it.
    pub epochs: Vec<EpochCounts>,
    /// The users this source counted first and no saved state acknowledged yet. With it,
    /// the leader counts distinct users across every source from these entries (the
    /// counters' `gray_users` and `bad_users` are then this source's own view); without
    /// it, the counters are trusted to count distinct users (one source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<UserLog>,
    /// What this source's mirror judged, cumulative, for a rollout in its shadow phase
    /// ([`crate::shadow`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<crate::shadow::ShadowCounts>,
}

impl Report {
    /// A report from `source`, without a user log.
    #[must_use]
    pub fn new(source: u64, epochs: Vec<EpochCounts>) -> Self {
        Report {
            source,
            epochs,
            users: None,
            shadow: None,
        }
    }

    /// With what the source's mirror judged ([`crate::shadow::Judge::counts`]).
    #[must_use]
    pub fn with_shadow(mut self, shadow: crate::shadow::ShadowCounts) -> Self {
        self.shadow = Some(shadow);
        self
    }

    /// With the source's user log.
    #[must_use]
    pub fn with_users(mut self, users: UserLog) -> Self {
        self.users = Some(users);
        self
    }
}

/// The latency thresholds of an epoch: a latency above `p99` is a bad event of
/// `latency_p99`, above `p50` of `latency_p50`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Thresholds {
    /// The baseline's p99, in nanoseconds.
    #[serde(rename = "p99_ns", with = "nanos")]
    pub p99: Duration,
    /// The baseline's p50, in nanoseconds.
    #[serde(rename = "p50_ns", with = "nanos")]
    pub p50: Duration,
}

impl Thresholds {
    /// Thresholds set by hand.
    #[must_use]
    pub fn new(p99: Duration, p50: Duration) -> Self {
        Thresholds { p99, p50 }
    }

    /// The p99 and p50 of `latencies` when they hold at least `min_samples` (and at least
    /// one), else `None`.
    #[must_use]
    pub fn from_latencies(latencies: &Snapshot, min_samples: u64) -> Option<Self> {
        if latencies.count() < min_samples.max(1) {
            return None;
        }
        Some(Thresholds {
            p99: latencies.quantile(0.99)?,
            p50: latencies.quantile(0.5)?,
        })
    }
}

/// What every recorder must follow: the epoch, the run and the thresholds (from the
/// rollout's state, [`State::epoch_spec`](crate::machine::State::epoch_spec)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EpochSpec {
    /// The epoch number.
    pub epoch: u64,
    /// The run: the epoch at which the rollout last started. Users are counted once per
    /// run.
    pub run: u64,
    /// The epoch's latency thresholds; `None` until known (the latency streams count
    /// nothing until then).
    pub thresholds: Option<Thresholds>,
}

impl EpochSpec {
    /// Epoch `epoch` of run 0, with no thresholds yet.
    #[must_use]
    pub fn new(epoch: u64) -> Self {
        EpochSpec {
            epoch,
            run: 0,
            thresholds: None,
        }
    }

    /// Of run `run`.
    #[must_use]
    pub fn with_run(mut self, run: u64) -> Self {
        self.run = run;
        self
    }

    /// With thresholds.
    #[must_use]
    pub fn with_thresholds(mut self, thresholds: Option<Thresholds>) -> Self {
        self.thresholds = thresholds;
        self
    }
}

/// The splitmix64 / murmur3 finaliser: the recorder's own mixing of user hashes.
pub(crate) fn mix(mut z: u64) -> u64 {
    z ^= 0x6772_6179_726f_6c6c; // "grayroll": unrelated to the sticky hash's salt
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

mod nanos {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_nanos)
    }
}
