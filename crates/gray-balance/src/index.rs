//! The subset index: every endpoint sits in a slot, and every subset it belongs to (all,
//! baseline or its lane, unversioned or each of its versions) lists its *ready* slots and,
//! among them, those still being probed. A request finds its subset and picks from it in
//! O(1) of the number of endpoints.
//!
//! The background task owns an [`Index`] and changes it; requests read a [`Snapshot`], an
//! immutable clone published through `arc-swap`. The lists are [`Chunked`], so a change
//! among 10,000 endpoints copies a few chunks, not the lists.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
};

use gray_core::{
    Labels, Lane, Version,
    matching::{Availability, Class, Counts, Subset},
};

use crate::{
    chunked::Chunked,
    meter::{Id, Meter},
};

/// Every endpoint.
const ALL: u32 = 0;
/// Endpoints without a lane.
const BASELINE: u32 = 1;
/// Endpoints without versions.
const UNVERSIONED: u32 = 2;
const FIXED: u32 = 3;

/// Not in a list.
const NONE: u32 = u32::MAX;

/// Probing endpoints a pick looks at before it picks by load.
const FRESH_SCAN: usize = 4;

/// One endpoint, shared by every snapshot it is in and by its requests.
#[derive(Debug)]
pub(crate) struct Entry<K, S> {
    pub(crate) key: K,
    pub(crate) service: S,
    pub(crate) labels: Labels,
    pub(crate) meter: Arc<Meter>,
}

/// A slot of a snapshot.
#[derive(Debug)]
pub(crate) struct Slot<K, S> {
    pub(crate) entry: Arc<Entry<K, S>>,
    pub(crate) availability: Availability,
}

impl<K, S> Clone for Slot<K, S> {
    fn clone(&self) -> Self {
        Slot {
            entry: self.entry.clone(),
            availability: self.availability,
        }
    }
}

/// One subset, as requests see it.
#[derive(Debug, Clone, Default)]
struct SubsetView {
    ready: Chunked<u32>,
    /// The ready members still being probed.
    fresh: Chunked<u32>,
    /// Members not ejected.
    present: usize,
    /// Round-robin position, kept across snapshots.
    cursor: Arc<AtomicUsize>,
}

/// The (at most two, disjoint) subsets that make up one [`Subset`]: the exact one and, for
/// [`gray_core::Unlabelled::Wildcard`], the unlabelled one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Parts {
    exact: Option<u32>,
    wild: Option<u32>,
}

impl Parts {
    fn iter(self) -> impl Iterator<Item = u32> {
        self.exact.into_iter().chain(self.wild)
    }
}

/// What requests read: immutable once published.
#[derive(Debug)]
pub(crate) struct Snapshot<K, S> {
    slots: Chunked<Option<Slot<K, S>>>,
    subsets: Vec<SubsetView>,
    lanes: Arc<HashMap<Lane, u32>>,
    versions: Arc<HashMap<Version, u32>>,
    wildcard: bool,
    len: usize,
}

impl<K, S> Clone for Snapshot<K, S> {
    fn clone(&self) -> Self {
        Snapshot {
            slots: self.slots.clone(),
            subsets: self.subsets.clone(),
            lanes: self.lanes.clone(),
            versions: self.versions.clone(),
            wildcard: self.wildcard,
            len: self.len,
        }
    }
}

impl<K, S> Snapshot<K, S> {
    pub(crate) fn new(wildcard: bool) -> Self {
        Snapshot {
            slots: Chunked::default(),
            subsets: (0..FIXED).map(|_| SubsetView::default()).collect(),
            lanes: Arc::default(),
            versions: Arc::default(),
            wildcard,
            len: 0,
        }
    }

    /// Endpoints known, ejected or not.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Endpoints ready: neither ejected nor unready.
    pub(crate) fn ready_len(&self) -> usize {
        self.subsets[ALL as usize].ready.len()
    }

    pub(crate) fn slots(&self) -> impl Iterator<Item = &Slot<K, S>> {
        self.slots.iter().flatten()
    }

    fn slot(&self, id: u32) -> Option<&Slot<K, S>> {
        self.slots.get(id as usize)?.as_ref()
    }

    fn subset(&self, id: u32) -> &SubsetView {
        &self.subsets[id as usize]
    }

    /// The subsets that make up `subset`.
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
        for id in parts.iter() {
            let s = self.subset(id);
            counts.present += s.present;
            counts.ready += s.ready.len();
        }
        counts
    }

    /// The `i`th ready member of `parts`.
    pub(crate) fn ready_at(&self, parts: Parts, i: usize) -> Option<&Slot<K, S>> {
        let mut i = i;
        for id in parts.iter() {
            let ready = &self.subset(id).ready;
            if i < ready.len() {
                return self.slot(*ready.get(i)?);
            }
            i -= ready.len();
        }
        None
    }

    /// The next round-robin position of `parts`, below `n` (`n > 0`).
    pub(crate) fn next_cursor(&self, parts: Parts, n: usize) -> usize {
        match parts.exact.or(parts.wild) {
            Some(id) => self.subset(id).cursor.fetch_add(1, Relaxed) % n,
            None => 0,
        }
    }

    /// A ready member of `parts` still being probed whose probe slot this call claimed.
    pub(crate) fn claim_fresh(&self, parts: Parts) -> Option<&Slot<K, S>> {
        parts
            .iter()
            .flat_map(|id| self.subset(id).fresh.iter())
            .take(FRESH_SCAN)
            .filter_map(|&slot| self.slot(slot))
            .find(|slot| slot.entry.meter.try_probe())
    }
}

/// Where an endpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// In its subsets' ready lists.
    Ready,
    /// Its `poll_ready` failed: present, not ready.
    Unready,
    /// Ejected by passive health: absent.
    Ejected,
}

impl State {
    fn availability(self) -> Availability {
        match self {
            State::Ready => Availability::Ready,
            State::Unready => Availability::Unready,
            State::Ejected => Availability::Ejected,
        }
    }
}

/// One endpoint's membership of one subset.
#[derive(Debug, Clone, Copy)]
struct Link {
    subset: u32,
    /// Its position in the subset's ready list, or `NONE`.
    ready: u32,
    /// Its position in the subset's probing list, or `NONE`.
    fresh: u32,
}

#[derive(Debug)]
struct Meta {
    class: Class,
    state: State,
    generation: u32,
    fresh: bool,
    links: Vec<Link>,
}

/// Which list of a subset.
#[derive(Debug, Clone, Copy)]
enum List {
    Ready,
    Fresh,
}

/// The background task's index, from which it publishes snapshots.
#[derive(Debug)]
pub(crate) struct Index<K, S> {
    snapshot: Snapshot<K, S>,
    metas: Vec<Option<Meta>>,
    free: Vec<u32>,
    by_key: HashMap<K, u32>,
    /// Members of each subset, ejected or not.
    members: Vec<usize>,
    free_subsets: Vec<u32>,
    next_generation: u32,
}

impl<K: Hash + Eq + Clone, S> Index<K, S> {
    pub(crate) fn new(wildcard: bool) -> Self {
        Index {
            snapshot: Snapshot::new(wildcard),
            metas: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            members: vec![0; FIXED as usize],
            free_subsets: Vec::new(),
            next_generation: 0,
        }
    }

    /// A copy to publish.
    pub(crate) fn snapshot(&self) -> Snapshot<K, S> {
        self.snapshot.clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.snapshot.len
    }

    /// The entry in `id`, if it still holds that generation.
    pub(crate) fn entry(&self, id: Id) -> Option<&Arc<Entry<K, S>>> {
        let meta = self.metas.get(id.slot as usize)?.as_ref()?;
        if meta.generation != id.generation {
            return None;
        }
        self.snapshot.slot(id.slot).map(|s| &s.entry)
    }

    pub(crate) fn state(&self, id: Id) -> Option<State> {
        match self.metas.get(id.slot as usize)? {
            Some(meta) if meta.generation == id.generation => Some(meta.state),
            _ => None,
        }
    }

    /// The slot and generation the next insert gets.
    fn next_id(&self) -> Id {
        Id {
            slot: self.free.last().copied().unwrap_or(self.metas.len() as u32),
            generation: self.next_generation,
        }
    }

    fn subset_for(&mut self, lane: Option<&Lane>, version: Option<&Version>) -> u32 {
        let existing = match (lane, version) {
            (Some(lane), _) => self.snapshot.lanes.get(lane).copied(),
            (None, Some(version)) => self.snapshot.versions.get(version).copied(),
            (None, None) => None,
        };
        if let Some(id) = existing {
            return id;
        }
        let id = match self.free_subsets.pop() {
            Some(id) => id,
            None => {
                self.snapshot.subsets.push(SubsetView::default());
                self.members.push(0);
                self.snapshot.subsets.len() as u32 - 1
            }
        };
        match (lane, version) {
            (Some(lane), _) => {
                Arc::make_mut(&mut self.snapshot.lanes).insert(lane.clone(), id);
            }
            (None, Some(version)) => {
                Arc::make_mut(&mut self.snapshot.versions).insert(version.clone(), id);
            }
            (None, None) => {}
        }
        id
    }

    /// Adds a ready, probing endpoint made by `make` (given its id); one with the same key
    /// is replaced.
    pub(crate) fn insert(
        &mut self,
        key: K,
        class: Class,
        make: impl FnOnce(Id) -> Entry<K, S>,
    ) -> Id {
        self.remove(&key);
        let id = self.next_id();
        let mut subsets = vec![ALL];
        match class.lane() {
            None => subsets.push(BASELINE),
            Some(lane) => subsets.push(self.subset_for(Some(lane), None)),
        }
        if class.versions().is_empty() {
            subsets.push(UNVERSIONED);
        }
        for version in class.versions() {
            subsets.push(self.subset_for(None, Some(version)));
        }
        let links = subsets
            .into_iter()
            .map(|subset| {
                self.members[subset as usize] += 1;
                self.snapshot.subsets[subset as usize].present += 1;
                Link {
                    subset,
                    ready: NONE,
                    fresh: NONE,
                }
            })
            .collect();
        self.free.pop();
        self.next_generation = self.next_generation.wrapping_add(1);
        let slot = Slot {
            entry: Arc::new(make(id)),
            availability: Availability::Ready,
        };
        let meta = Meta {
            class,
            state: State::Ready,
            generation: id.generation,
            fresh: true,
            links,
        };
        if id.slot as usize == self.metas.len() {
            self.metas.push(Some(meta));
            self.snapshot.slots.push(Some(slot));
        } else {
            self.metas[id.slot as usize] = Some(meta);
            if let Some(s) = self.snapshot.slots.get_mut(id.slot as usize) {
                *s = Some(slot);
            }
        }
        self.join(id.slot, List::Ready);
        self.join(id.slot, List::Fresh);
        self.by_key.insert(key, id.slot);
        self.snapshot.len += 1;
        id
    }

    /// Removes the endpoint with `key`; `false` when there is none.
    pub(crate) fn remove(&mut self, key: &K) -> bool {
        let Some(slot) = self.by_key.remove(key) else {
            return false;
        };
        self.leave(slot, List::Fresh);
        self.leave(slot, List::Ready);
        let Some(meta) = self.metas.get_mut(slot as usize).and_then(Option::take) else {
            return false;
        };
        for link in &meta.links {
            let i = link.subset as usize;
            if meta.state != State::Ejected {
                self.snapshot.subsets[i].present -= 1;
            }
            self.members[i] -= 1;
            if self.members[i] == 0 && link.subset >= FIXED {
                self.snapshot.subsets[i] = SubsetView::default();
                self.free_subsets.push(link.subset);
            }
        }
        if let Some(lane) = meta.class.lane() {
            if self
                .snapshot
                .lanes
                .get(lane)
                .is_some_and(|&id| self.members[id as usize] == 0)
            {
                Arc::make_mut(&mut self.snapshot.lanes).remove(lane);
            }
        }
        for version in meta.class.versions() {
            if self
                .snapshot
                .versions
                .get(version)
                .is_some_and(|&id| self.members[id as usize] == 0)
            {
                Arc::make_mut(&mut self.snapshot.versions).remove(version);
            }
        }
        if let Some(s) = self.snapshot.slots.get_mut(slot as usize) {
            *s = None;
        }
        self.free.push(slot);
        self.snapshot.len -= 1;
        true
    }

    /// Moves the endpoint `id` to `state`; `false` when it is gone or already there.
    /// Coming back to `Ready` makes it probing again.
    pub(crate) fn set_state(&mut self, id: Id, state: State) -> bool {
        let Some(old) = self.state(id) else {
            return false;
        };
        if old == state {
            return false;
        }
        if old == State::Ready {
            self.leave(id.slot, List::Fresh);
            self.leave(id.slot, List::Ready);
        }
        let Some(meta) = self.metas[id.slot as usize].as_mut() else {
            return false;
        };
        meta.state = state;
        let delta: isize = match (old, state) {
            (State::Ejected, _) => 1,
            (_, State::Ejected) => -1,
            _ => 0,
        };
        for link in &meta.links {
            let present = &mut self.snapshot.subsets[link.subset as usize].present;
            *present = present.saturating_add_signed(delta);
        }
        if state == State::Ready {
            meta.fresh = true;
            self.join(id.slot, List::Ready);
            self.join(id.slot, List::Fresh);
        }
        if let Some(Some(s)) = self.snapshot.slots.get_mut(id.slot as usize) {
            s.availability = state.availability();
        }
        true
    }

    /// The endpoint `id` finished probing: it leaves the probing lists.
    pub(crate) fn measured(&mut self, id: Id) -> bool {
        if self.state(id).is_none() {
            return false;
        }
        self.leave(id.slot, List::Fresh);
        if let Some(meta) = self.metas[id.slot as usize].as_mut() {
            meta.fresh = false;
        }
        true
    }

    /// Adds `slot` to `list` of each of its subsets (a ready one; probing ones only to
    /// the probing lists).
    fn join(&mut self, slot: u32, list: List) {
        let Some(meta) = self.metas[slot as usize].as_mut() else {
            return;
        };
        if meta.state != State::Ready || (matches!(list, List::Fresh) && !meta.fresh) {
            return;
        }
        for link in &mut meta.links {
            let view = &mut self.snapshot.subsets[link.subset as usize];
            let (items, pos) = match list {
                List::Ready => (&mut view.ready, &mut link.ready),
                List::Fresh => (&mut view.fresh, &mut link.fresh),
            };
            if *pos == NONE {
                *pos = items.len() as u32;
                items.push(slot);
            }
        }
    }

    /// Removes `slot` from `list` of each of its subsets.
    fn leave(&mut self, slot: u32, list: List) {
        let links = match self.metas.get(slot as usize) {
            Some(Some(meta)) => meta.links.len(),
            _ => return,
        };
        for i in 0..links {
            let Some(meta) = self.metas[slot as usize].as_mut() else {
                return;
            };
            let link = &mut meta.links[i];
            let subset = link.subset;
            let pos = match list {
                List::Ready => std::mem::replace(&mut link.ready, NONE),
                List::Fresh => std::mem::replace(&mut link.fresh, NONE),
            };
            if pos == NONE {
                continue;
            }
            let view = &mut self.snapshot.subsets[subset as usize];
            let items = match list {
                List::Ready => &mut view.ready,
                List::Fresh => &mut view.fresh,
            };
            items.swap_remove(pos as usize);
            // Another member took its place: update that one's position (a slot appears
            // once per subset, so it is another slot).
            let Some(&moved) = items.get(pos as usize) else {
                continue;
            };
            if let Some(Some(other)) = self.metas.get_mut(moved as usize) {
                if let Some(l) = other.links.iter_mut().find(|l| l.subset == subset) {
                    match list {
                        List::Ready => l.ready = pos,
                        List::Fresh => l.fresh = pos,
                    }
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn check(&self) {
        for (sid, view) in self.snapshot.subsets.iter().enumerate() {
            for (list, items) in [(List::Ready, &view.ready), (List::Fresh, &view.fresh)] {
                for (pos, &slot) in items.iter().enumerate() {
                    let meta = self.metas[slot as usize].as_ref().expect("a live slot");
                    assert_eq!(meta.state, State::Ready);
                    let link = meta
                        .links
                        .iter()
                        .find(|l| l.subset as usize == sid)
                        .expect("a link");
                    let at = match list {
                        List::Ready => link.ready,
                        List::Fresh => {
                            assert!(meta.fresh);
                            link.fresh
                        }
                    };
                    assert_eq!(at as usize, pos);
                }
            }
            let present = self
                .metas
                .iter()
                .flatten()
                .filter(|m| {
                    m.state != State::Ejected && m.links.iter().any(|l| l.subset as usize == sid)
                })
                .count();
            if self.members[sid] > 0 || sid < FIXED as usize {
                assert_eq!(view.present, present, "present count of subset {sid}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gray_core::Policy;

    use super::*;
    use crate::meter::Feedback;

    fn class(pairs: &[(&str, &str)]) -> Class {
        Policy::new().classify(&Labels::from_iter(pairs.iter().copied()))
    }

    fn add(index: &mut Index<u32, ()>, key: u32, pairs: &[(&str, &str)]) -> Id {
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let feedback = Arc::new(Feedback::new(
            tx,
            1.0,
            0,
            crate::health::is_connection_error,
        ));
        index.insert(key, class(pairs), |id| Entry {
            key,
            service: (),
            labels: Labels::new(),
            meter: Arc::new(Meter::new(id, feedback)),
        })
    }

    #[test]
    fn lists_follow_state_changes() {
        let mut index: Index<u32, ()> = Index::new(false);
        let gray = Lane::new("gray").unwrap();
        let a = add(&mut index, 1, &[("gray", "true"), ("version", "2")]);
        let b = add(&mut index, 2, &[("gray", "true")]);
        let _c = add(&mut index, 3, &[]);
        index.check();
        let snap = index.snapshot();
        let lane = snap.resolve(Subset::Lane(&gray));
        assert_eq!(
            snap.counts(lane),
            Counts {
                present: 2,
                ready: 2
            }
        );
        assert!(index.measured(a));
        index.check();
        assert!(index.set_state(a, State::Unready));
        index.check();
        let snap = index.snapshot();
        assert_eq!(snap.ready_at(lane, 0).unwrap().entry.key, 2);
        assert_eq!(
            snap.counts(lane),
            Counts {
                present: 2,
                ready: 1
            }
        );
        assert!(index.set_state(b, State::Ejected));
        index.check();
        let after = index.snapshot();
        assert_eq!(
            after.counts(lane),
            Counts {
                present: 1,
                ready: 0
            }
        );
        // The earlier snapshot is untouched.
        assert_eq!(snap.counts(lane).ready, 1);
        assert!(index.set_state(b, State::Ready));
        assert!(!index.set_state(b, State::Ready));
        index.check();
        // Replacing a key frees the old generation.
        let b2 = add(&mut index, 2, &[]);
        assert_ne!(b2, b);
        assert!(index.state(b).is_none());
        index.check();
        assert!(index.remove(&1));
        index.check();
        assert!(index.snapshot.lanes.is_empty() && index.snapshot.versions.is_empty());
        assert_eq!(index.snapshot().counts(lane), Counts::default());
        assert_eq!(index.len(), 2);
        assert!(!index.remove(&1));
    }

    #[test]
    fn many_changes_keep_the_lists_consistent() {
        let mut index: Index<u32, ()> = Index::new(true);
        let mut rng = gray_core::rand::Rng::seeded(11);
        let labels: [&[(&str, &str)]; 4] = [
            &[],
            &[("gray", "true")],
            &[("lane", "blue"), ("versions", "1,2")],
            &[("version", "2")],
        ];
        let mut ids = HashMap::new();
        for _ in 0..2_000 {
            let key = rng.below(40) as u32;
            match rng.below(5) {
                0 | 1 => {
                    let id = add(&mut index, key, labels[rng.index(4)]);
                    ids.insert(key, id);
                }
                2 => {
                    index.remove(&key);
                    ids.remove(&key);
                }
                3 => {
                    if let Some(&id) = ids.get(&key) {
                        let state = [State::Ready, State::Unready, State::Ejected][rng.index(3)];
                        index.set_state(id, state);
                    }
                }
                _ => {
                    if let Some(&id) = ids.get(&key) {
                        index.measured(id);
                    }
                }
            }
            index.check();
        }
        assert_eq!(index.len(), ids.len());
    }
}
