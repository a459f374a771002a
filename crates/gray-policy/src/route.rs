//! The routing internals that `gray-balance` runs on every request: an instance's
//! [`Class`], a request's [`Key`], the [`Chain`] of [`Subset`]s it may use, and the
//! [`walk`](Policy::walk) over them.
//!
//! The rest is used by gray-balance and hidden from the docs; the subsets themselves are in
//! `subset.rs`.

use serde::Serialize;

use super::{
    error::{Unroutable, UnroutableReason},
    policy::{Fallback, FlagValues, OnUnready, Policy, Unlabelled},
    subset::Subset,
};
use gray_core::{Labels, Lane, Stain, Version};

// === impl Policy ===

// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
impl Policy {
    /// The [`Class`] of an instance with these labels.
    pub fn classify(&self, labels: &Labels) -> Class {
        let mut lane = None;
        if let Some(value) = self.lane_key.as_deref().and_then(|k| labels.get(k)) {
            match Lane::new(value) {
                Ok(l) => lane = Some(l),
                Err(e) => tracing::debug!(
                    target: "gray::matching",
                    label = self.lane_key.as_deref(),
                    value,
                    error = %e,
                    "ignoring lane label",
                ),
            }
        }
        if lane.is_none() {
            if let Some(value) = self.flag_key.as_deref().and_then(|k| labels.get(k)) {
                let gray = match self.flag_values {
                    FlagValues::Lenient => value.eq_ignore_ascii_case("true"),
                    FlagValues::Exact => value == "true",
                };
                if gray {
                    lane = Some(self.flag_lane.clone());
                }
            }
        }
        let mut versions: Vec<Version> = Vec::new();
        let single = self.version_key.as_deref().and_then(|k| labels.get(k));
        let list = self.versions_key.as_deref().and_then(|k| labels.get(k));
        for value in single
            .into_iter()
            .chain(list.into_iter().flat_map(|l| l.split(',')))
        {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match Version::new(value) {
                Ok(v) if !versions.contains(&v) => versions.push(v),
                Ok(_) => {}
                Err(e) => tracing::debug!(
                    target: "gray::matching",
                    value,
                    error = %e,
                    "ignoring version label",
                ),
            }
        }
        Class { lane, versions }
    }

    /// `true` when an instance of class `class` belongs to `subset`.
    pub fn serves(&self, class: &Class, subset: Subset<'_>) -> bool {
        let wildcard = self.unlabelled == Unlabelled::Wildcard;
        match subset {
            Subset::All => true,
            Subset::Baseline => class.lane.is_none(),
            Subset::Lane(l) => match &class.lane {
                Some(own) => own == l,
                None => wildcard,
            },
            Subset::Version(v) => {
                class.versions.contains(v) || (wildcard && class.versions.is_empty())
            }
        }
    }

    /// The key of a request for `service`: its lane and its pin for that service.
    ///
    /// `stain` is `None` when the request carries no stain at all; the policy's own
    /// lane then applies.
    pub fn key<'a>(&'a self, service: &str, stain: Option<&'a Stain>) -> Key<'a> {
        if !self.enabled {
            return Key::default();
        }
        let (lane, own) = match stain {
            Some(stain) => (stain.lane(), false),
            None => (self.own_lane.as_ref(), self.own_lane.is_some()),
        };
        let lane = lane.filter(|_| self.reads_lanes());
        let pin = stain
            .and_then(|s| s.version_for(service))
            .filter(|_| self.reads_versions());
        Key {
            lane,
            pin,
            own_lane: own && lane.is_some(),
        }
    }

    /// The subsets a request with `key` may use, in order.
    pub fn chain<'a>(&self, key: &Key<'a>) -> Chain<'a> {
        let mut chain = Chain::default();
        let primary = match (key.pin, key.lane) {
            (Some(v), _) => Subset::Version(v),
            (None, Some(l)) => Subset::Lane(l),
            (None, None) => Subset::Baseline,
        };
        chain.push(primary);
        if self.fallback != Fallback::None {
            if let (Some(_), Some(l)) = (key.pin, key.lane) {
                chain.push(Subset::Lane(l));
            }
            if primary != Subset::Baseline {
                chain.push(Subset::Baseline);
            }
            if self.fallback == Fallback::Any {
                chain.push(Subset::All);
            }
        }
        chain
    }

    /// Walks the [`chain`](Self::chain) of `key`, asking `counts` how many instances of
    /// each subset are present (not ejected) and ready, and returns the subset to pick
    /// from, or why there is none.
    pub fn walk<'a>(
        &self,
        key: &Key<'a>,
        mut counts: impl FnMut(Subset<'a>) -> Counts,
    ) -> Result<Route<'a>, Miss<'a>> {
        let mut unready: Option<(Subset<'a>, usize)> = None;
        for (i, subset) in self.chain(key).iter().enumerate() {
            let c = counts(subset);
            if c.ready > 0 {
                return Ok(Route {
                    subset,
                    fallback: i > 0,
                    counts: c,
                });
            }
            if c.present > 0 {
                if self.on_unready == OnUnready::Fail {
                    return Err(Miss::Unready {
                        subset,
                        present: c.present,
                    });
                }
                unready.get_or_insert((subset, c.present));
            }
        }
        Err(match unready {
            Some((subset, present)) => Miss::Unready { subset, present },
            None => Miss::NoMatch,
        })
    }

    /// The typed error for a request to `service` with `key` that `miss`ed.
    pub fn unroutable(&self, service: &str, key: &Key<'_>, miss: &Miss<'_>) -> Unroutable {
        Unroutable {
            service: service.into(),
            policy: self.name.clone(),
            lane: key.lane.cloned(),
            pin: key.pin.cloned(),
            fallback: self.fallback,
            reason: match *miss {
                Miss::NoMatch => UnroutableReason::NoMatch,
                Miss::Unready { subset, present } => UnroutableReason::Unready {
                    subset: subset.to_owned(),
                    present,
                },
            },
        }
    }
}

/// What an instance's labels mean to a [`Policy`]: its lane and the versions it serves.
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Class {
    lane: Option<Lane>,
    versions: Vec<Version>,
}

// === impl Class ===

impl Class {
    /// A class with this lane and these versions.
    pub fn new(lane: Option<Lane>, versions: impl IntoIterator<Item = Version>) -> Self {
        let mut v: Vec<Version> = Vec::new();
        for version in versions {
            if !v.contains(&version) {
                v.push(version);
            }
        }
        Class { lane, versions: v }
    }

    /// The instance's lane; `None` for baseline.
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The versions the instance serves, without duplicates.
    pub fn versions(&self) -> &[Version] {
        &self.versions
    }
}

/// A request's routing key for one service; see [`Policy::key`].
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Key<'a> {
    lane: Option<&'a Lane>,
    pin: Option<&'a Version>,
    own_lane: bool,
}

// === impl Key ===

impl<'a> Key<'a> {
    /// The request's lane, `None` for baseline.
    pub fn lane(&self) -> Option<&'a Lane> {
        self.lane
    }

    /// The version the request pins for the service.
    pub fn pin(&self) -> Option<&'a Version> {
        self.pin
    }

    /// `true` when the lane is the calling instance's own (the request had no stain).
    pub fn is_own_lane(&self) -> bool {
        self.own_lane
    }
}

/// The subsets a request may use, in order: at most four, no allocation.
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chain<'a> {
    subsets: [Option<Subset<'a>>; 4],
    len: usize,
}

// === impl Chain ===

impl<'a> Chain<'a> {
    fn push(&mut self, subset: Subset<'a>) {
        if let Some(slot) = self.subsets.get_mut(self.len) {
            *slot = Some(subset);
            self.len += 1;
        }
    }

    /// The subsets, primary first.
    pub fn iter(&self) -> impl Iterator<Item = Subset<'a>> + '_ {
        self.subsets[..self.len].iter().flatten().copied()
    }

    /// The number of subsets.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the chain is empty (never, for a chain from [`Policy::chain`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many instances of a subset are present (not ejected) and ready.
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instances present: known and not ejected, ready or not.
    pub present: usize,
    /// Instances ready to take a request now.
    pub ready: usize,
}

/// Where [`Policy::walk`] sends a request.
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'a> {
    /// The subset to pick from.
    pub subset: Subset<'a>,
    /// `true` when it is not the primary subset.
    pub fallback: bool,
    /// Its counts.
    pub counts: Counts,
}

/// Why [`Policy::walk`] found no subset.
// Used by gray-balance; not part of the stable API.
#[doc(hidden)]
// Not `#[non_exhaustive]`: gray-balance matches every variant, and a new one must
// break its build rather than fall through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss<'a> {
    /// No subset the policy allows has an instance.
    NoMatch,
    /// `subset` has `present` instances, none of them ready.
    Unready {
        /// The first allowed subset that had instances.
        subset: Subset<'a>,
        /// How many it had.
        present: usize,
    },
}
