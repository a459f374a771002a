//! Client side: write the stain onto every outbound request.
//!
//! [`PropagateStainLayer`] wraps any `tower::Service<http::Request<B>>` client: the
//! hyper-util `Client`, a tonic `Channel`, a balancer. For each request it takes the stain
//! from the request extensions first, else from the task-local stain (see
//! [`crate::task`]), else (feature `opentelemetry`) from the lane in the current
//! OpenTelemetry baggage (module `otel`), and states it on every configured carrier. A
//! request with none of them is sent as it is.
//!
//! # The decision wins
//!
//! By default ([`Existing::Replace`]) every configured carrier states the stain's decision,
//! whatever the outbound request already holds, for example because the handler copied
//! the inbound headers: a stale, duplicated, malformed or conflicting `x-gray-lane` or
//! `baggage` member is replaced, and a baseline stain removes them (a baseline request
//! never carries a forged stain onward). Other headers and other `baggage` members stay.
//! With a `baggage` carrier, the stain's inherited members (the inbound request's other
//! `baggage` members) are written too, after the members the request already has, which
//! win over inherited ones of the same key.
//!
//! [`Existing::KeepIfPresent`] is the explicit opt-in for the opposite: when any configured
//! carrier is already on the request, the stain carriers are sent as they are (only the
//! inherited `baggage` members are added).
//!
//! ```
//! use gray_tower::{Lane, Stain, StainExt, PropagateStainLayer};
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // A stand-in for an HTTP client: answers with the lane header it was sent.
//! let client = ServiceBuilder::new()
//!     .layer(PropagateStainLayer::new())
//!     .service(service_fn(|req: Request<()>| async move {
//!         let sent = req.headers().get("x-gray-lane").cloned();
//!         Ok::<_, tower::BoxError>(Response::new(sent))
//!     }));
//!
//! // A stale lane on the request is replaced by the stain's decision.
//! let stale = Request::builder().header("x-gray-lane", "blue").body(())?;
//! let stain = Stain::in_lane(Lane::new("canary")?);
//! let res = client.oneshot(stale).with_stain(stain).await?;
//! assert_eq!(res.body().as_ref().unwrap(), "canary");
//! # Ok(())
//! # }
//! ```

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{Carriers, Stain};
use http::{Extensions, HeaderMap, Request};
use tower_layer::Layer;
use tower_service::Service;

use crate::task;

/// What to do with an outbound request that already carries a stain carrier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Existing {
    /// Every configured carrier states the stain's decision; stale, duplicated, malformed
    /// or conflicting copies on the request are replaced (the default).
    #[default]
    Replace,
    /// When any configured carrier is already on the request, send the stain carriers as
    /// they are: the request's own stain wins over the decision. The stain's inherited
    /// `baggage` members are still added.
    KeepIfPresent,
}

/// How a stain is written onto outbound headers; shared by [`PropagateStain`] and the
/// reqwest middleware.
#[derive(Debug, Clone, Default)]
pub(crate) struct Propagator {
    pub(crate) carriers: Carriers,
    pub(crate) existing: Existing,
}

impl Propagator {
    /// Writes the request's stain into `headers`, found by [`task::outbound`] (the
    /// extensions, else the task-local one, else the OpenTelemetry lane; one found in
    /// OpenTelemetry is recorded in `extensions`, where a balancer below, or gray-balance's
    /// reqwest routing in either order, reads it).
    pub(crate) fn apply(&self, extensions: &mut Extensions, headers: &mut HeaderMap) {
        if let Some(stain) = task::outbound(extensions, &self.carriers) {
            self.write(&stain, headers);
        }
    }

    fn write(&self, stain: &Stain, headers: &mut HeaderMap) {
        match self.existing {
            Existing::KeepIfPresent if self.carriers.is_present(headers) => {
                self.carriers.merge_baggage(stain, headers);
            }
            Existing::KeepIfPresent | Existing::Replace => self.carriers.inject(stain, headers),
        }
    }
}

/// Builds [`PropagateStain`]: writes the stain onto each outbound request.
///
/// `PropagateStainLayer::new()` writes the default carriers (`x-gray-lane`, `x-gray-info`)
/// with [`Existing::Replace`]; the `with_*` setters change one setting each, in any order.
#[derive(Debug, Clone, Default)]
pub struct PropagateStainLayer {
    propagator: Arc<Propagator>,
}

impl PropagateStainLayer {
    /// Writes the default carriers (`x-gray-lane` and `x-gray-info`); the decision wins.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `carriers` (use the same ones as the server layer).
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        Arc::make_mut(&mut self.propagator).carriers = carriers;
        self
    }

    /// Sets the rule for a request that already carries a stain (default
    /// [`Existing::Replace`]).
    #[must_use]
    pub fn with_existing(mut self, existing: Existing) -> Self {
        Arc::make_mut(&mut self.propagator).existing = existing;
        self
    }

    /// The carriers this layer writes.
    #[must_use]
    pub fn carriers(&self) -> &Carriers {
        &self.propagator.carriers
    }
}

impl<S> Layer<S> for PropagateStainLayer {
    type Service = PropagateStain<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateStain::with_propagator(inner, self.propagator.clone())
    }
}

/// Writes the stain of the request (extensions first, else the task-local one) onto it.
///
/// Built by [`PropagateStainLayer`]. Adds nothing to the response future.
#[derive(Debug, Clone)]
pub struct PropagateStain<S> {
    inner: S,
    propagator: Arc<Propagator>,
}

impl<S> PropagateStain<S> {
    /// Wraps `inner`, writing the default carriers.
    pub fn new(inner: S) -> Self {
        Self::with_propagator(inner, Arc::default())
    }

    fn with_propagator(inner: S, propagator: Arc<Propagator>) -> Self {
        PropagateStain { inner, propagator }
    }

    define_inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for PropagateStain<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        self.propagator
            .apply(&mut parts.extensions, &mut parts.headers);
        self.inner.call(Request::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use gray_core::{Lane, codec::InheritedBaggage};
    use http::{HeaderValue, Response};
    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::StainExt;

    /// Sends `req` through `layer` under `stain`; returns the headers the client got.
    async fn sent(layer: PropagateStainLayer, req: Request<()>, stain: Stain) -> HeaderMap {
        let client = layer.layer(service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(Response::new(req.headers().clone()))
        }));
        client
            .oneshot(req)
            .with_stain(stain)
            .await
            .unwrap()
            .into_body()
    }

    fn with_headers(pairs: &[(&'static str, &'static str)]) -> Request<()> {
        let mut req = Request::new(());
        for (k, v) in pairs {
            req.headers_mut().append(*k, HeaderValue::from_static(v));
        }
        req
    }

    fn gray() -> Stain {
        Stain::in_lane(Lane::new("gray").unwrap())
    }

    #[tokio::test]
    async fn the_decision_replaces_stale_duplicated_and_malformed_carriers() {
        let layer = PropagateStainLayer::new().with_carriers(Carriers::default().with_baggage());
        for pairs in [
            &[("x-gray-lane", "blue")][..],
            &[("x-gray-lane", "gray"), ("x-gray-lane", "gray")],
            &[("x-gray-lane", "a b")],
            &[("baggage", "gray.lane=gray,gray.lane=gray")],
            &[("baggage", "gray.lane=%%")],
            &[("x-gray-lane", "gray"), ("baggage", "gray.lane=blue")],
        ] {
            let mut pairs = pairs.to_vec();
            pairs.push(("baggage", "tenant=acme"));
            pairs.push(("accept", "*/*"));
            let headers = sent(layer.clone(), with_headers(&pairs), gray()).await;
            assert_eq!(headers["x-gray-lane"], "gray", "{pairs:?}");
            assert_eq!(headers.get_all("x-gray-lane").iter().count(), 1);
            assert_eq!(
                headers["baggage"], "tenant=acme,gray.lane=gray",
                "{pairs:?}"
            );
            assert_eq!(headers["accept"], "*/*");

            // A baseline decision removes every stain carrier, forged or not.
            let headers = sent(layer.clone(), with_headers(&pairs), Stain::baseline()).await;
            assert_eq!(headers.get("x-gray-lane"), None, "{pairs:?}");
            assert_eq!(headers["baggage"], "tenant=acme", "{pairs:?}");
        }
    }

    #[tokio::test]
    async fn keep_if_present_is_an_explicit_opt_in() {
        let layer = PropagateStainLayer::new()
            .with_existing(Existing::KeepIfPresent)
            .with_carriers(Carriers::default().with_baggage());
        let inherited = InheritedBaggage::parse("userId=42").unwrap();
        let stain = gray().with_baggage(Some(inherited));
        let headers = sent(
            layer.clone(),
            with_headers(&[("x-gray-lane", "blue")]),
            stain.clone(),
        )
        .await;
        assert_eq!(headers["x-gray-lane"], "blue");
        assert_eq!(headers["baggage"], "userId=42");
        let headers = sent(layer, Request::new(()), stain).await;
        assert_eq!(headers["x-gray-lane"], "gray");
        assert_eq!(headers["baggage"], "userId=42,gray.lane=gray");
        assert_eq!(Existing::default(), Existing::Replace);
    }

    #[tokio::test]
    async fn without_any_stain_the_request_is_sent_as_it_is() {
        let client = PropagateStain::new(service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(Response::new(req.headers().clone()))
        }));
        let req = with_headers(&[("x-gray-lane", "blue")]);
        let headers = client.oneshot(req).await.unwrap().into_body();
        assert_eq!(headers["x-gray-lane"], "blue");
    }
}
