//! The background task's side of the index: it changes the lists and publishes copies.

use std::{collections::HashMap, hash::Hash, sync::Arc};

use gray_core::{Lane, Version};
use gray_policy::{Availability, route::Class};

use super::{
    ALL, BASELINE, Entry, FIXED, NONE, Slot, UNVERSIONED,
    snapshot::{Snapshot, SubsetView},
};
use crate::meter::Id;

/// Forgets the subset of `name` (a lane or a version) once it has no member left.
fn forget<N: Hash + Eq + Clone>(names: &mut Arc<HashMap<N, u32>>, name: &N, members: &[usize]) {
    if names.get(name).is_some_and(|&id| members[id as usize] == 0) {
        Arc::make_mut(names).remove(name);
    }
}

/// Where an endpoint stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// In its subsets' ready lists.
    Ready,
    /// Its `poll_ready` failed: present, not ready.
    Unready,
    /// Ejected by passive health: absent.
    Ejected,
}

// === impl Standing ===

impl Standing {
    fn availability(self) -> Availability {
        match self {
            Standing::Ready => Availability::Ready,
            Standing::Unready => Availability::Unready,
            Standing::Ejected => Availability::Ejected,
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
    state: Standing,
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

// === impl Index ===

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
    pub(super) fn len(&self) -> usize {
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

    pub(crate) fn state(&self, id: Id) -> Option<Standing> {
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
            state: Standing::Ready,
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
            if meta.state != Standing::Ejected {
                self.snapshot.subsets[i].present -= 1;
            }
            self.members[i] -= 1;
            if self.members[i] == 0 && link.subset >= FIXED {
                self.snapshot.subsets[i] = SubsetView::default();
                self.free_subsets.push(link.subset);
            }
        }
        if let Some(lane) = meta.class.lane() {
            forget(&mut self.snapshot.lanes, lane, &self.members);
        }
        for version in meta.class.versions() {
            forget(&mut self.snapshot.versions, version, &self.members);
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
    pub(crate) fn set_state(&mut self, id: Id, state: Standing) -> bool {
        let Some(old) = self.state(id) else {
            return false;
        };
        if old == state {
            return false;
        }
        if old == Standing::Ready {
            self.leave(id.slot, List::Fresh);
            self.leave(id.slot, List::Ready);
        }
        let Some(meta) = self.metas[id.slot as usize].as_mut() else {
            return false;
        };
        meta.state = state;
        let delta: isize = match (old, state) {
            (Standing::Ejected, _) => 1,
            (_, Standing::Ejected) => -1,
            _ => 0,
        };
        for link in &meta.links {
            let present = &mut self.snapshot.subsets[link.subset as usize].present;
            *present = present.saturating_add_signed(delta);
        }
        if state == Standing::Ready {
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
        if meta.state != Standing::Ready || (matches!(list, List::Fresh) && !meta.fresh) {
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
            if let Some(Some(other)) = self.metas.get_mut(moved as usize)
                && let Some(l) = other.links.iter_mut().find(|l| l.subset == subset)
            {
                match list {
                    List::Ready => l.ready = pos,
                    List::Fresh => l.fresh = pos,
                }
            }
        }
    }

    /// Lanes and versions that have a subset.
    #[cfg(test)]
    pub(super) fn named_subsets(&self) -> usize {
        self.snapshot.lanes.len() + self.snapshot.versions.len()
    }

    #[cfg(test)]
    pub(super) fn check(&self) {
        for (sid, view) in self.snapshot.subsets.iter().enumerate() {
            for (list, items) in [(List::Ready, &view.ready), (List::Fresh, &view.fresh)] {
                for (pos, &slot) in items.iter().enumerate() {
                    let meta = self.metas[slot as usize].as_ref().expect("a live slot");
                    assert_eq!(meta.state, Standing::Ready);
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
                    m.state != Standing::Ejected && m.links.iter().any(|l| l.subset as usize == sid)
                })
                .count();
            if self.members[sid] > 0 || sid < FIXED as usize {
                assert_eq!(view.present, present, "present count of subset {sid}");
            }
        }
    }
}
