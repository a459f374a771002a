//! The sticky-percentage hash and the random rolls of splits.
//!
//! A user's bucket is a number in `[0, 10000)` (basis points):
//!
//! ```text
//! h      = FNV-1a-64(salt ‖ 0xFF ‖ key)          offset 0xcbf29ce484222325, prime 0x100000001b3
//! h      = fmix64(h)                              MurmurHash3's 64-bit finalizer
//! bucket = h mod 10000
//! ```
//!
//! The `0xFF` byte never occurs in UTF-8, so `salt ‖ key` is unambiguous. A condition
//! `percent = p` matches when `bucket < round(p × 100)`: growing `p` only adds buckets, so a
//! user inside 10 % stays inside at 20 %. The function is fixed: it is part of the
//! configuration contract and never changes between releases.

use gray_core::{hash::keyed_hash, rand::Rng};

/// The number of buckets: percentages have a resolution of 0.01.
pub const BUCKETS: u32 = 10_000;

/// The sticky bucket of `key` under `salt`, in `[0, 10000)`.
///
/// ```
/// use gray_rules::sticky_bucket;
///
/// // Fixed by the documented formula, across releases and platforms.
/// assert_eq!(sticky_bucket(b"", b"user-42"), 4299);
/// assert_eq!(sticky_bucket(b"salt", b"alice"), 9232);
/// ```
#[must_use]
pub fn sticky_bucket(salt: &[u8], key: &[u8]) -> u32 {
    // BUCKETS fits in u32, so the remainder does too.
    (keyed_hash(salt, key) % u64::from(BUCKETS)) as u32
}

/// A source of random rolls in `[0, 10000)`, for `random` conditions and `split` rules: the
/// workspace's one generator, [`Rng`](gray_core::rand::Rng).
#[derive(Debug, Clone)]
pub struct Dice {
    rng: Rng,
}

impl Dice {
    /// A deterministic sequence from `seed` (for tests and replay).
    #[must_use]
    pub fn seeded(seed: u64) -> Self {
        Dice {
            rng: Rng::seeded(seed),
        }
    }

    /// A sequence seeded from the thread's generator.
    #[must_use]
    pub fn from_thread() -> Self {
        Dice { rng: Rng::new() }
    }

    /// The next roll in `[0, bound)`; `bound` 0 yields 0.
    pub fn roll(&mut self, bound: u32) -> u32 {
        // The result is below `bound`, so it fits in u32.
        self.rng.below(u64::from(bound)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_fixed() {
        // The hash is part of the configuration contract: these values never change.
        // (Computed independently from the documented formula.)
        assert_eq!(sticky_bucket(b"", b""), 2295);
        assert_eq!(sticky_bucket(b"", b"alice"), 2984);
        assert_eq!(sticky_bucket(b"salt", b"alice"), 9232);
        assert_eq!(sticky_bucket(b"", b"user-42"), 4299);
        assert_ne!(sticky_bucket(b"ab", b"c"), sticky_bucket(b"a", b"bc"));
    }

    /// Within 4 standard deviations of a binomial count: `n` trials of probability `p`.
    fn within_4_sd(count: u32, n: u32, p: f64) -> bool {
        let (n, count) = (f64::from(n), f64::from(count));
        let mean = n * p;
        (count - mean).abs() <= 4.0 * (mean * (1.0 - p)).sqrt()
    }

    /// 20,000 users over the ten deciles of the buckets: 2,000 each, ± 4 sd (± 170). The
    /// hash is fixed, so the counts are; a skew of a few percent fails.
    #[test]
    fn buckets_spread_evenly() {
        const USERS: u32 = 20_000;
        let mut deciles = [0u32; 10];
        for i in 0..USERS {
            let bucket = sticky_bucket(b"", format!("user-{i}").as_bytes());
            deciles[(bucket / 1_000) as usize] += 1;
        }
        for (decile, &count) in deciles.iter().enumerate() {
            assert!(
                within_4_sd(count, USERS, 0.1),
                "decile {decile}: {count} of {USERS} users ({deciles:?})"
            );
        }
    }

    /// Another salt puts users in buckets of their own: the users inside 10 % under one salt
    /// and inside 10 % under another are 1 % of all (200 of 20,000, ± 4 sd), as for two
    /// independent draws. Two rollouts do not pick the same users.
    #[test]
    fn salts_draw_independent_populations() {
        const USERS: u32 = 20_000;
        let both = (0..USERS)
            .filter(|i| {
                let user = format!("user-{i}");
                sticky_bucket(b"checkout", user.as_bytes()) < 1_000
                    && sticky_bucket(b"search", user.as_bytes()) < 1_000
            })
            .count() as u32;
        assert!(within_4_sd(both, USERS, 0.01), "{both} of {USERS} in both");
    }

    /// 1,000 rolls per face on average, each within 4 sd of a binomial, seeded.
    #[test]
    fn dice_stay_in_bounds() {
        let mut d = Dice::seeded(7);
        let mut hits = [0u32; 4];
        for _ in 0..4_000 {
            let r = d.roll(4);
            hits[r as usize] += 1;
        }
        assert!(
            hits.iter().all(|&h| within_4_sd(h, 4_000, 0.25)),
            "{hits:?}"
        );
        assert_eq!(d.roll(0), 0);
        let mut t = Dice::from_thread();
        assert!(t.roll(BUCKETS) < BUCKETS);
    }
}
