//! Server side: read the stain of every inbound request.
//!
//! [`ExtractStainLayer`] reads the configured [`Carriers`] of each request, puts the
//! resulting [`Stain`] into the request extensions, and makes it the task-local stain
//! (see [`crate::task`]) for both the synchronous `call()` of the inner service and every
//! poll of its response future. A request without any carrier gets the layer's default
//! stain, [`Stain::unstained`] unless [`ExtractStainLayer::with_default`] says otherwise.
//! An unstained request is baseline traffic, except for a balancer whose policy has an
//! own lane (gray-policy's `Policy::with_own_lane`, seed 000): it routes the request into
//! that lane, so a gray instance keeps its unstained traffic gray. An explicit carrier,
//! `gray: false` included (or a malformed one), is a decision and stays as it says.
//!
//! With a `baggage` carrier ([`Carriers::with_baggage`]), the stain also keeps the
//! request's other `baggage` members ([`Stain::baggage`]), and the client layers write them
//! onto every outbound call: no handler copies headers.
//!
//! Malformed carriers never fail the request: they are ignored, with a `tracing` event.
//!
//! ```
//! use gray_tower::{ExtractStainLayer, Stain, task};
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let svc = ServiceBuilder::new()
//!     .layer(ExtractStainLayer::new())
//!     .service(service_fn(|req: Request<()>| async move {
//!         let from_extensions = req.extensions().get::<Stain>().cloned();
//!         let from_task = task::current();
//!         assert_eq!(from_extensions, from_task);
//!         let lane = from_task.and_then(|c| c.lane().map(|l| l.to_string()));
//!         Ok::<_, tower::BoxError>(Response::new(lane.unwrap_or_default()))
//!     }));
//!
//! let req = Request::builder().header("x-gray-lane", "canary").body(())?;
//! let res = svc.oneshot(req).await?;
//! assert_eq!(res.body(), "canary");
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{Carriers, Stain};
use http::Request;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower_layer::Layer;
use tower_service::Service;

use crate::task;

#[derive(Debug, Clone, Default)]
struct Config {
    carriers: Carriers,
    default: Stain,
}

/// Builds [`ExtractStain`]: reads the stain of each inbound request.
///
/// `ExtractStainLayer::new()` reads the default carriers (`x-gray-lane`, `x-gray-info`)
/// with the [unstained](Stain::unstained) default; the `with_*` setters change one setting
/// each, in any order.
#[derive(Debug, Clone, Default)]
pub struct ExtractStainLayer {
    config: Arc<Config>,
}

impl ExtractStainLayer {
    /// Reads the default carriers (`x-gray-lane` and `x-gray-info`).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `carriers` (use the same ones on the client layers).
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        Arc::make_mut(&mut self.config).carriers = carriers;
        self
    }

    /// Uses `stain` for requests that carry no stain carrier at all (an explicit
    /// `gray: false` still means baseline). The default, [`Stain::unstained`], lets each
    /// balancer apply its policy's own lane (seed 000: `Policy::with_own_lane` on a gray
    /// instance), and writes no carrier onward. A lane set here instead is the request's
    /// lane everywhere: every balancer routes by it and every client writes it onward.
    #[must_use]
    pub fn with_default(mut self, stain: Stain) -> Self {
        Arc::make_mut(&mut self.config).default = stain;
        self
    }

    /// The carriers this layer reads.
    #[must_use]
    pub fn carriers(&self) -> &Carriers {
        &self.config.carriers
    }
}

impl<S> Layer<S> for ExtractStainLayer {
    type Service = ExtractStain<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ExtractStain::with_config(inner, self.config.clone())
    }
}

/// Reads the stain of each inbound request into its extensions and the task-local stain.
///
/// Built by [`ExtractStainLayer`].
#[derive(Debug, Clone)]
pub struct ExtractStain<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ExtractStain<S> {
    /// Wraps `inner`, reading the default carriers.
    pub fn new(inner: S) -> Self {
        Self::with_config(inner, Arc::default())
    }

    fn with_config(inner: S, config: Arc<Config>) -> Self {
        ExtractStain { inner, config }
    }

    define_inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for ExtractStain<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = StainedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let stain = self
            .config
            .carriers
            .extract_or(req.headers(), &self.config.default);
        StainedFuture::stained(stain, req, &mut self.inner)
    }
}

/// The former name of [`StainedFuture`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `StainedFuture` (one name for one thing); removed in 0.4.0"
)]
pub type ResponseFuture<F> = StainedFuture<F>;

pin_project! {
    /// The response future of [`ExtractStain`]: the inner future, polled with the
    /// request's stain as the task-local stain.
    #[derive(Debug)]
    pub struct StainedFuture<F> {
        #[pin]
        inner: Scope<F>,
    }
}

pin_project! {
    /// The inner future, in the stain's task-local scope or (the edge with
    /// `with_task_local(false)`) as it is.
    #[derive(Debug)]
    #[project = ScopeProj]
    enum Scope<F> {
        TaskLocal { #[pin] fut: TaskLocalFuture<Stain, F> },
        Plain { #[pin] fut: F },
    }
}

impl<F: Future> StainedFuture<F> {
    /// Puts `stain` into the request extensions and calls `inner` with it as the
    /// task-local stain, which stays set for every poll of the returned future: what
    /// [`ExtractStain`] and the edge do once they know a request's stain.
    pub(crate) fn stained<S, B>(stain: Stain, mut req: Request<B>, inner: &mut S) -> Self
    where
        S: Service<Request<B>, Future = F>,
    {
        req.extensions_mut().insert(stain.clone());
        Self::in_scope(stain, req, inner)
    }

    /// Puts `stain` into the request extensions and calls `inner`, with no task-local
    /// stain: the edge with `with_task_local(false)`.
    pub(crate) fn stained_unscoped<S, B>(stain: Stain, mut req: Request<B>, inner: &mut S) -> Self
    where
        S: Service<Request<B>, Future = F>,
    {
        req.extensions_mut().insert(stain);
        StainedFuture {
            inner: Scope::Plain {
                fut: inner.call(req),
            },
        }
    }

    fn in_scope<S, R>(stain: Stain, req: R, inner: &mut S) -> Self
    where
        S: Service<R, Future = F>,
    {
        let fut = task::sync_scope(stain.clone(), || inner.call(req));
        StainedFuture {
            inner: Scope::TaskLocal {
                fut: task::scope(stain, fut),
            },
        }
    }
}

impl<F: Future> Future for StainedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.project() {
            ScopeProj::TaskLocal { fut } => fut.poll(cx),
            ScopeProj::Plain { fut } => fut.poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use gray_core::{
        Lane,
        codec::{PlainHeader, RouteHeader},
    };
    use http::{HeaderName, Response};
    use tower::{ServiceExt, service_fn};

    use super::*;

    async fn lane_seen(layer: ExtractStainLayer, req: Request<()>) -> Option<String> {
        let svc = layer.layer(service_fn(|req: Request<()>| async move {
            // The future is polled after an await point: the scope must still hold.
            tokio::task::yield_now().await;
            let ext = req.extensions().get::<Stain>().cloned();
            assert_eq!(ext, task::current());
            Ok::<_, std::convert::Infallible>(Response::new(
                task::current().and_then(|c| c.lane().map(ToString::to_string)),
            ))
        }));
        svc.oneshot(req).await.unwrap().into_body()
    }

    #[tokio::test]
    async fn stained_and_unstained_requests() {
        let req = Request::builder()
            .header("x-gray-lane", "gray")
            .body(())
            .unwrap();
        assert_eq!(
            lane_seen(ExtractStainLayer::new(), req).await.as_deref(),
            Some("gray")
        );
        let req = Request::new(());
        assert_eq!(lane_seen(ExtractStainLayer::new(), req).await, None);
    }

    /// What the layer puts into the extensions of `req`.
    async fn stain_seen(layer: ExtractStainLayer, req: Request<()>) -> Stain {
        let svc = layer.layer(service_fn(|req: Request<()>| async move {
            let stain = req.extensions().get::<Stain>().cloned().unwrap();
            assert_eq!(Some(&stain), task::current().as_ref());
            Ok::<_, std::convert::Infallible>(Response::new(stain))
        }));
        svc.oneshot(req).await.unwrap().into_body()
    }

    #[tokio::test]
    async fn no_carrier_is_unstained_and_an_explicit_one_is_decided() {
        let gray = Lane::new("gray").unwrap();
        let layer = ExtractStainLayer::new().with_carriers(
            Carriers::new().with(PlainHeader::flag(HeaderName::from_static("gray"), gray)),
        );
        let absent = stain_seen(layer.clone(), Request::new(())).await;
        assert!(absent.is_unstained());
        for value in ["false", "FALSE", "maybe"] {
            let req = Request::builder().header("gray", value).body(()).unwrap();
            assert_eq!(
                stain_seen(layer.clone(), req).await,
                Stain::baseline(),
                "{value}"
            );
        }
    }

    #[tokio::test]
    async fn malformed_inputs_are_unstained() {
        let carriers = Carriers::new()
            .with(PlainHeader::lane(HeaderName::from_static("x-gray-lane")))
            .with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
        for (name, value) in [
            ("x-gray-lane", &b"\xff\xfe"[..]),
            ("x-gray-lane", &[b'a'; 300][..]),
            ("x-gray-info", b"{not json"),
        ] {
            let mut req = Request::new(());
            req.headers_mut()
                .insert(name, http::HeaderValue::from_bytes(value).unwrap());
            let layer = ExtractStainLayer::new().with_carriers(carriers.clone());
            assert_eq!(lane_seen(layer, req).await, None);
        }
    }

    #[tokio::test]
    async fn default_applies_only_without_a_carrier() {
        let gray = Lane::new("gray").unwrap();
        // Settings in any order.
        let layer = ExtractStainLayer::new()
            .with_default(Stain::in_lane(gray.clone()))
            .with_carriers(
                Carriers::new().with(PlainHeader::flag(HeaderName::from_static("gray"), gray)),
            );
        assert_eq!(
            lane_seen(layer.clone(), Request::new(())).await.as_deref(),
            Some("gray")
        );
        let explicit = Request::builder().header("gray", "False").body(()).unwrap();
        assert_eq!(lane_seen(layer, explicit).await, None);
    }

    #[tokio::test]
    async fn the_stain_keeps_the_other_baggage_members_even_by_default() {
        let gray = Lane::new("gray").unwrap();
        let layer = ExtractStainLayer::new()
            .with_carriers(Carriers::default().with_baggage())
            .with_default(Stain::in_lane(gray));
        let svc = layer.layer(service_fn(|req: Request<()>| async move {
            let stain = req.extensions().get::<Stain>().cloned().unwrap();
            assert_eq!(Some(&stain), task::current().as_ref());
            Ok::<_, std::convert::Infallible>(Response::new(stain))
        }));
        let req = Request::builder()
            .header("baggage", "userId=42;ttl=5")
            .body(())
            .unwrap();
        let stain = svc.clone().oneshot(req).await.unwrap().into_body();
        assert_eq!(stain.lane().unwrap(), "gray", "the default decides");
        assert_eq!(stain.baggage().unwrap().as_str(), "userId=42;ttl=5");
        let req = Request::builder()
            .header("x-gray-lane", "Blue")
            .body(())
            .unwrap();
        let stain = svc.oneshot(req).await.unwrap().into_body();
        assert_eq!(stain.lane().unwrap(), "blue", "lanes are lowercased");
        assert_eq!(stain.baggage(), None);
    }
}
