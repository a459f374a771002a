//! The one backoff every gray crate retries with: reconnecting to etcd, re-reading a source,
//! readmitting an ejected endpoint.
//!
//! The delay before attempt `n` (counted from 1 after the last success) is `min` doubled
//! `n - 1` times, capped at `max`, then drawn uniformly in its upper half (`[d/2, d]`) so
//! that many clients that failed together do not retry together ("equal jitter").
//!
//! ```
//! use std::time::Duration;
//! use gray_core::backoff::Backoff;
//!
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
//! let d = backoff.delay(3); // 400 ms before jitter
//! assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
//! assert!(backoff.delay(50) <= Duration::from_secs(5));
//! assert_eq!(backoff.without_jitter().delay(3), Duration::from_millis(400));
//! ```

use std::time::Duration;

use crate::rand::random_u64;

/// Exponential backoff with jitter; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: bool,
}

impl Default for Backoff {
    /// 100 ms doubling to 5 s, with jitter.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
    }
}

impl Backoff {
    /// Starts at `min` (at least 1 ms) and doubles up to `max` (at least `min`), with jitter.
    #[must_use]
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Backoff {
            min,
            max: max.max(min),
            jitter: true,
        }
    }

    /// The same delays without jitter: exactly `min · 2ⁿ⁻¹`, capped at `max`.
    #[must_use]
    pub fn without_jitter(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The first delay.
    #[must_use]
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest delay.
    #[must_use]
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay before attempt `attempt` (from 1) since the last success; attempt 0 is
    /// treated as 1.
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(30);
        let full = self
            .min
            .saturating_mul(1u32 << exp)
            .min(self.max)
            .max(self.min);
        if !self.jitter {
            return full;
        }
        let half = full / 2;
        let spread = (full - half).as_micros().max(1) as u64;
        half + Duration::from_micros(random_u64() % (spread + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_bounds() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for (attempt, full) in [
            (0, 100),
            (1, 100),
            (2, 200),
            (3, 400),
            (5, 1600),
            (6, 2000),
            (99, 2000),
        ] {
            let full = Duration::from_millis(full);
            for _ in 0..50 {
                let d = b.delay(attempt);
                assert!(d >= full / 2 && d <= full, "{attempt}: {d:?}");
            }
            assert_eq!(b.without_jitter().delay(attempt), full);
        }
    }

    #[test]
    fn bounds_are_sane() {
        let b = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(b.min(), Duration::from_millis(1));
        assert_eq!(b.max(), Duration::from_millis(1));
        assert!(b.delay(u32::MAX) <= Duration::from_millis(1));
    }
}
