//! Warnings a client's misbehaviour causes, rate-limited: at most one per
//! [`INTERVAL`] per kind, carrying the count of those suppressed since the last one. A
//! flood of refused requests or failed accepts costs an atomic add each, not a log line.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// One warning per kind at most this often.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

/// What a warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warning {
    /// `max_in_flight` refused requests.
    InFlight,
    /// `max_in_flight_per_client` refused requests.
    ClientInFlight,
    /// Accepting a connection failed (descriptors exhausted, for one).
    Accept,
    /// A connection cancelled most of its streams and was sent GOAWAY.
    Cancelling,
    /// A client abandoned its request body (an abort, a reset) while it was proxied.
    ClientAborted,
    /// A response was cut by `send_timeout` (its client read nothing of it).
    SendTimeout,
    /// `max_upgraded` refused upgrade requests.
    Upgraded,
    /// A mirror's copy failed (its lane's instance refused, timed out, or is gone).
    MirrorFailed,
}

const KINDS: usize = 8;
const NEVER: u64 = u64::MAX;

struct Slot {
    /// When the last warning of the kind was logged, in ms since [`epoch`].
    last: AtomicU64,
    suppressed: AtomicU64,
}

static SLOTS: [Slot; KINDS] = [const {
    Slot {
        last: AtomicU64::new(NEVER),
        suppressed: AtomicU64::new(0),
    }
}; KINDS];

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Calls `log` with the number of warnings of `kind` suppressed since the last, unless
/// one was logged less than [`INTERVAL`] ago (then counts this one as suppressed).
pub(crate) fn warn(kind: Warning, log: impl FnOnce(u64)) {
    let slot = &SLOTS[kind as usize];
    let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(NEVER - 1);
    let last = slot.last.load(Ordering::Relaxed);
    let due = last == NEVER || now.saturating_sub(last) >= INTERVAL.as_millis() as u64;
    if due
        && slot
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        log(slot.suppressed.swap(0, Ordering::Relaxed));
    } else {
        slot.suppressed.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_then_the_count_of_the_rest() {
        // `Cancelling` is this test's alone.
        let mut logged = Vec::new();
        for _ in 0..1000 {
            warn(Warning::Cancelling, |suppressed| logged.push(suppressed));
        }
        assert_eq!(logged, [0], "the first is logged, the other 999 counted");
        assert_eq!(
            SLOTS[Warning::Cancelling as usize]
                .suppressed
                .load(Ordering::Relaxed),
            999
        );
    }
}
