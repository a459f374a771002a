//! The users a recorder counted first, in the order it counted them: what the leader
//! unions over every gateway so that one user is one user, however many gateways serve
//! it.
//!
//! Each time a recorder's own set says a user is new (a gray user of the epoch, or a bad
//! user of a stream in the run), it appends an [`Entry`] to a fixed ring of atomics: no
//! lock, no allocation. Its [`Report`](super::Report) carries the entries from the last
//! one the leader *acknowledged* in a saved state ([`Recorder::acknowledge`](super::Recorder::acknowledge))
//! as a [`UserLog`]. An entry leaves the ring only once a saved state says it was
//! consumed, so a leader that dies between two saves loses nothing: the next leader
//! restores the state of the last save and reads the same entries again.
//!
//! When the ring is full (the leader has not saved for a long while), a new entry is
//! dropped and counted in [`UserLog::dropped`]: that user is not counted. Which users are
//! dropped depends on the load, not on their arm, so the test stays valid; it only sees
//! fewer events.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{Arm, Stream};

const WRITTEN: u64 = 1 << 63;
const BASELINE_BIT: u64 = 1 << 50;

/// What an entry says of its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Seen in gray in the entry's epoch (for `min_users`).
    Gray,
    /// Had a first bad event of the stream in the run, in `arm`, in the entry's epoch.
    Bad(Stream, Arm),
}

/// One user a recorder counted first, packed in 64 bits: bit 63 set (written), bit 50
/// the arm (1: baseline), bits 48–49 the kind (0: gray seen; 1, 2, 3: a bad event of
/// `errors`, `latency_p99`, `latency_p50`), bits 32–47 the low 16 bits of the epoch, bits
/// 0–31 the user's fingerprint (32 bits of its mixed hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry(u64);

impl Entry {
    pub(crate) fn new(kind: Kind, epoch: u64, mixed_user: u64) -> Entry {
        let (code, arm) = match kind {
            Kind::Gray => (0, Arm::Gray),
            Kind::Bad(s, arm) => (s.index() as u64 + 1, arm),
        };
        let arm = if arm == Arm::Baseline {
            BASELINE_BIT
        } else {
            0
        };
        Entry(WRITTEN | arm | (code << 48) | ((epoch & 0xFFFF) << 32) | (mixed_user >> 32))
    }

    /// The entry a reader found, if it is one a recorder wrote.
    pub(crate) fn decode(word: u64) -> Option<Entry> {
        (word & WRITTEN != 0).then_some(Entry(word))
    }

    pub(crate) fn kind(self) -> Kind {
        let arm = if self.0 & BASELINE_BIT != 0 {
            Arm::Baseline
        } else {
            Arm::Gray
        };
        match (self.0 >> 48) & 3 {
            0 => Kind::Gray,
            code => Kind::Bad(Stream::ALL[(code - 1) as usize], arm),
        }
    }

    /// Whether the entry belongs to `epoch` (by its low 16 bits: the leader only takes
    /// entries of the current epoch and the one before, 65,536 epochs apart at least).
    pub(crate) fn is_of(self, epoch: u64) -> bool {
        (self.0 >> 32) & 0xFFFF == epoch & 0xFFFF
    }

    pub(crate) fn fingerprint(self) -> u32 {
        self.0 as u32
    }

    pub(crate) fn word(self) -> u64 {
        self.0
    }
}

/// The entries a report carries: from position `from` of its source's log on, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct UserLog {
    /// The position of the first entry in the source's log (0 at the process's start).
    pub from: u64,
    /// The entries, 16 hexadecimal digits each.
    #[serde(with = "hex_words")]
    pub(crate) entries: Vec<u64>,
    /// Entries this source dropped since it started, because its log was full.
    #[serde(default)]
    pub dropped: u64,
}

impl UserLog {
    /// How many entries it carries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it carries none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The position after its last entry: what a leader that consumed it acknowledges.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.from.saturating_add(self.entries.len() as u64)
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        self.entries.iter().filter_map(|w| Entry::decode(*w))
    }
}

/// A ring of entries: appended by any thread without a lock, read and acknowledged by
/// the control side (under the recorder's control mutex).
pub(crate) struct Ring {
    slots: Box<[AtomicU64]>,
    /// The position of the next entry to append.
    head: AtomicU64,
    /// Every position below it is acknowledged, and its slot zeroed.
    acked: AtomicU64,
    dropped: AtomicU64,
}

impl Ring {
    pub(crate) fn new(len: usize) -> Ring {
        Ring {
            slots: (0..len.max(1)).map(|_| AtomicU64::new(0)).collect(),
            head: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    fn slot(&self, position: u64) -> &AtomicU64 {
        &self.slots[(position % self.len()) as usize]
    }

    /// Appends `entry`, or drops it (and counts it) when the ring is full.
    pub(crate) fn push(&self, entry: Entry) {
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            if head.wrapping_sub(self.acked.load(Ordering::Acquire)) >= self.len() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            match self.head.compare_exchange_weak(
                head,
                head + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => head = now,
            }
        }
        self.slot(head).store(entry.word(), Ordering::Release);
    }

    /// The entries from the last acknowledged one up to the first not written yet (an
    /// appender between its reservation and its store: taken at the next read).
    pub(crate) fn read(&self) -> UserLog {
        let from = self.acked.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        let entries = (from..head)
            .map(|p| self.slot(p).load(Ordering::Acquire))
            .take_while(|w| *w & WRITTEN != 0)
            .collect();
        UserLog {
            from,
            entries,
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// Forgets every entry below `position` (clamped to what was written and read: a
    /// leader acknowledges only entries a report carried).
    pub(crate) fn acknowledge(&self, position: u64) {
        let acked = self.acked.load(Ordering::Acquire);
        let readable = self.read().end();
        let to = position.min(readable);
        if to <= acked {
            return;
        }
        for p in acked..to {
            self.slot(p).store(0, Ordering::Relaxed);
        }
        self.acked.store(to, Ordering::Release);
    }
}

mod hex_words {
    use std::fmt::Write as _;

    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(words: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(words.len() * 16);
        for w in words {
            let _ = write!(out, "{w:016x}");
        }
        s.serialize_str(&out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        let text = String::deserialize(d)?;
        if !text.len().is_multiple_of(16) || !text.is_ascii() {
            return Err(D::Error::custom(format!(
                "a user log of {} characters: not a whole number of 16-digit entries",
                text.len()
            )));
        }
        (0..text.len())
            .step_by(16)
            .map(|i| {
                u64::from_str_radix(&text[i..i + 16], 16)
                    .map_err(|e| D::Error::custom(format!("user log entry {}: {e}", i / 16)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_their_fields() {
        for (kind, epoch) in [
            (Kind::Gray, 7u64),
            (Kind::Bad(Stream::Errors, Arm::Gray), 0x1_0003),
            (Kind::Bad(Stream::LatencyP99, Arm::Baseline), 65_535),
            (Kind::Bad(Stream::LatencyP50, Arm::Gray), 1),
        ] {
            let e = Entry::new(kind, epoch, 0xDEAD_BEEF_0000_0001);
            let e = Entry::decode(e.word()).unwrap();
            assert_eq!(e.kind(), kind);
            assert!(e.is_of(epoch));
            assert!(!e.is_of(epoch + 1));
            assert_eq!(e.fingerprint(), 0xDEAD_BEEF);
        }
        assert_eq!(Entry::decode(0), None);
    }

    #[test]
    fn a_ring_keeps_entries_until_acknowledged_and_drops_when_full() {
        let ring = Ring::new(4);
        let e = |u: u64| Entry::new(Kind::Gray, 1, u << 32);
        for u in 0..3 {
            ring.push(e(u));
        }
        let log = ring.read();
        assert_eq!((log.from, log.len(), log.end()), (0, 3, 3));
        // nothing acknowledged: read again, the same
        assert_eq!(ring.read(), log);
        ring.acknowledge(2);
        let log = ring.read();
        assert_eq!((log.from, log.len()), (2, 1));
        assert_eq!(log.entries().next().unwrap().fingerprint(), 2);
        // 1 held, 3 more fit, then full
        for u in 3..7 {
            ring.push(e(u));
        }
        let log = ring.read();
        assert_eq!((log.from, log.len(), log.dropped), (2, 4, 1));
        let users: Vec<u32> = log.entries().map(Entry::fingerprint).collect();
        assert_eq!(users, [2, 3, 4, 5]);
        // an acknowledgement beyond what was written is clamped
        ring.acknowledge(100);
        assert_eq!(ring.read().from, 6);
        ring.push(e(9));
        assert_eq!(ring.read().entries().next().unwrap().fingerprint(), 9);
    }

    #[test]
    fn a_log_serialises_compactly_and_refuses_garbage() {
        let ring = Ring::new(8);
        ring.push(Entry::new(
            Kind::Bad(Stream::Errors, Arm::Gray),
            3,
            42 << 32,
        ));
        let log = ring.read();
        let json = serde_json::to_string(&log).unwrap();
        assert_eq!(
            json,
            r#"{"from":0,"entries":"800100030000002a","dropped":0}"#
        );
        assert_eq!(serde_json::from_str::<UserLog>(&json).unwrap(), log);
        for bad in [r#""800100030000002"#, r#""80010003000000zz"#] {
            let json = format!(r#"{{"from":0,"entries":{bad}"}}"#);
            let e = serde_json::from_str::<UserLog>(&json).unwrap_err();
            assert!(e.to_string().contains("user log"), "{e}");
        }
    }
}
