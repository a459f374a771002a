//! When a version of a file may be handed out: once its writer is done with it.
//!
//! A file written in place (truncated, then written in several writes) can be read between
//! two of them: empty, or a prefix of the new version, which may well parse (a TOML rule
//! file cut after its first rule is a valid rule file with one rule). So a version read
//! for the first time is not handed out at once: it waits for a second read, `delay` later,
//! that gives the same bytes (same length, same hash). A writer still at work by then has
//! changed them, and the wait starts again with its newer bytes.
//!
//! A file not modified for longer than the racy window (3 s: more than the granularity of
//! any file system's clock), and that did not change while it was read, needs no second
//! read: no writer is at work. That is the usual case at start-up, where it saves `delay`.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A version read once, waiting for the read that confirms it.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    len: usize,
    hash: u64,
    /// When the confirming read is due.
    due: Instant,
}

/// What one read of the file gave, as the settling needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Read {
    /// The modification time before the read.
    pub(super) modified: Option<SystemTime>,
    /// Whether the size and modification time were the same before and after the read.
    pub(super) still: bool,
    /// The length of the bytes read.
    pub(super) len: usize,
    /// Their hash.
    pub(super) hash: u64,
}

/// Decides when a version read may be handed out; see the [module docs](self).
#[derive(Debug)]
pub(super) struct Settle {
    delay: Duration,
    /// How old a modification time must be for one read to do.
    quiet: Duration,
    pending: Option<Candidate>,
}

// === impl Settle ===

impl Settle {
    /// Settles versions for `delay` (zero: every read is handed out at once); a file not
    /// modified for `quiet` needs one read.
    pub(super) fn new(delay: Duration, quiet: Duration) -> Self {
        Settle {
            delay,
            quiet,
            pending: None,
        }
    }

    /// When the read that confirms a pending version is due, if one is pending.
    pub(super) fn due(&self) -> Option<Instant> {
        self.pending.map(|c| c.due)
    }

    /// Forgets a pending version (the file went back to what was handed out).
    pub(super) fn clear(&mut self) {
        self.pending = None;
    }

    /// A read at `now` gave `read`: whether its bytes may be handed out now. If not, a
    /// read is due at [`Settle::due`].
    pub(super) fn ready(&mut self, read: Read, now: Instant) -> bool {
        if self.delay.is_zero() {
            self.pending = None;
            return true;
        }
        if let Some(candidate) = self.pending
            && candidate.len == read.len
            && candidate.hash == read.hash
        {
            if now >= candidate.due {
                self.pending = None;
                return true;
            }
            // Read again early (a tick that was due anyway): the due time stays.
            return false;
        }
        if read.still && self.is_quiet(read.modified) {
            self.pending = None;
            return true;
        }
        self.pending = Some(Candidate {
            len: read.len,
            hash: read.hash,
            due: now + self.delay,
        });
        false
    }

    /// Whether a file last modified at `modified` has been left alone for `quiet` (a time
    /// in the future, from another clock, says nothing).
    fn is_quiet(&self, modified: Option<SystemTime>) -> bool {
        modified
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age >= self.quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(100);
    const QUIET: Duration = Duration::from_secs(3);

    fn read(bytes: &[u8], modified: Option<SystemTime>) -> Read {
        Read {
            modified,
            still: true,
            len: bytes.len(),
            hash: gray_core::hash::content_hash(bytes),
        }
    }

    #[test]
    fn a_new_version_waits_for_a_second_read_that_gives_the_same_bytes() {
        let mut settle = Settle::new(DELAY, QUIET);
        let t0 = Instant::now();
        let now = Some(SystemTime::now());
        assert!(!settle.ready(read(b"rules = [", now), t0));
        assert_eq!(settle.due(), Some(t0 + DELAY));
        // Read early with the same bytes: not yet.
        assert!(!settle.ready(read(b"rules = [", now), t0 + DELAY / 2));
        // Changed meanwhile: the wait starts again from this read.
        let t1 = t0 + DELAY;
        assert!(!settle.ready(read(b"rules = []", now), t1));
        assert_eq!(settle.due(), Some(t1 + DELAY));
        assert!(settle.ready(read(b"rules = []", now), t1 + DELAY));
        assert_eq!(settle.due(), None);
    }

    #[test]
    fn a_file_left_alone_needs_one_read_unless_it_changed_while_read() {
        let mut settle = Settle::new(DELAY, QUIET);
        let old = Some(SystemTime::now() - Duration::from_secs(60));
        assert!(settle.ready(read(b"x", old), Instant::now()));
        let moving = Read {
            still: false,
            ..read(b"y", old)
        };
        assert!(!settle.ready(moving, Instant::now()));
        // A modification time in the future or unknown says nothing: two reads.
        let mut settle = Settle::new(DELAY, QUIET);
        let future = Some(SystemTime::now() + Duration::from_secs(60));
        assert!(!settle.ready(read(b"x", future), Instant::now()));
        assert!(!settle.ready(read(b"z", None), Instant::now()));
    }

    #[test]
    fn no_delay_hands_out_every_read() {
        let mut settle = Settle::new(Duration::ZERO, QUIET);
        assert!(settle.ready(read(b"", Some(SystemTime::now())), Instant::now()));
        assert_eq!(settle.due(), None);
    }
}
