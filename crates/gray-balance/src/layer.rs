use std::{fmt, hash::Hash, marker::PhantomData, sync::Arc};

use gray_core::Policy;
use tower::discover::Discover;
use tower_layer::Layer;

use crate::{
    Balance, Pick,
    health::{Classifier, Ejection, is_connection_error},
    service::RecordRouted,
};

/// Builds a [`Balance`] over a discover stream: `layer.layer(discover)`.
///
/// Holds the target service's name, its [`Policy`], how to [`Pick`] among ready
/// endpoints, when to [eject](Ejection) endpoints and how to recognise a connection error
/// ([`Classifier`]).
pub struct BalanceLayer<Req> {
    service: Arc<str>,
    policy: Policy,
    pick: Pick,
    ejection: Ejection,
    classify: Classifier,
    routed: RecordRouted,
    _req: PhantomData<fn(Req)>,
}

impl<Req> BalanceLayer<Req> {
    /// A layer for calls to `service` routed by `policy`, with Peak-EWMA p2c, the
    /// default [`Ejection`] and [`is_connection_error`].
    pub fn new(service: impl AsRef<str>, policy: Policy) -> Self {
        BalanceLayer {
            service: service.as_ref().into(),
            policy,
            pick: Pick::default(),
            ejection: Ejection::default(),
            classify: is_connection_error,
            routed: RecordRouted::Never,
            _req: PhantomData,
        }
    }

    /// How to pick among the ready endpoints of a subset.
    pub fn with_pick(mut self, pick: Pick) -> Self {
        self.pick = pick;
        self
    }

    /// When and for how long to eject endpoints.
    pub fn with_ejection(mut self, ejection: Ejection) -> Self {
        self.ejection = ejection;
        self
    }

    /// How to recognise a connection error.
    pub fn with_classifier(mut self, classify: Classifier) -> Self {
        self.classify = classify;
        self
    }

    /// Records on the requests `record` selects how they were routed
    /// ([`Routed`](crate::Routed), in the request extensions for `http::Request`), so the
    /// endpoint service or a layer around it can report the subset and whether a fallback
    /// was taken. [`RecordRouted::Never`] by default: a record costs one extensions insert;
    /// [`RecordRouted::Fallbacks`] pays it only for the requests that fell back.
    pub fn with_routed(mut self, record: RecordRouted) -> Self {
        self.routed = record;
        self
    }

    /// Builds the balancer over `discover` (the same as [`Layer::layer`]).
    pub fn build<D>(&self, discover: D) -> Balance<D, Req>
    where
        D: Discover,
        D::Key: Hash + Eq + Clone,
    {
        Balance::from_parts(
            discover,
            self.service.clone(),
            self.policy.clone(),
            self.pick,
            self.ejection,
            self.classify,
            self.routed,
        )
    }
}

impl<Req> Clone for BalanceLayer<Req> {
    fn clone(&self) -> Self {
        BalanceLayer {
            service: self.service.clone(),
            policy: self.policy.clone(),
            pick: self.pick,
            ejection: self.ejection,
            classify: self.classify,
            routed: self.routed,
            _req: PhantomData,
        }
    }
}

impl<Req> fmt::Debug for BalanceLayer<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalanceLayer")
            .field("service", &self.service)
            .field("policy", &self.policy)
            .field("pick", &self.pick)
            .field("ejection", &self.ejection)
            .finish()
    }
}

impl<D, Req> Layer<D> for BalanceLayer<Req>
where
    D: Discover,
    D::Key: Hash + Eq + Clone,
{
    type Service = Balance<D, Req>;

    fn layer(&self, discover: D) -> Self::Service {
        self.build(discover)
    }
}
