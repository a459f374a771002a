//! What [`Policy::decide`] returns: a routing [`Decision`] as a value, for admin endpoints
//! and logs.

use serde::{Deserialize, Serialize};

use super::{
    error::Unroutable,
    route::{Class, Counts},
    subset::OwnedSubset,
};
use gray_core::{Labels, Lane, Stain, Version};

use crate::Policy;

// === impl Policy ===

impl Policy {
    /// Decides, for a request to `service` carrying `stain` (`None`: no stain at all),
    /// which of `instances` may serve it; the same walk the balancer does per request, as
    /// a value (a gateway shows it on its admin endpoint). The balancer then picks one
    /// of the [candidates](Decision::candidates) by load.
    pub fn decide<'i, Id: Clone + 'i>(
        &self,
        service: &str,
        stain: Option<&Stain>,
        instances: impl IntoIterator<Item = Candidate<'i, Id>>,
    ) -> Decision<Id> {
        let key = self.key(service, stain);
        let classed: Vec<(Id, Class, Availability)> = instances
            .into_iter()
            .map(|c| (c.id, self.classify(c.labels), c.availability))
            .collect();
        let mut steps = Vec::new();
        let walked = self.walk(&key, |subset| {
            let mut counts = Counts::default();
            for (_, class, availability) in &classed {
                if *availability != Availability::Ejected && self.serves(class, subset) {
                    counts.present += 1;
                    counts.ready += usize::from(*availability == Availability::Ready);
                }
            }
            steps.push(Step {
                subset: subset.to_owned(),
                present: counts.present,
                ready: counts.ready,
            });
            counts
        });
        let outcome = match walked {
            Ok(route) => Outcome::Routed {
                subset: route.subset.to_owned(),
                fallback: route.fallback,
                candidates: classed
                    .iter()
                    .filter(|(_, class, a)| {
                        *a == Availability::Ready && self.serves(class, route.subset)
                    })
                    .map(|(id, _, _)| id.clone())
                    .collect(),
            },
            Err(miss) => Outcome::Unroutable(self.unroutable(service, &key, &miss)),
        };
        Decision {
            service: service.to_owned(),
            policy: self.name.to_string(),
            lane: key.lane().cloned(),
            pin: key.pin().cloned(),
            own_lane: key.is_own_lane(),
            steps,
            outcome,
        }
    }
}

/// The availability of one instance handed to [`Policy::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Availability {
    /// Ready to take a request.
    Ready,
    /// Known, but not ready yet.
    Unready,
    /// Ejected by passive health checking: counts as absent.
    Ejected,
}

/// One instance handed to [`Policy::decide`].
#[derive(Debug, Clone)]
pub struct Candidate<'a, Id> {
    id: Id,
    labels: &'a Labels,
    availability: Availability,
}

impl<'a, Id> Candidate<'a, Id> {
    /// An instance named `id`, with its labels and availability.
    pub fn new(id: Id, labels: &'a Labels, availability: Availability) -> Self {
        Candidate {
            id,
            labels,
            availability,
        }
    }
}

/// One subset [`Policy::decide`] looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Step {
    /// The subset.
    pub subset: OwnedSubset,
    /// Instances present in it.
    pub present: usize,
    /// Instances ready in it.
    pub ready: usize,
}

/// The end of a [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Outcome<Id> {
    /// The request goes to one of `candidates`, all ready, in `subset`.
    Routed {
        /// The subset picked from.
        subset: OwnedSubset,
        /// `true` when it is a fallback subset.
        fallback: bool,
        /// The ready instances of the subset, in input order.
        candidates: Vec<Id>,
    },
    /// The request fails with this error.
    Unroutable(Unroutable),
}

/// A routing decision as a value; see [`Policy::decide`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Decision<Id> {
    /// The target service.
    pub service: String,
    /// The policy's name.
    pub policy: String,
    /// The request's lane (`None`: baseline).
    pub lane: Option<Lane>,
    /// The version pinned for the service.
    pub pin: Option<Version>,
    /// `true` when the lane is the calling instance's own (the request had no stain).
    pub own_lane: bool,
    /// The subsets looked at, in order.
    pub steps: Vec<Step>,
    /// Where the request goes.
    pub outcome: Outcome<Id>,
}

impl<Id> Decision<Id> {
    /// The ready instances the request may go to, or `None` when it is unroutable.
    #[must_use]
    pub fn candidates(&self) -> Option<&[Id]> {
        match &self.outcome {
            Outcome::Routed { candidates, .. } => Some(candidates),
            Outcome::Unroutable(_) => None,
        }
    }

    /// `true` when the request goes to a fallback subset.
    #[must_use]
    pub fn fallback_taken(&self) -> bool {
        matches!(self.outcome, Outcome::Routed { fallback: true, .. })
    }

    /// The error, when the request is unroutable.
    #[must_use]
    pub fn error(&self) -> Option<&Unroutable> {
        match &self.outcome {
            Outcome::Unroutable(e) => Some(e),
            Outcome::Routed { .. } => None,
        }
    }
}
