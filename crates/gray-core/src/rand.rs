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

    #[test]
    fn draws_stay_in_bounds_and_spread() {
        let mut rng = Rng::seeded(7);
        let mut hits = [0u32; 4];
        for _ in 0..4_000 {
            hits[rng.index(4)] += 1;
        }
        assert!(hits.iter().all(|&h| h > 800), "{hits:?}");
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.index(1), 0);
    }

    #[test]
    fn generators_made_in_a_row_differ() {
        let (mut a, mut b) = (Rng::new(), Rng::new());
        assert_ne!(a.next_u64(), b.next_u64());
    }
}
