//! The retry budget: retries at most a share of the requests of a sliding window, plus a
//! floor, counted in atomics (no lock).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One second of the window: the second it counts (high 32 bits) and its count.
#[derive(Debug, Default)]
struct Slot(AtomicU64);

const COUNT: u64 = u32::MAX as u64;

impl Slot {
    /// Adds one to the count of `second`, starting it again if the slot held an older one.
    fn add(&self, second: u32) {
        let tagged = u64::from(second) << 32;
        let mut current = self.0.load(Relaxed);
        loop {
            if current & !COUNT == tagged {
                // The same second: a plain increment (a slot moved on meanwhile counts
                // one request in the newer second, which is as good).
                if current & COUNT < COUNT {
                    self.0.fetch_add(1, Relaxed);
                }
                return;
            }
            match self
                .0
                .compare_exchange_weak(current, tagged | 1, Relaxed, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// The count, if the slot holds a second in `(now - window, now]`.
    fn count(&self, now: u32, window: u32) -> u64 {
        let value = self.0.load(Relaxed);
        let second = (value >> 32) as u32;
        if now.wrapping_sub(second) < window {
            value & COUNT
        } else {
            0
        }
    }
}

/// Retries allowed: `percent` % of the requests of the last `window` seconds, plus
/// `floor` per second of the window.
#[derive(Debug)]
pub(crate) struct Budget {
    ratio: f64,
    floor: u64,
    requests: Box<[Slot]>,
    retries: Box<[Slot]>,
}

impl Budget {
    /// `percent` of the requests plus `floor_per_second` retries per second, over a
    /// window of `window_secs` seconds (at least 1).
    pub(crate) fn new(percent: u32, floor_per_second: u32, window_secs: u32) -> Self {
        let window = window_secs.max(1);
        let slots = || (0..window).map(|_| Slot::default()).collect();
        Budget {
            ratio: f64::from(percent) / 100.0,
            floor: u64::from(floor_per_second) * u64::from(window),
            requests: slots(),
            retries: slots(),
        }
    }

    fn window(&self) -> u32 {
        self.requests.len() as u32
    }

    fn slot(slots: &[Slot], second: u32) -> &Slot {
        &slots[second as usize % slots.len()]
    }

    /// Counts a request made in `second`.
    pub(crate) fn deposit(&self, second: u32) {
        Self::slot(&self.requests, second).add(second);
    }

    /// Counts a retry in `second` if the budget allows one; `false` when it is spent.
    pub(crate) fn withdraw(&self, second: u32) -> bool {
        let window = self.window();
        let sum = |slots: &[Slot]| -> u64 { slots.iter().map(|s| s.count(second, window)).sum() };
        let requests = sum(&self.requests);
        let retries = sum(&self.retries);
        let allowed = self.ratio.mul_add(requests as f64, self.floor as f64);
        if (retries as f64) < allowed {
            Self::slot(&self.retries, second).add(second);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_the_window_plus_a_floor() {
        // 20 % of requests, 1 per second over 10 s: a floor of 10.
        let budget = Budget::new(20, 1, 10);
        let mut granted = 0;
        while budget.withdraw(0) {
            granted += 1;
        }
        assert_eq!(granted, 10, "the floor alone");
        for _ in 0..100 {
            budget.deposit(1);
        }
        let mut more = 0;
        while budget.withdraw(1) {
            more += 1;
        }
        assert_eq!(more, 20, "20 % of 100 requests");
        // 10 s later the first second has left the window: its retries (10) free room,
        // its requests (none) take none.
        let mut later = 0;
        while budget.withdraw(10) {
            later += 1;
        }
        assert_eq!(later, 10);
        // Long after, only the floor again.
        let mut quiet = 0;
        while budget.withdraw(1_000) {
            quiet += 1;
        }
        assert_eq!(quiet, 10);
    }

    #[test]
    fn no_floor_no_requests_no_retry() {
        let budget = Budget::new(20, 0, 10);
        assert!(!budget.withdraw(5));
        for _ in 0..5 {
            budget.deposit(5);
        }
        assert!(budget.withdraw(5), "20 % of 5 is one");
        assert!(!budget.withdraw(5));
    }
}
