//! The routing kernel: what a balancer runs on every request, and the contract between
//! a [`Policy`] and any index of instances.
//!
//! A policy knows what labels mean and in which order subsets are tried; a balancer knows
//! which instances it has and which are ready. They meet in five calls, made in this
//! order, none of which allocates or locks:
//!
//! 1. **When an instance joins** (not per request), the balancer asks its [`Class`]:
//!    [`Policy::classify`] reads the lane and the versions from its labels. The balancer
//!    files the instance under every [`Subset`] the class belongs to: [`Subset::All`], then
//!    [`Subset::Baseline`] or [`Subset::Lane`], then each [`Subset::Version`] (with
//!    [`Unlabelled::Wildcard`], unlabelled instances also
//!    count for every lane and every version; [`Policy::serves`] says whether a class
//!    belongs to a subset, for a balancer that keeps no index).
//! 2. **Per request**, [`Policy::key`] turns the request's stain into a [`Key`]: its lane
//!    and its version pin for this service (for a request with no stain at all, `None`,
//!    or an [unstained](gray_core::Stain::unstained) one, the policy's own lane applies).
//! 3. [`Policy::walk`] tries the [`Chain`] of subsets the key may use ([`Policy::chain`]:
//!    the pinned version, the lane, baseline, all, as the fallback allows) and asks the
//!    balancer, through a closure, for the [`Counts`] of each: how many of its instances
//!    are present (known and not ejected) and how many are ready now. It stops at the
//!    first subset with a ready instance ([`Route`]), or says why there is none ([`Miss`]):
//!    nothing fits, or the first subset that has instances has none ready and the policy
//!    fails fast.
//! 4. The balancer picks an instance of [`Route::subset`] by its own strategy.
//! 5. On a miss, [`Policy::unroutable`] builds the typed error ([`Unroutable`]) that
//!    names the service, the lane, the pin and the policy.
//!
//! gray-balance's `Balance` is one implementation (an index that answers each count in
//! O(1)); the example below is another, in a few lines. [`Policy::decide`] runs the same
//! walk over a plain list and returns every step as a [`Decision`](crate::Decision).
//!
//! ```
//! use gray_core::{Labels, Lane, Stain};
//! use gray_policy::{Fallback, Policy, route::{Counts, Miss, Subset}};
//!
//! let policy = Policy::new().with_fallback(Fallback::Baseline);
//! // The balancer's instances: a class each (computed once), and whether it is ready.
//! let instances = [
//!     ("b1", policy.classify(&Labels::new()), true),
//!     ("g1", policy.classify(&Labels::from_iter([("gray", "true")])), false),
//! ];
//! let counts = |subset: Subset<'_>| {
//!     let members = instances.iter().filter(|(_, class, _)| policy.serves(class, subset));
//!     members.fold(Counts::default(), |c, (_, _, ready)| Counts {
//!         present: c.present + 1,
//!         ready: c.ready + usize::from(*ready),
//!     })
//! };
//!
//! // A gray request: its only gray instance is present but not ready, and the default
//! // `OnUnready::Fail` fails fast rather than falling back.
//! let gray = Stain::in_lane(Lane::new("gray")?);
//! let key = policy.key("orders", Some(&gray));
//! assert_eq!(policy.chain(&key).iter().collect::<Vec<_>>().len(), 2); // lane, baseline
//! let miss = policy.walk(&key, counts).unwrap_err();
//! assert_eq!(miss, Miss::Unready { subset: Subset::Lane(key.lane().unwrap()), present: 1 });
//! let error = policy.unroutable("orders", &key, &miss);
//! assert_eq!(error.service(), "orders");
//!
//! // A baseline request is routed to the baseline subset, where `b1` is ready.
//! let baseline = Stain::baseline();
//! let key = policy.key("orders", Some(&baseline));
//! let route = policy.walk(&key, counts).unwrap();
//! assert_eq!((route.subset, route.fallback, route.counts.ready), (Subset::Baseline, false, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::Serialize;

pub use crate::subset::Subset;
use crate::{
    error::{Unroutable, UnroutableReason},
    policy::{Fallback, FlagValues, OnUnready, Policy, Unlabelled},
};
use gray_core::{Labels, Lane, Stain, Version};

// === impl Policy ===

/// The routing kernel's side of a policy; see the [module docs](self).
impl Policy {
    /// The [`Class`] of an instance with these labels: its lane (the lane label, else the
    /// flag label's lane) and the versions it serves (the version label and the version
    /// list, without duplicates). A label value that is not a valid name counts as absent
    /// (a debug event, target `gray::matching`). Call it when an instance joins, not per
    /// request.
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
        if lane.is_none()
            && let Some(value) = self.flag_key.as_deref().and_then(|k| labels.get(k))
        {
            let gray = match self.flag_values {
                FlagValues::Lenient => value.eq_ignore_ascii_case("true"),
                FlagValues::Exact => value == "true",
            };
            if gray {
                lane = Some(self.flag_lane.clone());
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

    /// `true` when an instance of class `class` belongs to `subset` (with
    /// [`Unlabelled::Wildcard`], an instance without a lane belongs to every lane, and one
    /// without versions to every version).
    #[must_use]
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
    /// `stain` is `None` when the request carries no stain at all. Then, and for an
    /// [unstained](Stain::unstained) stain (what gray-tower's `ExtractStainLayer` gives a
    /// request without any carrier), the policy's own lane applies
    /// ([`Policy::with_own_lane`], seed 000); an explicit [baseline](Stain::baseline) stain
    /// (`gray: false`) stays baseline.
    #[must_use]
    pub fn key<'a>(&'a self, service: &str, stain: Option<&'a Stain>) -> Key<'a> {
        if !self.enabled {
            return Key::default();
        }
        let stain = stain.filter(|s| !s.is_unstained());
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

    /// The subsets a request with `key` may use, in order: the primary one (the pinned
    /// version, else the lane, else baseline), then what the [`Fallback`] allows.
    #[must_use]
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

    /// The typed error for a request to `service` with `key` that `miss`ed: what a
    /// balancer returns (a gateway answers 503).
    #[must_use]
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

    /// The error for a request whose walk ended at `subset`, every ready instance of which
    /// has `limit` requests in flight already.
    #[must_use]
    pub fn saturated(
        &self,
        service: &str,
        key: &Key<'_>,
        subset: Subset<'_>,
        limit: u32,
    ) -> Unroutable {
        let mut unroutable = self.unroutable(service, key, &Miss::NoMatch);
        unroutable.reason = UnroutableReason::Saturated {
            subset: subset.to_owned(),
            limit,
        };
        unroutable
    }
}

/// What an instance's labels mean to a [`Policy`]: its lane and the versions it serves
/// ([`Policy::classify`]).
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
    #[must_use]
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The versions the instance serves, without duplicates.
    #[must_use]
    pub fn versions(&self) -> &[Version] {
        &self.versions
    }
}

/// A request's routing key for one service: its lane and its version pin for that service
/// ([`Policy::key`]). Borrows the request's stain (or the policy's own lane): no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Key<'a> {
    lane: Option<&'a Lane>,
    pin: Option<&'a Version>,
    own_lane: bool,
}

// === impl Key ===

impl<'a> Key<'a> {
    /// The request's lane, `None` for baseline.
    #[must_use]
    pub fn lane(&self) -> Option<&'a Lane> {
        self.lane
    }

    /// The version the request pins for the service.
    #[must_use]
    pub fn pin(&self) -> Option<&'a Version> {
        self.pin
    }

    /// `true` when the lane is the calling instance's own (the request had no stain, or an
    /// unstained one).
    #[must_use]
    pub fn is_own_lane(&self) -> bool {
        self.own_lane
    }
}

/// The subsets a request may use, in order: at most four, no allocation
/// ([`Policy::chain`]).
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
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the chain is empty (never, for a chain from [`Policy::chain`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many instances of a subset are present (not ejected) and ready: what a balancer
/// answers for each subset during [`Policy::walk`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instances present: known and not ejected, ready or not.
    pub present: usize,
    /// Instances ready to take a request now.
    pub ready: usize,
}

/// Where [`Policy::walk`] sends a request: the subset to pick from.
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
///
/// Deliberately not `#[non_exhaustive]`: a balancer must handle every way a walk can end,
/// so a new one is a breaking change of this contract, not a silent fall-through.
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
