//! The distinct users of a rollout over every gateway: the union of the user logs.
//!
//! Each recorder counts a user once per stream and run in its own sets, so with one
//! gateway its counts are distinct users already. With several gateways behind an L4
//! balancer, one user's requests reach several of them, and summing their counts would
//! count that user once per gateway: three gateways, three bad events, where one gateway
//! sees one. So the leader does not sum the user counts: it takes each report's
//! [`UserLog`] (the users that recorder counted first) and counts a user only when the
//! fingerprint is new to the rollout's own sets, kept here in the state. The result is
//! what one gateway serving every request would have counted, whatever the number of
//! gateways and however the balancer spreads a user (round robin, affinity, or both).
//!
//! A user is attributed to the arm and the epoch of the first entry the leader reads
//! for it. Fingerprints are 32 bits: two users sharing one (a chance of about
//! `n / 2³²` for each new user among `n`) count as one, independently of their arms.
//! Like a recorder's sets (whose capacity is the recorder's own), a stream's set empties
//! once it holds [`USER_CAPACITY`] users, a moment decided by past counts only; the
//! epoch's gray users stop counting at that number. The state thus holds at most 4 × 4,096 fingerprints, 128 KiB as
//! hexadecimal at the worst (a stream whose every user is bad), a few hundred bytes for a
//! healthy errors stream.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::evidence::{Counters, Entry, Kind, PerStream, UserLog};

/// How many fingerprints a stream's set holds before it empties, and the most gray users
/// an epoch counts.
pub const USER_CAPACITY: usize = 4_096;

/// The leader's union of the sources' user logs: where each source's log was consumed up
/// to, and the users counted so far; see the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Users {
    /// Per source: the position in its log up to which entries were consumed. A
    /// recorder given this position ([`Recorder::acknowledge`](crate::Recorder::acknowledge))
    /// forgets the entries below it.
    pub cursors: BTreeMap<u64, u64>,
    /// The run's bad users per stream.
    bad: PerStream<Fingerprints>,
    /// The current epoch's gray users.
    gray: Fingerprints,
    /// What the union counted in the current epoch (only `gray_users` and `bad_users`).
    counted: Counters,
}

/// What one report's log added, per epoch (only `gray_users` and `bad_users` are set).
#[derive(Debug, Default)]
pub(crate) struct Added {
    pub(crate) current: Counters,
    pub(crate) previous: Counters,
}

impl Users {
    /// Where `source`'s log was consumed up to (0 for a source never read).
    #[must_use]
    pub fn cursor(&self, source: u64) -> u64 {
        self.cursors.get(&source).copied().unwrap_or(0)
    }

    /// Whether any source reported a log: the union, not the sum, counts users.
    pub(crate) fn is_logged(&self) -> bool {
        !self.cursors.is_empty()
    }

    /// The distinct gray users and bad users the union counted in the current epoch.
    pub(crate) fn counted(&self) -> &Counters {
        &self.counted
    }

    /// Takes the entries of each source's log beyond its cursor, of the `previous` epoch
    /// from every log first, then of the `current` one (others are ignored), and counts
    /// the users new to the union. Within an epoch, a user's arm is the same on every
    /// gateway (the weight is), so only the order of epochs matters for attribution.
    pub(crate) fn consume(
        &mut self,
        logs: &[(u64, &UserLog)],
        current: u64,
        previous: Option<u64>,
    ) -> Added {
        let mut added = Added::default();
        let unread = |source: u64, log: &UserLog| {
            // entries below the cursor were consumed already; a log starting beyond it
            // lost nothing that was not acknowledged (or its source restarted)
            let skip = self.cursor(source).saturating_sub(log.from);
            usize::try_from(skip).unwrap_or(usize::MAX)
        };
        let skips: Vec<usize> = logs.iter().map(|(s, log)| unread(*s, log)).collect();
        if let Some(previous) = previous {
            for ((_, log), skip) in logs.iter().zip(&skips) {
                for entry in log.entries().skip(*skip).filter(|e| e.is_of(previous)) {
                    self.count(entry, false, &mut added.previous);
                }
            }
        }
        for ((_, log), skip) in logs.iter().zip(&skips) {
            for entry in log.entries().skip(*skip).filter(|e| e.is_of(current)) {
                self.count(entry, true, &mut added.current);
            }
        }
        for (source, log) in logs {
            let cursor = self.cursor(*source);
            self.cursors.insert(*source, cursor.max(log.end()));
        }
        self.counted = self.counted.add(&added.current);
        added
    }

    fn count(&mut self, entry: Entry, current: bool, into: &mut Counters) {
        let fingerprint = entry.fingerprint();
        match entry.kind() {
            // gray users count in the current epoch only (the step's `min_users`)
            Kind::Gray if current => {
                if self.gray.0.len() < USER_CAPACITY && self.gray.0.insert(fingerprint) {
                    into.gray_users += 1;
                }
            }
            Kind::Gray => {}
            Kind::Bad(stream, arm) => {
                let set = &mut self.bad.get_mut(stream).0;
                if set.insert(fingerprint) {
                    let pair = into.bad_users.get_mut(stream);
                    match arm {
                        crate::Arm::Gray => pair.gray += 1,
                        crate::Arm::Baseline => pair.baseline += 1,
                    }
                    if set.len() >= USER_CAPACITY {
                        set.clear();
                    }
                }
            }
        }
    }

    /// A new epoch: its gray users count from zero.
    pub(crate) fn new_epoch(&mut self, keep: impl Fn(u64) -> bool) {
        self.gray.0.clear();
        self.counted = Counters::default();
        // sources that reported in neither of the two epochs still read are gone: a
        // restarted gateway is a new source
        self.cursors.retain(|source, _| keep(*source));
    }

    /// A new run: every user counts again.
    pub(crate) fn new_run(&mut self) {
        self.bad = PerStream::default();
    }
}

/// A set of 32-bit fingerprints, serialised as one string of 8 hexadecimal digits each,
/// in increasing order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Fingerprints(BTreeSet<u32>);

impl Serialize for Fingerprints {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(self.0.len() * 8);
        for f in &self.0 {
            let _ = write!(out, "{f:08x}");
        }
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for Fingerprints {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let text = String::deserialize(d)?;
        if !text.len().is_multiple_of(8) || !text.is_ascii() {
            return Err(D::Error::custom(format!(
                "a set of user fingerprints of {} characters: not a whole number of 8-digit fingerprints",
                text.len()
            )));
        }
        let set = (0..text.len())
            .step_by(8)
            .map(|i| {
                u32::from_str_radix(&text[i..i + 8], 16)
                    .map_err(|e| D::Error::custom(format!("user fingerprint {}: {e}", i / 8)))
            })
            .collect::<Result<BTreeSet<u32>, _>>()?;
        if set.len() > USER_CAPACITY {
            return Err(D::Error::custom(format!(
                "a set of {} user fingerprints: more than the {USER_CAPACITY} a set holds",
                set.len()
            )));
        }
        Ok(Fingerprints(set))
    }
}
