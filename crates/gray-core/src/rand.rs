//! The one small random number generator every gray crate uses: for the balancer's power of
//! two choices, the rules' `random` conditions and `split` arms, and the jitter of
//! [`Backoff`](crate::backoff::Backoff).
//!
//! Not cryptographic: a splitmix64 sequence, seeded per thread from std's randomly keyed
//! hasher. Drawing costs a few instructions, takes no lock and allocates nothing.
//!
//! ```
//! use gray_core::rand::Rng;
//!
//! let mut rng = Rng::seeded(7); // deterministic, for tests and replay
//! let roll = rng.below(10);
//! assert!(roll < 10);
//! assert_eq!(Rng::seeded(7).below(10), roll);
//! assert!(Rng::new().below(3) < 3); // seeded from the thread's generator
//!
//! // The thread's generator itself, seeded: every `Rng::new()` on this thread (a
//! // balancer's power of two choices, run in the caller's task) draws a fixed sequence.
//! gray_core::rand::seed_thread(42);
//! let first = Rng::new().next_u64();
//! gray_core::rand::seed_thread(42);
//! assert_eq!(Rng::new().next_u64(), first);
//! ```

use std::cell::Cell;

/// A splitmix64 generator; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Default for Rng {
    fn default() -> Self {
        Rng::new()
    }
}

impl Rng {
    /// A generator seeded from the thread's generator (itself seeded at random once per
    /// thread): two generators made one after the other draw different sequences.
    #[must_use]
    pub fn new() -> Self {
        Rng {
            state: thread_seed(),
        }
    }

    /// A deterministic sequence from `seed`.
    #[must_use]
    pub fn seeded(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Uniform in `0..n`; `0` when `n` is `0`.
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift maps the 64-bit value onto [0, n) without a modulo, and with a bias
        // too small to measure for the bounds used here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `0..n` for an index; `0` when `n` is `0`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

/// One random draw from the calling thread's generator, without keeping a [`Rng`].
#[must_use]
pub fn random_u64() -> u64 {
    thread_seed()
}

/// Seeds the calling thread's generator: from then on, [`Rng::new`] and [`random_u64`] on
/// this thread draw a sequence fixed by `seed` (a statistical test, the replay of a
/// trace). Other threads keep their own.
pub fn seed_thread(seed: u64) {
    THREAD_STATE.with(|s| s.set(seed));
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 / murmur3 finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

thread_local! {
    static THREAD_STATE: Cell<u64> = Cell::new(initial_seed());
}

fn initial_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6772_6179); // "gray"
    h.finish()
}

fn thread_seed() -> u64 {
    THREAD_STATE.with(|s| {
        let next = s.get().wrapping_add(GOLDEN);
        s.set(next);
        mix(next)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of `n` buckets gets 1,000 draws on average; a fair generator keeps every count
    /// within 4 standard deviations of a binomial (`sqrt(1000 (1 - 1/n))`, 22 to 31), seeded
    /// so that the outcome is fixed. A 2:1 skew, a modulo bias or a bucket never drawn is
    /// far outside.
    #[test]
    fn draws_stay_in_bounds_and_spread_evenly() {
        const PER_BUCKET: f64 = 1_000.0;
        for (seed, n) in [(7, 2), (8, 3), (9, 4), (10, 7), (11, 10), (12, 64)] {
            let mut rng = Rng::seeded(seed);
            let mut hits = vec![0u32; n];
            for _ in 0..n * PER_BUCKET as usize {
                hits[rng.index(n)] += 1;
            }
            let sd = (PER_BUCKET * (1.0 - 1.0 / n as f64)).sqrt();
            for (bucket, &h) in hits.iter().enumerate() {
                assert!(
                    (f64::from(h) - PER_BUCKET).abs() <= 4.0 * sd,
                    "n = {n}, bucket {bucket}: {h} draws, expected {PER_BUCKET} ± {:.0}",
                    4.0 * sd
                );
            }
        }
        let mut rng = Rng::seeded(7);
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.index(1), 0);
    }

    #[test]
    fn a_seeded_thread_draws_a_fixed_sequence() {
        seed_thread(3);
        let (a, b) = (Rng::new().next_u64(), random_u64());
        seed_thread(3);
        assert_eq!((Rng::new().next_u64(), random_u64()), (a, b));
        assert_ne!(a, b);
    }

    #[test]
    fn generators_made_in_a_row_differ() {
        let (mut a, mut b) = (Rng::new(), Rng::new());
        assert_ne!(a.next_u64(), b.next_u64());
    }
}
