//! The subset index: every endpoint sits in a slot, and every subset it belongs to keeps
//! the list of its *ready* slots, with swap-remove positions stored in the slot, so that
//! a request finds its subset and picks from it in O(1) of the number of endpoints.

use std::{collections::HashMap, hash::Hash};

use gray_core::{
    Lane, Version,
    matching::{Class, Counts, Subset},
};

/// Every endpoint.
const ALL: usize = 0;
/// Endpoints without a lane.
const BASELINE: usize = 1;
/// Endpoints without versions.
const UNVERSIONED: usize = 2;
const FIXED: usize = 3;

const NOT_READY: usize = usize::MAX;

/// Where an endpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Waiting for a poll of its readiness (new, just called, parked or readmitted).
    Queued,
    /// Polled ready and not called since: it sits in its subsets' ready lists.
    Ready,
    /// Ejected by passive health checking: absent from every count.
    Ejected,
}

/// One endpoint's membership of one subset.
#[derive(Debug, Clone, Copy)]
struct Link {
    subset: usize,
    /// Its position in the subset's ready list, or `NOT_READY`.
    pos: usize,
}

/// One entry of a subset's ready list.
#[derive(Debug, Clone, Copy)]
struct Member {
    slot: usize,
    /// Which of the slot's links points back here.
    link: usize,
}

#[derive(Debug, Default)]
struct SubsetEntry {
    ready: Vec<Member>,
    /// Members not ejected.
    live: usize,
    /// All members.
    members: usize,
    /// Round-robin cursor.
    cursor: usize,
}

#[derive(Debug)]
pub(crate) struct Slot<K, E> {
    pub(crate) key: K,
    pub(crate) endpoint: E,
    pub(crate) class: Class,
    pub(crate) state: State,
    pub(crate) generation: u64,
    links: Vec<Link>,
}

/// The (at most two, disjoint) subset entries that make up one [`Subset`]: the exact one
/// and, for [`gray_core::Unlabelled::Wildcard`], the unlabelled one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Parts {
    exact: Option<usize>,
    wild: Option<usize>,
}

#[derive(Debug)]
pub(crate) struct Index<K, E> {
    slots: Vec<Option<Slot<K, E>>>,
    free: Vec<usize>,
    by_key: HashMap<K, usize>,
    subsets: Vec<SubsetEntry>,
    free_subsets: Vec<usize>,
    lanes: HashMap<Lane, usize>,
    versions: HashMap<Version, usize>,
    wildcard: bool,
    next_generation: u64,
}

impl<K, E> Index<K, E> {
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(crate) fn ready_len(&self) -> usize {
        self.subsets[ALL].ready.len()
    }
}

impl<K: Hash + Eq + Clone, E> Index<K, E> {
    pub(crate) fn new(wildcard: bool) -> Self {
        Index {
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            subsets: (0..FIXED).map(|_| SubsetEntry::default()).collect(),
            free_subsets: Vec::new(),
            lanes: HashMap::new(),
            versions: HashMap::new(),
            wildcard,
            next_generation: 0,
        }
    }

    pub(crate) fn slot(&self, slot: usize) -> Option<&Slot<K, E>> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub(crate) fn slot_mut(&mut self, slot: usize) -> Option<&mut Slot<K, E>> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// The slot if it still holds the endpoint of that generation.
    pub(crate) fn live_slot_mut(
        &mut self,
        slot: usize,
        generation: u64,
    ) -> Option<&mut Slot<K, E>> {
        self.slot_mut(slot).filter(|s| s.generation == generation)
    }

    pub(crate) fn slots(&self) -> impl Iterator<Item = &Slot<K, E>> {
        self.slots.iter().flatten()
    }

    fn new_subset(&mut self) -> usize {
        match self.free_subsets.pop() {
            Some(id) => id,
            None => {
                self.subsets.push(SubsetEntry::default());
                self.subsets.len() - 1
            }
        }
    }

    /// Adds an endpoint, queued; an endpoint with the same key is replaced. Returns its
    /// slot and generation, and the endpoint it replaced.
    pub(crate) fn insert(&mut self, key: K, endpoint: E, class: Class) -> (usize, u64, Option<E>) {
        let replaced = self.remove(&key);
        let mut subsets = vec![ALL];
        match class.lane() {
            None => subsets.push(BASELINE),
            Some(lane) => {
                let id = match self.lanes.get(lane) {
                    Some(&id) => id,
                    None => {
                        let id = self.new_subset();
                        self.lanes.insert(lane.clone(), id);
                        id
                    }
                };
                subsets.push(id);
            }
        }
        if class.versions().is_empty() {
            subsets.push(UNVERSIONED);
        }
        for version in class.versions() {
            let id = match self.versions.get(version) {
                Some(&id) => id,
                None => {
                    let id = self.new_subset();
                    self.versions.insert(version.clone(), id);
                    id
                }
            };
            subsets.push(id);
        }
        let links = subsets
            .into_iter()
            .map(|subset| {
                let entry = &mut self.subsets[subset];
                entry.members += 1;
                entry.live += 1;
                Link {
                    subset,
                    pos: NOT_READY,
                }
            })
            .collect();
        let generation = self.next_generation;
        self.next_generation += 1;
        let slot = Slot {
            key: key.clone(),
            endpoint,
            class,
            state: State::Queued,
            generation,
            links,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.by_key.insert(key, id);
        (id, generation, replaced.map(|s| s.endpoint))
    }

    /// Removes the endpoint with `key`.
    pub(crate) fn remove(&mut self, key: &K) -> Option<Slot<K, E>> {
        let id = self.by_key.remove(key)?;
        match self.slot(id).map(|s| s.state) {
            Some(State::Ready) => {
                self.set_unready(id);
                self.drop_live(id);
            }
            Some(State::Queued) => self.drop_live(id),
            Some(State::Ejected) | None => {}
        }
        let slot = self.slots.get_mut(id).and_then(Option::take)?;
        self.free.push(id);
        for link in &slot.links {
            let entry = &mut self.subsets[link.subset];
            entry.members -= 1;
            if entry.members == 0 && link.subset >= FIXED {
                *entry = SubsetEntry::default();
                self.free_subsets.push(link.subset);
            }
        }
        if let Some(lane) = slot.class.lane() {
            if self
                .lanes
                .get(lane)
                .is_some_and(|&id| self.subsets[id].members == 0)
            {
                self.lanes.remove(lane);
            }
        }
        for version in slot.class.versions() {
            if self
                .versions
                .get(version)
                .is_some_and(|&id| self.subsets[id].members == 0)
            {
                self.versions.remove(version);
            }
        }
        Some(slot)
    }

    fn drop_live(&mut self, id: usize) {
        if let Some(slot) = self.slots.get(id).and_then(Option::as_ref) {
            for link in &slot.links {
                self.subsets[link.subset].live -= 1;
            }
        }
    }

    /// A queued endpoint was polled ready: it joins its subsets' ready lists.
    pub(crate) fn set_ready(&mut self, id: usize) {
        let Some(slot) = self.slots.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        if slot.state != State::Queued {
            return;
        }
        slot.state = State::Ready;
        for (i, link) in slot.links.iter_mut().enumerate() {
            let ready = &mut self.subsets[link.subset].ready;
            link.pos = ready.len();
            ready.push(Member { slot: id, link: i });
        }
    }

    /// A ready endpoint was called (or lost readiness): it leaves the ready lists and
    /// is queued for a new poll.
    pub(crate) fn set_unready(&mut self, id: usize) {
        let links = match self.slot_mut(id) {
            Some(slot) if slot.state == State::Ready => {
                slot.state = State::Queued;
                slot.links.len()
            }
            _ => return,
        };
        for i in 0..links {
            let Some(Link { subset, pos }) = self.slot_mut(id).map(|slot| {
                let link = slot.links[i];
                slot.links[i].pos = NOT_READY;
                link
            }) else {
                return;
            };
            let ready = &mut self.subsets[subset].ready;
            if pos >= ready.len() {
                continue;
            }
            ready.swap_remove(pos);
            if let Some(moved) = ready.get(pos).copied() {
                // Another endpoint took its place: update that one's position. It is a
                // different slot, since a slot appears once per subset.
                if let Some(other) = self.slot_mut(moved.slot) {
                    other.links[moved.link].pos = pos;
                }
            }
        }
    }

    /// Ejects an endpoint: it leaves every count until [`readmit`](Self::readmit).
    pub(crate) fn eject(&mut self, id: usize) {
        match self.slot(id).map(|s| s.state) {
            Some(State::Ready) => self.set_unready(id),
            Some(State::Queued) => {}
            Some(State::Ejected) | None => return,
        }
        self.drop_live(id);
        if let Some(slot) = self.slot_mut(id) {
            slot.state = State::Ejected;
        }
    }

    /// Takes an ejected endpoint back, queued.
    pub(crate) fn readmit(&mut self, id: usize) -> bool {
        let Some(slot) = self.slots.get_mut(id).and_then(Option::as_mut) else {
            return false;
        };
        if slot.state != State::Ejected {
            return false;
        }
        slot.state = State::Queued;
        for link in &slot.links {
            self.subsets[link.subset].live += 1;
        }
        true
    }

    /// The entries that make up `subset`.
    pub(crate) fn resolve(&self, subset: Subset<'_>) -> Parts {
        match subset {
            Subset::All => Parts {
                exact: Some(ALL),
                wild: None,
            },
            Subset::Baseline => Parts {
                exact: Some(BASELINE),
                wild: None,
            },
            Subset::Lane(lane) => Parts {
                exact: self.lanes.get(lane).copied(),
                wild: self.wildcard.then_some(BASELINE),
            },
            Subset::Version(version) => Parts {
                exact: self.versions.get(version).copied(),
                wild: self.wildcard.then_some(UNVERSIONED),
            },
        }
    }

    pub(crate) fn counts(&self, parts: Parts) -> Counts {
        let mut counts = Counts::default();
        for id in [parts.exact, parts.wild].into_iter().flatten() {
            let entry = &self.subsets[id];
            counts.present += entry.live;
            counts.ready += entry.ready.len();
        }
        counts
    }

    /// The slot of the `i`th ready member of `parts` (`i` below its ready count).
    pub(crate) fn ready_at(&self, parts: Parts, i: usize) -> Option<usize> {
        let exact = parts
            .exact
            .map_or(&[][..], |id| &self.subsets[id].ready[..]);
        match exact.get(i) {
            Some(m) => Some(m.slot),
            None => {
                let wild = parts.wild.map_or(&[][..], |id| &self.subsets[id].ready[..]);
                wild.get(i - exact.len()).map(|m| m.slot)
            }
        }
    }

    /// The next round-robin position of `parts`, below `n`.
    pub(crate) fn next_cursor(&mut self, parts: Parts, n: usize) -> usize {
        let Some(id) = parts.exact.or(parts.wild) else {
            return 0;
        };
        let entry = &mut self.subsets[id];
        let at = entry.cursor % n.max(1);
        entry.cursor = at + 1;
        at
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        // Every ready list entry points back to a ready slot whose link has its position,
        // and the counts add up.
        for (sid, entry) in self.subsets.iter().enumerate() {
            for (pos, m) in entry.ready.iter().enumerate() {
                let slot = self.slot(m.slot).expect("member of a live slot");
                assert_eq!(slot.state, State::Ready);
                assert_eq!(slot.links[m.link].subset, sid);
                assert_eq!(slot.links[m.link].pos, pos);
            }
            let live = self
                .slots()
                .filter(|s| s.state != State::Ejected && s.links.iter().any(|l| l.subset == sid))
                .count();
            if entry.members > 0 || sid < FIXED {
                assert_eq!(entry.live, live, "live count of subset {sid}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gray_core::{Labels, Policy};

    use super::*;

    fn class(pairs: &[(&str, &str)]) -> Class {
        Policy::new().classify(&Labels::from_iter(pairs.iter().copied()))
    }

    #[test]
    fn ready_lists_follow_state_changes() {
        let mut index: Index<u32, ()> = Index::new(false);
        let gray = Lane::new("gray").unwrap();
        let (a, ..) = index.insert(1, (), class(&[("gray", "true"), ("version", "2")]));
        let (b, ..) = index.insert(2, (), class(&[("gray", "true")]));
        let (c, ..) = index.insert(3, (), class(&[]));
        let lane = index.resolve(Subset::Lane(&gray));
        assert_eq!(
            index.counts(lane),
            Counts {
                present: 2,
                ready: 0
            }
        );
        for id in [a, b, c] {
            index.set_ready(id);
        }
        index.check();
        assert_eq!(
            index.counts(lane),
            Counts {
                present: 2,
                ready: 2
            }
        );
        index.set_unready(a);
        index.check();
        assert_eq!(index.ready_at(lane, 0), Some(b));
        index.eject(b);
        index.check();
        assert_eq!(
            index.counts(lane),
            Counts {
                present: 1,
                ready: 0
            }
        );
        assert!(index.readmit(b));
        index.set_ready(b);
        index.check();
        let (_, _, replaced) = index.insert(2, (), class(&[]));
        assert!(replaced.is_some());
        index.check();
        index.remove(&1);
        index.check();
        assert!(index.lanes.is_empty() && index.versions.is_empty());
        assert_eq!(index.counts(lane), Counts::default());
        assert_eq!(index.len(), 2);
    }
}
