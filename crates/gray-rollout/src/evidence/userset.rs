//! A fixed-size, lock-free set of user hashes, tagged by generation (an epoch for the
//! gray users seen, a run or a refill for the bad users) so that a new generation starts
//! empty without clearing anything.

use std::sync::atomic::{AtomicU64, Ordering};

/// How far an insert probes before it gives up: at a load of at most 1/2 (the recorder
/// stops inserting at `capacity`, half the slots), a run this long has a probability far
/// below 10⁻²⁰ per insert.
const MAX_PROBES: usize = 256;
const LOW48: u64 = (1 << 48) - 1;

/// What [`UserSet::insert`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Insert {
    /// The user was not in the set for this generation, and now is.
    New,
    /// The user was already in the set for this generation.
    Present,
    /// No free slot within [`MAX_PROBES`]: the set is full.
    Full,
}

/// An open-addressing table of `(tag, user)` words, linear probing.
///
/// A word is `tag << 48 | low 48 bits of the (mixed) user | 1`, never 0 (0 is empty). A
/// slot whose tag is older than the inserter's (16-bit serial-number order) is free for
/// the taking, so a new generation reuses the table as if it were empty. Within a
/// generation a slot
/// only goes from free to taken, so a user found nowhere on its probe run up to the first
/// free slot is absent. Two threads inserting the same user race on one compare-exchange:
/// one gets [`Insert::New`], the other [`Insert::Present`].
pub(crate) struct UserSet {
    slots: Box<[AtomicU64]>,
    mask: usize,
}

impl UserSet {
    /// A table for up to `capacity` users per generation (2 × capacity slots, rounded up
    /// to a power of two).
    pub(crate) fn new(capacity: usize) -> Self {
        let len = (capacity.max(1) * 2).next_power_of_two();
        UserSet {
            slots: (0..len).map(|_| AtomicU64::new(0)).collect(),
            mask: len - 1,
        }
    }

    /// Adds `user` (already mixed: its bits must look random) for the generation `tag`.
    pub(crate) fn insert(&self, user: u64, tag: u16) -> Insert {
        let word = (u64::from(tag) << 48) | (user & LOW48) | 1;
        let mut i = (user >> 16) as usize & self.mask;
        for _ in 0..MAX_PROBES.min(self.slots.len()) {
            let slot = &self.slots[i];
            let mut current = slot.load(Ordering::Relaxed);
            loop {
                if current == word {
                    return Insert::Present;
                }
                if !is_free(current, tag) {
                    break;
                }
                match slot.compare_exchange(current, word, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Insert::New,
                    Err(now) => current = now,
                }
            }
            i = (i + 1) & self.mask;
        }
        Insert::Full
    }
}

/// Empty, or taken in a generation older than `tag` (serial-number order on 16 bits, so
/// tags may wrap around; a slot taken by a newer generation is not free for an older
/// one).
fn is_free(word: u64, tag: u16) -> bool {
    if word == 0 {
        return true;
    }
    let taken = (word >> 48) as u16;
    let age = tag.wrapping_sub(taken);
    age != 0 && age < 0x8000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixed(i: u64) -> u64 {
        crate::evidence::mix(i)
    }

    #[test]
    fn dedups_within_an_epoch_and_forgets_across_epochs() {
        let set = UserSet::new(100);
        for i in 0..100 {
            assert_eq!(set.insert(mixed(i), 1), Insert::New);
        }
        for i in 0..100 {
            assert_eq!(set.insert(mixed(i), 1), Insert::Present);
        }
        // the next epoch starts empty, and the old epoch's late writers do not take the
        // new epoch's slots
        for i in 0..100 {
            assert_eq!(set.insert(mixed(i), 2), Insert::New);
        }
        assert_eq!(set.insert(mixed(500), 1), Insert::New);
        assert_eq!(set.insert(mixed(3), 2), Insert::Present);
        // tags wrap around: 0 comes after 0xFFFF, and a late writer of epoch 0xFFFF
        // leaves epoch 0's word alone and takes a slot of its own
        assert_eq!(set.insert(mixed(3), 0), Insert::New);
        assert_eq!(set.insert(mixed(3), u16::MAX), Insert::New);
        assert_eq!(set.insert(mixed(3), 0), Insert::Present);
        assert_eq!(set.insert(mixed(3), u16::MAX), Insert::Present);
    }

    #[test]
    fn a_full_table_says_so() {
        let set = UserSet::new(4); // 8 slots
        let results: Vec<_> = (0..9).map(|i| set.insert(mixed(i), 1)).collect();
        assert_eq!(results.iter().filter(|r| **r == Insert::New).count(), 8);
        assert_eq!(results[8], Insert::Full);
    }

    #[test]
    fn concurrent_inserts_count_each_user_once() {
        let set = std::sync::Arc::new(UserSet::new(10_000));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let set = set.clone();
                std::thread::spawn(move || {
                    (0..10_000u64)
                        .filter(|i| set.insert(mixed(*i), 7) == Insert::New)
                        .count()
                })
            })
            .collect();
        let new: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(new, 10_000);
    }
}
