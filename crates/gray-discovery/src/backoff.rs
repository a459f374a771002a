//! Exponential backoff with jitter, for reconnecting.

use std::{
    hash::{BuildHasher, Hasher},
    time::Duration,
};

/// Delays between attempts: `min` doubling up to `max`, each drawn in `[d/2, d]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) min: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// The delay before attempt number `failures` (from 1) after the last success.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        let full = self
            .min
            .saturating_mul(1 << exp)
            .min(self.max)
            .max(self.min);
        let half = full / 2;
        let spread = (full - half).as_micros().max(1) as u64;
        half + Duration::from_micros(random() % spread)
    }
}

fn random() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_within_bounds() {
        let b = Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        for (failures, full) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (5, 1600),
            (6, 2000),
            (99, 2000),
        ] {
            let d = b.delay(failures);
            let full = Duration::from_millis(full);
            assert!(d >= full / 2 && d <= full, "{failures}: {d:?}");
        }
    }
}
