//! The sets of instances a request may be served by: [`Subset`], borrowed from a request's
//! key on the request path, and [`OwnedSubset`], as a [`Decision`](super::Decision) and an
//! [`Unroutable`](super::Unroutable) error name it.

use std::fmt;

use serde::Serialize;

use gray_core::{Lane, Version};

/// A set of instances a request may be served by, borrowed from the request's
/// [`Key`](crate::route::Key): what [`Policy::walk`](crate::Policy::walk) asks a balancer
/// to count.
///
/// Deliberately not `#[non_exhaustive]`: a balancer's index must know every kind of
/// subset, so a new one is a breaking change of the routing contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subset<'a> {
    /// The instances serving this version (and, with [`Unlabelled::Wildcard`](super::Unlabelled::Wildcard), those
    /// without versions).
    Version(&'a Version),
    /// The instances in this lane (and, with [`Unlabelled::Wildcard`](super::Unlabelled::Wildcard), those without a
    /// lane).
    Lane(&'a Lane),
    /// The instances without a lane.
    Baseline,
    /// Every instance.
    All,
}

// === impl Subset ===

impl Subset<'_> {
    /// The owned form, for reports and errors.
    #[must_use]
    pub fn to_owned(&self) -> OwnedSubset {
        match *self {
            Subset::Version(v) => OwnedSubset::Version(v.clone()),
            Subset::Lane(l) => OwnedSubset::Lane(l.clone()),
            Subset::Baseline => OwnedSubset::Baseline,
            Subset::All => OwnedSubset::All,
        }
    }
}

impl fmt::Display for Subset<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subset::Version(v) => write!(f, "version `{v}`"),
            Subset::Lane(l) => write!(f, "lane `{l}`"),
            Subset::Baseline => f.write_str("baseline"),
            Subset::All => f.write_str("all instances"),
        }
    }
}

/// A set of instances a request may be served by, as a [`Decision`](super::Decision)
/// and an [`Unroutable`](super::Unroutable) error name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OwnedSubset {
    /// The instances serving this version (and, with [`Unlabelled::Wildcard`](super::Unlabelled::Wildcard), those
    /// without versions).
    Version(Version),
    /// The instances in this lane (and, with [`Unlabelled::Wildcard`](super::Unlabelled::Wildcard), those without a
    /// lane).
    Lane(Lane),
    /// The instances without a lane.
    Baseline,
    /// Every instance.
    All,
}

// === impl OwnedSubset ===

impl OwnedSubset {
    /// The borrowed form.
    #[must_use]
    pub fn as_subset(&self) -> Subset<'_> {
        match self {
            OwnedSubset::Version(v) => Subset::Version(v),
            OwnedSubset::Lane(l) => Subset::Lane(l),
            OwnedSubset::Baseline => Subset::Baseline,
            OwnedSubset::All => Subset::All,
        }
    }
}

impl fmt::Display for OwnedSubset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_subset(), f)
    }
}
