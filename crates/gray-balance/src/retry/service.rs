//! [`Retry`], the retrying service over a balancer, and its [`RetryLayer`].

use std::{
    fmt,
    task::{Context, Poll},
};

use gray_core::Stain;
use http::Request;
use http_body::Body;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use super::{Copies, ReplayBody, RetryFuture};
use crate::{
    Balance, RequestStain,
    index::{Entry, Tried},
    meter::Ticket,
    pick::Routed,
};

/// Wraps a [`Balance`] in a [`Retry`]: `ServiceBuilder::new().layer(RetryLayer::new())`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryLayer {
    _private: (),
}

impl RetryLayer {
    /// The layer; the policy is the balancer's ([`BalanceLayer::with_retry`](crate::BalanceLayer::with_retry)).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl<K, S> Layer<Balance<K, S>> for RetryLayer {
    type Service = Retry<K, S>;

    fn layer(&self, balance: Balance<K, S>) -> Retry<K, S> {
        Retry::new(balance)
    }
}

/// A [`Balance`] of HTTP endpoints that sends a request again, to another endpoint, when
/// that is safe; see the [module docs](super). Takes `http::Request<B>`; its endpoints
/// take `http::Request<ReplayBody<B>>`. A cheap handle: clone it for every caller.
pub struct Retry<K, S> {
    balance: Balance<K, S>,
}

impl<K, S> Clone for Retry<K, S> {
    fn clone(&self) -> Self {
        Retry {
            balance: self.balance.clone(),
        }
    }
}

impl<K, S> fmt::Debug for Retry<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("balance", &self.balance)
            .field("policy", self.balance.retry_policy())
            .finish()
    }
}

impl<K, S> Retry<K, S> {
    /// Retries over `balance`, by its policy.
    #[must_use]
    pub fn new(balance: Balance<K, S>) -> Self {
        Retry { balance }
    }

    /// The balancer.
    #[must_use]
    pub fn get_ref(&self) -> &Balance<K, S> {
        &self.balance
    }

    /// The balancer.
    #[must_use]
    pub fn into_inner(self) -> Balance<K, S> {
        self.balance
    }
}

/// An endpoint chosen for one attempt: a clone of its service, the claim on it and how
/// the request was routed.
pub(super) struct Chosen<K: Send + Sync, S: Send + Sync> {
    pub(super) service: S,
    pub(super) ticket: Ticket<Entry<K, S>>,
    pub(super) routed: Option<Routed>,
    /// When it was picked on the balancer's clock, if the pick read it.
    pub(super) start: u64,
}

impl<K, S> Balance<K, S>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Clone + Send + Sync + 'static,
{
    /// Picks an endpoint for a request carrying `stain`, as if those in `tried` were
    /// ejected.
    pub(super) fn choose_for(
        &self,
        stain: Option<&Stain>,
        tried: &Tried,
    ) -> Result<Chosen<K, S>, gray_policy::Unroutable> {
        let inner = &*self.inner;
        let snapshot = inner.snapshot.load();
        let stain = gray_core::task::or_current(stain);
        let key = inner
            .router
            .policy
            .key(&inner.router.service, stain.as_deref());
        let choice = inner.router.choose(&snapshot, &key, tried)?;
        Ok(Chosen {
            service: choice.slot.entry.service.clone(),
            ticket: Ticket::new(choice.slot.entry.clone(), choice.probe, choice.start),
            routed: choice.routed(inner.router.record),
            start: choice.start,
        })
    }
}

/// A copy of `request` to send again, if its body can be sent again.
pub(super) fn copy<B>(request: &Request<ReplayBody<B>>) -> Option<Request<ReplayBody<B>>> {
    let body = request.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

impl<K, S, B> Service<Request<B>> for Retry<K, S>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Service<Request<ReplayBody<B>>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = RetryFuture<K, S, B>;

    /// Always ready, as the balancer.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    /// Picks an endpoint as the balancer does, and returns the future that calls it and,
    /// when its attempt fails where that is safe, another one.
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let retries = &self.balance.inner.retries;
        let enabled = retries.enabled();
        let (parts, body) = request.into_parts();
        let idempotent = enabled && retries.policy.is_idempotent(&parts.method);
        let kept = idempotent || (enabled && retries.policy.copies() == Copies::All);
        let body = match kept {
            true => ReplayBody::buffered(body, retries.policy.max_replay_bytes()),
            false => ReplayBody::once(body),
        };
        let mut request = Request::from_parts(parts, body);
        let chosen = self.balance.choose_for(request.gray_stain(), &Tried::NONE);
        let chosen = match chosen {
            Ok(chosen) => chosen,
            Err(e) => return RetryFuture::failed(Box::new(e)),
        };
        if enabled {
            let now = match chosen.start {
                0 => self.balance.inner.router.clock.now(),
                start => start,
            };
            retries.deposit(now);
        }
        if let Some(routed) = chosen.routed {
            request.record_routed(routed);
        }
        let again = enabled.then(|| self.balance.clone());
        RetryFuture::new(
            chosen.service,
            request,
            chosen.ticket,
            again,
            kept,
            idempotent,
        )
    }
}
