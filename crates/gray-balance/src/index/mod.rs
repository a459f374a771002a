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

use crate::meter::{Meter, Metered};

pub(crate) use self::{
    snapshot::{Parts, Snapshot},
    writer::{Index, State},
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

/// One subset, as requests see it.
#[cfg(test)]
mod tests;
