//! The subset index: every endpoint sits in a slot, and every subset it belongs to (all,
//! baseline or its lane, unversioned or each of its versions) lists its *ready* slots and,
//! among them, those still being probed. A request finds its subset and picks from it in
//! O(1) of the number of endpoints.
//!
//! The background task owns an [`Index`] and changes it; requests read a [`Snapshot`], an
//! immutable clone published through `arc-swap`. The lists are [`Chunked`], so a change
//! among 10,000 endpoints copies a few chunks, not the lists.

mod snapshot;
mod writer;

use std::sync::Arc;

use gray_core::Labels;
use gray_policy::Availability;

use crate::meter::{Id, Meter, Metered};

pub(crate) use self::{
    snapshot::{Parts, Snapshot},
    writer::{Index, Standing},
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
    /// First: what a pick reads.
    pub(crate) meter: Meter,
    pub(crate) key: K,
    pub(crate) service: S,
    pub(crate) labels: Labels,
}

impl<K: Send + Sync, S: Send + Sync> Metered for Entry<K, S> {
    fn meter(&self) -> &Meter {
        &self.meter
    }
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

/// The most endpoints one request tries (its first attempt and its retries).
pub(crate) const MAX_TRIED: usize = 8;

/// The endpoints a request has tried and that failed it: its next pick walks and picks
/// as if they were ejected.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tried {
    ids: [Option<Id>; MAX_TRIED],
    len: usize,
}

impl Tried {
    /// Nothing tried yet.
    pub(crate) const NONE: Tried = Tried {
        ids: [None; MAX_TRIED],
        len: 0,
    };

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `id`; `false` when the list is full.
    pub(crate) fn push(&mut self, id: Id) -> bool {
        if self.len == MAX_TRIED {
            return false;
        }
        self.ids[self.len] = Some(id);
        self.len += 1;
        true
    }

    pub(crate) fn contains(&self, id: Id) -> bool {
        self.ids[..self.len].contains(&Some(id))
    }
}

/// Positions, in the ready list of a subset, that a pick skips (the endpoints a request
/// tried), ascending.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Skips {
    at: [usize; MAX_TRIED],
    len: usize,
}

impl Skips {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, at: usize) {
        if self.len < MAX_TRIED {
            self.at[self.len] = at;
            self.len += 1;
        }
    }

    /// The position in the whole ready list of the `i`th one not skipped.
    pub(crate) fn map(&self, i: usize) -> usize {
        let mut i = i;
        for &at in &self.at[..self.len] {
            if at <= i {
                i += 1;
            } else {
                break;
            }
        }
        i
    }
}

#[cfg(test)]
mod tests;
