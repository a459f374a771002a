//! What requests read: an immutable, published copy of the index.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::AtomicUsize},
};

use gray_core::{Lane, Version};
use gray_policy::route::{Counts, Subset};

use super::{ALL, BASELINE, FIXED, FRESH_SCAN, Skips, Slot, Tried, UNVERSIONED};
use crate::chunked::Chunked;

#[derive(Debug, Clone, Default)]
pub(super) struct SubsetView {
    pub(super) ready: Chunked<u32>,
    /// The ready members still being probed.
    pub(super) fresh: Chunked<u32>,
    /// Members not ejected.
    pub(super) present: usize,
    /// Round-robin position, kept across snapshots.
    cursor: Arc<AtomicUsize>,
}

/// The (at most two, disjoint) subsets that make up one [`Subset`]: the exact one and, for
/// [`gray_policy::Unlabelled::Wildcard`], the unlabelled one.
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
    pub(super) slots: Chunked<Option<Slot<K, S>>>,
    pub(super) subsets: Vec<SubsetView>,
    pub(super) lanes: Arc<HashMap<Lane, u32>>,
    pub(super) versions: Arc<HashMap<Version, u32>>,
    wildcard: bool,
    pub(super) len: usize,
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

    pub(super) fn slot(&self, id: u32) -> Option<&Slot<K, S>> {
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

    /// The round-robin cursor of `parts` (its exact subset's, else its wildcard's).
    pub(crate) fn cursor(&self, parts: Parts) -> Option<&AtomicUsize> {
        parts
            .exact
            .or(parts.wild)
            .map(|id| &*self.subset(id).cursor)
    }

    /// A ready member of `parts` still being probed, not among `tried`, whose probe slot
    /// this call claimed.
    pub(crate) fn claim_fresh(&self, parts: Parts, tried: &Tried) -> Option<&Slot<K, S>> {
        parts
            .iter()
            .flat_map(|id| self.subset(id).fresh.iter())
            .take(FRESH_SCAN)
            .filter_map(|&slot| self.slot(slot))
            .find(|slot| {
                (tried.is_empty() || !tried.contains(slot.entry.meter.id()))
                    && slot.entry.meter.try_probe()
            })
    }

    /// Where the endpoints in `tried` are in the ready list of `parts`: a scan of that
    /// list, made only for a request that is being retried.
    pub(crate) fn skips(&self, parts: Parts, tried: &Tried) -> Skips {
        let mut skips = Skips::default();
        let mut at = 0;
        for id in parts.iter() {
            for &slot in self.subset(id).ready.iter() {
                if self
                    .slot(slot)
                    .is_some_and(|s| tried.contains(s.entry.meter.id()))
                {
                    skips.push(at);
                }
                at += 1;
            }
        }
        skips
    }
}
