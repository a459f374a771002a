//! The sticky hashes (a percentage's bucket, a split's arm) and the random rolls of
//! random splits.
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
//!
//! A user's arm of a sticky split: [`sticky_split_arm`].

use gray_core::{
    hash::{keyed_hash, keyed_hash_parts},
    rand::Rng,
};

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

/// The arm of a sticky split that `key` falls in under `salt`: the index, in `arms`, of the
/// arm of highest score; each arm is its id (its name, else its position in decimal) and
/// its weight. `None` when no arm has a weight above 0.
///
/// Weighted rendezvous hashing (highest random weight), over the arms of weight `w > 0`:
///
/// ```text
/// h      = keyed_hash(salt, key ‖ 0xFF ‖ id)     id: the arm's name, else its position ("0", "1", …)
/// u      = ((h >> 11) + 0.5) / 2^53              in (0, 1)
/// score  = w / −ln(u)                            IEEE-754 double precision
/// ```
///
/// `−ln(u)` is exponentially distributed, so each arm wins for a share `w / Σw` of the keys.
/// An arm's score depends only on its own id and weight: growing one arm's weight raises
/// its score alone, so the only users who move are users who move **into** it (shrinking
/// it, only users who leave it); adding an arm moves users only into the new arm, and
/// removing one only moves its own users. On equal scores the earlier arm wins. The
/// function is fixed like [`sticky_bucket`]: part of the configuration contract. (Computed in
/// double precision with the platform's `ln`: two platforms whose `ln` differ in the last
/// bit could disagree only on a key whose two best scores are that close, about one key
/// in 10^15.)
///
/// ```
/// use gray_rules::sticky_split_arm;
///
/// let arms: [(&[u8], u32); 3] = [(b"0", 80), (b"1", 15), (b"2", 5)];
/// // Fixed by the documented formula, across releases and platforms.
/// assert_eq!(sticky_split_arm(b"", b"user-42", arms), Some(0));
/// assert_eq!(sticky_split_arm(b"", b"user-7", arms), Some(1));
/// // Growing arm 2 takes users only into arm 2.
/// let grown: [(&[u8], u32); 3] = [(b"0", 80), (b"1", 15), (b"2", 50)];
/// for i in 0..1_000 {
///     let key = format!("user-{i}");
///     let (before, after) = (
///         sticky_split_arm(b"", key.as_bytes(), arms),
///         sticky_split_arm(b"", key.as_bytes(), grown),
///     );
///     assert!(before == after || after == Some(2));
/// }
/// assert_eq!(sticky_split_arm(b"", b"user-42", [(&b"0"[..], 0)]), None);
/// ```
#[must_use]
pub fn sticky_split_arm<'a>(
    salt: &[u8],
    key: &[u8],
    arms: impl IntoIterator<Item = (&'a [u8], u32)>,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, (id, weight)) in arms.into_iter().enumerate() {
        if weight == 0 {
            continue;
        }
        let score = arm_score(salt, key, id, weight);
        if best.is_none_or(|(_, top)| score > top) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// `w / −ln(u)`, `u` the arm's hash mapped into (0, 1); see the [formula](self).
fn arm_score(salt: &[u8], key: &[u8], id: &[u8], weight: u32) -> f64 {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    let h = keyed_hash_parts(salt, &[key, &[0xFF], id]);
    // The top 53 bits, centred: never 0, never 1.
    let u = ((h >> 11) as f64 + 0.5) * SCALE;
    // u < 1, so −ln(u) > 0.
    f64::from(weight) / -u.ln()
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

    #[test]
    fn split_arms_are_fixed() {
        // Part of the configuration contract; computed independently from the documented
        // formula (a Python transcription of it).
        let arms: [(&[u8], u32); 3] = [(b"0", 80), (b"1", 15), (b"2", 5)];
        for (salt, key, arm) in [
            (&b""[..], &b"user-42"[..], 0),
            (b"", b"user-7", 1),
            (b"", b"user-2", 1),
            (b"", b"bob", 0),
            (b"checkout", b"user-42", 1),
            (b"checkout", b"bob", 2),
            (b"checkout", b"alice", 0),
        ] {
            assert_eq!(
                sticky_split_arm(salt, key, arms),
                Some(arm),
                "{key:?} {salt:?}"
            );
        }
        // Zero weights never win; equal scores go to the earlier arm.
        assert_eq!(
            sticky_split_arm(b"", b"bob", [(&b"0"[..], 0), (b"1", 1)]),
            Some(1)
        );
        assert_eq!(
            sticky_split_arm(b"", b"bob", [(&b"x"[..], 1), (b"x", 1)]),
            Some(0)
        );
        assert_eq!(sticky_split_arm(b"", b"bob", std::iter::empty()), None);
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
