//! The ready members of a subset at the time of one pick ([`Ready`]), read directly by the
//! built-in strategies and through [`Candidates`](super::Candidates) by the others; and
//! the two rules of power of two choices they share.

use std::sync::atomic::Ordering::Relaxed;

use gray_core::rand::Rng;

use super::Load;
use crate::index::{Parts, Skips, Slot, Snapshot};

/// Candidates a pick looks at after one that is being ejected.
const SKIP_EJECTING: usize = 4;

/// The ready endpoints of a subset, as [`Candidates`](super::Candidates) reads them.
pub(crate) trait View<'a> {
    /// How many.
    fn len(&self) -> usize;
    /// The `i`th one, `None` past the end.
    fn get(&self, i: usize) -> Option<Load<'a>>;
    /// The next position of the subset's round-robin cursor, below `len`.
    fn next_round_robin(&self) -> usize;
}

/// The `n` ready members of `parts` in one snapshot, at `now` on the balancer's clock,
/// without those a retried request skips.
pub(crate) struct Ready<'s, K, S> {
    snapshot: &'s Snapshot<K, S>,
    parts: Parts,
    n: usize,
    now: u64,
    skips: Skips,
}

// === impl Ready ===

impl<'s, K, S> Ready<'s, K, S> {
    /// `n`: the ready members, without the `skips`.
    pub(crate) fn new(
        snapshot: &'s Snapshot<K, S>,
        parts: Parts,
        n: usize,
        now: u64,
        skips: Skips,
    ) -> Self {
        Ready {
            snapshot,
            parts,
            n,
            now,
            skips,
        }
    }

    /// The `i`th ready member (not skipped).
    pub(crate) fn slot(&self, i: usize) -> Option<&'s Slot<K, S>> {
        let i = match self.skips.len() {
            0 => i,
            _ => self.skips.map(i),
        };
        self.snapshot.ready_at(self.parts, i)
    }

    fn load(&self, slot: &'s Slot<K, S>) -> Load<'s> {
        Load {
            meter: &slot.entry.meter,
            labels: &slot.entry.labels,
            now: self.now,
        }
    }

    /// Power of two choices (`n > 1`), `lighter` deciding between two that are not being
    /// ejected; see [`Candidates::power_of_two`](super::Candidates::power_of_two).
    pub(crate) fn power_of_two(
        &self,
        rng: &mut Rng,
        lighter: impl FnOnce(&Load<'s>, &Load<'s>) -> bool,
    ) -> Option<&'s Slot<K, S>> {
        let (a, b) = two(rng, self.n);
        let (sa, sb) = (self.slot(a)?, self.slot(b)?);
        Some(if first_wins(&self.load(sa), &self.load(sb), lighter) {
            sa
        } else {
            sb
        })
    }

    /// The slot to use for a strategy's choice `i`: `i` itself (modulo the length),
    /// unless it is being ejected and one of the next few is not.
    pub(crate) fn settle(&self, i: usize) -> Option<&'s Slot<K, S>> {
        let n = self.n;
        let i = if i < n { i } else { i % n };
        let chosen = self.slot(i)?;
        if !chosen.entry.meter.doomed() {
            return Some(chosen);
        }
        (1..n.min(SKIP_EJECTING + 1))
            .filter_map(|k| self.slot((i + k) % n))
            .find(|slot| !slot.entry.meter.doomed())
            .or(Some(chosen))
    }

    pub(crate) fn next_round_robin(&self) -> usize {
        match self.snapshot.cursor(self.parts) {
            Some(cursor) if self.n > 0 => cursor.fetch_add(1, Relaxed) % self.n,
            _ => 0,
        }
    }
}

impl<'a, 's: 'a, K, S> View<'a> for Ready<'s, K, S> {
    fn len(&self) -> usize {
        self.n
    }

    fn get(&self, i: usize) -> Option<Load<'a>> {
        if i >= self.n {
            return None;
        }
        Some(self.load(self.slot(i)?))
    }

    fn next_round_robin(&self) -> usize {
        Ready::next_round_robin(self)
    }
}

/// Two distinct positions below `n` (`n > 1`), drawn with `rng`.
pub(crate) fn two(rng: &mut Rng, n: usize) -> (usize, usize) {
    let a = rng.index(n);
    let mut b = rng.index(n - 1);
    if b >= a {
        b += 1;
    }
    (a, b)
}

/// Whether `a` wins over `b`: one being ejected loses; else `lighter` decides.
pub(crate) fn first_wins<'a>(
    a: &Load<'a>,
    b: &Load<'a>,
    lighter: impl FnOnce(&Load<'a>, &Load<'a>) -> bool,
) -> bool {
    match (a.is_ejecting(), b.is_ejecting()) {
        (false, true) => true,
        (true, false) => false,
        _ => lighter(a, b),
    }
}
