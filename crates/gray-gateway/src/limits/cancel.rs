//! An HTTP/2 connection whose client cancels most of its streams is sent GOAWAY.
//!
//! A stream cancelled before its response (`RST_STREAM`) cost the gateway its routing and,
//! often, an upstream request; a client that does little else is making the gateway pay
//! for nothing. Streams are judged in windows of [`WINDOW`]: when more than
//! `max_cancelled_percent` of a window's streams were cancelled before their response,
//! the connection is shut down gracefully (hyper's GOAWAY: streams in flight finish, no
//! new ones are accepted). Counting costs two relaxed
//! atomic operations per stream; the connection's task is woken only to shut down. HTTP/1.1
//! requests are not counted: a client that gives up on one closes its connection anyway.

use std::{
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
    task::Waker,
};

use futures_util::task::AtomicWaker;

/// Streams per window.
pub(crate) const WINDOW: u32 = 100;

/// One connection's streams, cancelled and not.
#[derive(Debug)]
pub(crate) struct Cancels {
    /// Percent of a window's streams that may be cancelled (0: no limit).
    max_percent: u32,
    streams: AtomicU32,
    cancelled: AtomicU32,
    goaway: AtomicBool,
    /// The connection's task, woken to shut down.
    waker: AtomicWaker,
}

// === impl Cancels ===

impl Cancels {
    pub(crate) fn new(max_percent: u32) -> Self {
        Cancels {
            max_percent,
            streams: AtomicU32::new(0),
            cancelled: AtomicU32::new(0),
            goaway: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        }
    }

    /// A stream began. Returns `true` when it completes a window that decides the GOAWAY
    /// (once per connection): the caller logs it.
    pub(crate) fn begin(&self) -> bool {
        if self.max_percent == 0 {
            return false;
        }
        let n = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        if n < WINDOW {
            return false;
        }
        self.streams.store(0, Ordering::Relaxed);
        let cancelled = self.cancelled.swap(0, Ordering::Relaxed);
        if u64::from(cancelled) * 100 > u64::from(n) * u64::from(self.max_percent)
            && !self.goaway.swap(true, Ordering::AcqRel)
        {
            self.waker.wake();
            return true;
        }
        false
    }

    /// A stream was cancelled before its response.
    pub(crate) fn cancelled(&self) {
        if self.max_percent > 0 {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the connection is to be shut down.
    pub(crate) fn goaway(&self) -> bool {
        self.goaway.load(Ordering::Acquire)
    }

    /// The connection's task, to wake when it is to be shut down.
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_the_share_of_a_window_cancelled_is_a_goaway() {
        let cancels = Cancels::new(50);
        // A window with half cancelled: no GOAWAY.
        for i in 0..WINDOW {
            if i % 2 == 0 {
                cancels.cancelled();
            }
            assert!(!cancels.begin());
        }
        assert!(!cancels.goaway());
        // The next with 51 cancelled: GOAWAY, decided once.
        let decided: Vec<bool> = (0..WINDOW)
            .map(|i| {
                if i <= 50 {
                    cancels.cancelled();
                }
                cancels.begin()
            })
            .collect();
        assert_eq!(decided.iter().filter(|d| **d).count(), 1);
        assert!(cancels.goaway());
    }

    #[test]
    fn zero_is_no_limit() {
        let cancels = Cancels::new(0);
        for _ in 0..1000 {
            cancels.cancelled();
            assert!(!cancels.begin());
        }
        assert!(!cancels.goaway());
    }
}
