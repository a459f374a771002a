//! A fixed-bucket latency histogram: lock-free recording, mergeable snapshots, quantiles,
//! and bucket bounds for a Prometheus histogram.
//!
//! The buckets are log-linear over nanoseconds: every power of two from 2¹⁰ ns (≈ 1 µs)
//! to 2³⁶ ns (≈ 68.7 s) is cut into 16 equal buckets, so a bucket is at most 1/16 = 6.25 %
//! as wide as its lower edge. One bucket below (`[0, 1024 ns)`) and one above
//! (`[2³⁶ ns, ∞)`) close the range: [`BUCKETS`] = 418 buckets in all, the same for every
//! histogram, so any two snapshots add up bucket by bucket.
//!
//! [`Histogram::record`] is two relaxed atomic additions (the bucket and the sum) on a
//! fixed array allocated once: no lock and no allocation per record. Threads record into
//! one of four copies of the array, so that two threads rarely contend for a cache line;
//! a snapshot adds the copies up. A [`Snapshot`] reads
//! the counts; snapshots [`merge`](Snapshot::merge) (one gateway's counts with another's),
//! subtract ([`since`](Snapshot::since): the latencies of a window), estimate
//! [`quantile`](Snapshot::quantile)s, and list their cumulative counts per upper bound
//! ([`cumulative`](Snapshot::cumulative)) for `gray_gateway_request_duration_seconds`.
//! A snapshot serialises sparsely (only the buckets that hold something).
//!
//! ```
//! use std::time::Duration;
//! use gray_rollout::histogram::Histogram;
//!
//! let h = Histogram::new();
//! for ms in 1..=100 {
//!     h.record(Duration::from_millis(ms));
//! }
//! let snap = h.snapshot();
//! assert_eq!(snap.count(), 100);
//! let p99 = snap.quantile(0.99).unwrap();
//! // within one bucket (6.25 %) of the exact 99 ms
//! assert!((p99.as_secs_f64() - 0.099).abs() <= 0.099 / 16.0, "{p99:?}");
//!
//! let mut both = snap.clone();
//! both.merge(&snap);
//! assert_eq!(both.count(), 200);
//! assert_eq!(both.since(&snap), snap);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// log₂ of the sub-buckets per power of two: 16 of them, a relative width of at most 6.25 %.
const SUB_BITS: u32 = 4;
const SUBS: usize = 1 << SUB_BITS;
/// The lowest power of two with sub-buckets: 2¹⁰ ns = 1.024 µs.
const MIN_EXP: u32 = 10;
/// Values from 2³⁶ ns = 68.7 s up fall in the overflow bucket.
const MAX_EXP: u32 = 36;

/// The number of buckets of every histogram: one below 1.024 µs, 16 per power of two up
/// to 68.7 s, one above.
pub const BUCKETS: usize = 1 + (MAX_EXP - MIN_EXP) as usize * SUBS + 1;

/// The bucket of a latency in nanoseconds.
fn bucket_of(ns: u64) -> usize {
    if ns < 1 << MIN_EXP {
        return 0;
    }
    let exp = 63 - ns.leading_zeros();
    if exp >= MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = ((ns >> (exp - SUB_BITS)) as usize) & (SUBS - 1);
    1 + (exp - MIN_EXP) as usize * SUBS + sub
}

/// The lower edge of bucket `index`, in nanoseconds.
fn lower_ns(index: usize) -> u64 {
    match index {
        0 => 0,
        i if i >= BUCKETS - 1 => 1 << MAX_EXP,
        i => {
            let exp = MIN_EXP + ((i - 1) / SUBS) as u32;
            let sub = ((i - 1) % SUBS) as u64;
            (SUBS as u64 + sub) << (exp - SUB_BITS)
        }
    }
}

/// The exclusive upper edge of bucket `index` (`None`: the overflow bucket, +∞).
///
/// A latency `d` falls in bucket `i` when `lower(i) ≤ d < upper(i)` (in whole
/// nanoseconds). Exported as a Prometheus `le` (which is inclusive), an edge is off by one
/// nanosecond.
#[must_use]
pub fn upper_bound(index: usize) -> Option<Duration> {
    (index < BUCKETS - 1).then(|| Duration::from_nanos(lower_ns(index + 1)))
}

/// The upper edges of all buckets in order, the last one `None` (+∞): the `le` labels of
/// a Prometheus histogram (see [`upper_bound`]).
pub fn upper_bounds() -> impl Iterator<Item = Option<Duration>> {
    (0..BUCKETS).map(upper_bound)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// === impl Histogram ===

/// How many copies of the counters a histogram keeps: threads record into their own
/// (assigned round-robin on first use), so that two threads seldom write the same cache
/// line.
const SHARDS: usize = 4;

/// One copy of the counters, on cache lines of its own.
#[repr(align(128))]
struct Shard {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

thread_local! {
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

/// A latency histogram that any number of threads record into at once; see the
/// [module docs](self).
pub struct Histogram {
    shards: Box<[Shard]>,
}

impl Histogram {
    /// An empty histogram: one allocation of 4 × [`BUCKETS`] counters (13.5 KiB).
    #[must_use]
    pub fn new() -> Self {
        Histogram {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    counts: std::array::from_fn(|_| AtomicU64::new(0)),
                    sum_ns: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// Counts one latency: two relaxed atomic additions to the calling thread's copy of
    /// the counters, no lock, no allocation.
    pub fn record(&self, latency: Duration) {
        let ns = nanos(latency);
        self.record_ns(ns);
    }

    pub(crate) fn record_ns(&self, ns: u64) {
        let shard = &self.shards[SHARD.with(|s| *s)];
        shard.counts[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        shard.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts so far. Records that run concurrently may or may not be included, each
    /// one wholly in its bucket (the sum may be a record ahead or behind the buckets).
    #[must_use]
    pub fn snapshot(&self) -> Snapshot {
        let mut counts = vec![0u64; BUCKETS];
        let mut sum_ns = 0u64;
        for shard in self.shards.iter() {
            for (c, a) in counts.iter_mut().zip(&shard.counts) {
                *c = c.wrapping_add(a.load(Ordering::Relaxed));
            }
            sum_ns = sum_ns.wrapping_add(shard.sum_ns.load(Ordering::Relaxed));
        }
        Snapshot { counts, sum_ns }
    }

    /// The number of latencies recorded so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        let counts = self.shards.iter().flat_map(|s| s.counts.iter());
        counts.map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

// === impl Snapshot ===

/// The counts of a [`Histogram`] at one moment, or the sum or difference of such counts.
///
/// Serialises as `{"sum_ns": …, "buckets": [[index, count], …]}` with only the buckets
/// that hold something. An empty snapshot allocates nothing.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "SparseSnapshot", into = "SparseSnapshot")]
pub struct Snapshot {
    /// Empty (all zero) or [`BUCKETS`] long.
    counts: Vec<u64>,
    sum_ns: u64,
}

static ZEROS: [u64; BUCKETS] = [0; BUCKETS];

impl Snapshot {
    /// An empty snapshot: the neutral element of [`merge`](Self::merge).
    #[must_use]
    pub fn empty() -> Self {
        Snapshot {
            counts: Vec::new(),
            sum_ns: 0,
        }
    }

    /// The number of latencies counted.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The sum of the latencies counted (Prometheus `_sum`).
    #[must_use]
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    /// The count of each bucket ([`BUCKETS`] of them), in the order of [`upper_bounds`].
    #[must_use]
    pub fn counts(&self) -> &[u64] {
        if self.counts.is_empty() {
            &ZEROS
        } else {
            &self.counts
        }
    }

    /// Adds `other`'s counts to these (another gateway's, another window's).
    pub fn merge(&mut self, other: &Snapshot) {
        if other.counts.is_empty() {
            self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
            return;
        }
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS];
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.wrapping_add(*b);
        }
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
    }

    /// The latencies counted here and not in `earlier` (an earlier snapshot of the same
    /// histogram): the window between the two. A bucket that went down (not an earlier
    /// snapshot) counts 0.
    #[must_use]
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let counts = if self.counts.is_empty() {
            Vec::new()
        } else {
            self.counts
                .iter()
                .zip(earlier.counts())
                .map(|(a, b)| a.saturating_sub(*b))
                .collect()
        };
        Snapshot {
            counts,
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// An estimate of the `q` quantile (`q` in `[0, 1]`, clamped): the bucket that holds
    /// the rank-`⌈q·n⌉` latency, interpolated linearly inside it (the bucket's counts spread
    /// evenly over its width), so within one bucket
    /// width (6.25 %) of the exact value for latencies between 1.024 µs and 68.7 s. Above
    /// that range the estimate is 68.7 s. `None` when the snapshot is empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut below = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c == 0 || below + c < rank {
                below += c;
                continue;
            }
            let lo = lower_ns(i);
            let Some(hi) = upper_bound(i).map(nanos) else {
                return Some(Duration::from_nanos(lo));
            };
            // the rank's place among the bucket's counts, each at the middle of its share
            let frac = ((rank - below) as f64 - 0.5) / c as f64;
            return Some(Duration::from_nanos(lo + ((hi - lo) as f64 * frac) as u64));
        }
        None
    }

    /// Cumulative counts per upper bound, in order, ending with `(None, count)` for +∞:
    /// the `_bucket{le=…}` series of a Prometheus histogram.
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<Duration>, u64)> + '_ {
        self.counts().iter().enumerate().scan(0u64, |acc, (i, c)| {
            *acc += c;
            Some((upper_bound(i), *acc))
        })
    }

    /// The number of latencies below `bound`, counting the buckets whose upper edge is at
    /// most `bound`: exact when `bound` is an edge ([`upper_bounds`]), otherwise rounded
    /// down to the edge below (by less than 6.25 %). For exporting fewer buckets than the
    /// histogram has, e.g. Prometheus' defaults.
    #[must_use]
    pub fn count_below(&self, bound: Duration) -> u64 {
        self.cumulative()
            .take_while(|(upper, _)| upper.is_some_and(|u| u <= bound))
            .last()
            .map_or(0, |(_, c)| c)
    }
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot::empty()
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Snapshot) -> bool {
        self.sum_ns == other.sum_ns && self.counts() == other.counts()
    }
}

impl Eq for Snapshot {}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("count", &self.count())
            .field("sum", &self.sum())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

/// The wire form of a [`Snapshot`]: only the buckets that hold something.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SparseSnapshot {
    sum_ns: u64,
    buckets: Vec<(usize, u64)>,
}

impl From<Snapshot> for SparseSnapshot {
    fn from(s: Snapshot) -> Self {
        SparseSnapshot {
            sum_ns: s.sum_ns,
            buckets: s
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c != 0)
                .map(|(i, c)| (i, *c))
                .collect(),
        }
    }
}

impl TryFrom<SparseSnapshot> for Snapshot {
    type Error = String;

    fn try_from(s: SparseSnapshot) -> Result<Self, String> {
        let mut snap = Snapshot {
            counts: vec![0; BUCKETS],
            sum_ns: s.sum_ns,
        };
        for (i, c) in s.buckets {
            let slot = snap.counts.get_mut(i).ok_or_else(|| {
                format!("histogram bucket {i} does not exist (there are {BUCKETS})")
            })?;
            *slot = slot.saturating_add(c);
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests;
