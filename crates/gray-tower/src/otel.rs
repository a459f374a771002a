//! OpenTelemetry interop (cargo feature `opentelemetry`; `opentelemetry` 0.33, the version
//! `opentelemetry_sdk` 0.33 and `tracing-opentelemetry` 0.34 use).
//!
//! The lane travels as one member of OpenTelemetry's baggage, `gray.lane` (the key of the
//! carriers' first [`BaggageMember`], else [`DEFAULT_BAGGAGE_KEY`]), both ways, so an app
//! already on `opentelemetry` needs no second header:
//!
//! - **gray → OpenTelemetry.** [`AttachLaneLayer`], put inside `ExtractStainLayer` (or the
//!   edge layer), makes the stain's lane a member of the current OpenTelemetry baggage
//!   while the request is handled: for the inner service's `call()` and every poll of its
//!   response future. Handler code sees it in `Context::current().baggage()`, OpenTelemetry's
//!   `BaggagePropagator` injects it into outbound requests, and a `BaggageSpanProcessor`
//!   records it on spans. A baseline stain removes a stale `gray.lane` member; a request
//!   without a gray stain leaves the OpenTelemetry context as it is. Where it changes the
//!   context, OpenTelemetry builds a new one (a few allocations per request); where the
//!   current baggage already states the lane, nothing is built.
//! - **OpenTelemetry → gray.** When no gray stain is set (none in the request extensions,
//!   no task-local stain), [`PropagateStain`](crate::PropagateStain), the reqwest
//!   middleware and [`CaptureStain`](crate::CaptureStain) take the lane of the current
//!   OpenTelemetry baggage: one the app set (`Context::current_with_baggage`), or one
//!   OpenTelemetry's `BaggagePropagator` extracted from an inbound request, made current
//!   with `FutureExt::with_context` or by `tracing-opentelemetry` (which makes a span's
//!   context current while the span is entered). `PropagateStain` also puts that stain into
//!   the request extensions, so a balancer under it routes by it.
//!
//! A gray stain always wins over OpenTelemetry baggage: in a service whose inbound layer is
//! `ExtractStainLayer` every request has one (baseline by default), so there the baggage
//! lane matters only through the `baggage` carrier ([`Carriers::with_baggage`]), which reads
//! the same inbound header. Lanes from OpenTelemetry baggage are lowercased and interned by
//! the carriers' names, like any other; an invalid one is ignored with a debug event
//! (target `gray::otel`).
//!
//! ```
//! use gray_tower::{ExtractStainLayer, Lane, PropagateStainLayer, otel::AttachLaneLayer};
//! use http::{Request, Response};
//! use opentelemetry::{Context, KeyValue, baggage::BaggageExt, context::FutureExt};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // gray → OpenTelemetry: the handler finds the lane in the current baggage.
//! let server = ServiceBuilder::new()
//!     .layer(ExtractStainLayer::new())
//!     .layer(AttachLaneLayer::new())
//!     .service(service_fn(|_req: Request<()>| async {
//!         let lane = Context::map_current(|cx| {
//!             cx.baggage().get("gray.lane").map(|v| v.as_str().to_owned())
//!         });
//!         Ok::<_, tower::BoxError>(Response::new(lane))
//!     }));
//! let inbound = Request::builder().header("x-gray-lane", "canary").body(())?;
//! let res = server.oneshot(inbound).await?;
//! assert_eq!(res.body().as_deref(), Some("canary"));
//!
//! // OpenTelemetry → gray: a lane set in the baggage stains the outbound call.
//! let client = ServiceBuilder::new()
//!     .layer(PropagateStainLayer::new())
//!     .service(service_fn(|req: Request<()>| async move {
//!         Ok::<_, tower::BoxError>(Response::new(req.headers().get("x-gray-lane").cloned()))
//!     }));
//! let cx = Context::current_with_baggage([KeyValue::new("gray.lane", "canary")]);
//! let res = client.oneshot(Request::new(())).with_context(cx).await?;
//! assert_eq!(res.body().as_ref().unwrap(), "canary");
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{
    Carriers, Lane, Stain,
    codec::{BaggageMember, DEFAULT_BAGGAGE_KEY},
};
use http::Request;
use opentelemetry::{
    Context as OtelContext, Key,
    baggage::{Baggage, BaggageExt, KeyValueMetadata},
};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::task;

/// The current OpenTelemetry context with `key` stating `lane` (or without it, for
/// baseline); `None` when the current one already does.
fn with_lane(key: &Key, lane: Option<&Lane>) -> Option<OtelContext> {
    OtelContext::map_current(|cx| {
        let baggage = cx.baggage();
        let current = baggage.get(key.as_str());
        match lane {
            Some(lane) if current.is_some_and(|v| v.as_str() == lane.as_str()) => None,
            None if current.is_none() => None,
            _ => {
                // `Baggage` is not `Clone`: rebuild it without our member, then add it.
                let others = baggage
                    .iter()
                    .filter(|(k, _)| *k != key)
                    .map(|(k, (v, meta))| {
                        KeyValueMetadata::new(k.clone(), v.clone(), meta.clone())
                    });
                let ours = lane
                    .map(|lane| KeyValueMetadata::new(key.clone(), lane.as_str().to_owned(), ""));
                // Ours first: OpenTelemetry keeps at most 64 members.
                let changed: Baggage = ours.into_iter().chain(others).collect();
                Some(cx.with_baggage(changed))
            }
        }
    })
}

/// The member key of the carriers' first `baggage` carrier, else [`DEFAULT_BAGGAGE_KEY`].
fn member_key(carriers: &Carriers) -> &str {
    carriers
        .baggage()
        .map_or(DEFAULT_BAGGAGE_KEY, BaggageMember::key)
}

/// Builds [`AttachLane`]: makes the stain's lane a member of the current OpenTelemetry
/// baggage while each request is handled.
///
/// Put it inside the layer that sets the stain (`ExtractStainLayer`, the edge layer).
#[derive(Debug, Clone)]
pub struct AttachLaneLayer {
    key: Key,
}

impl Default for AttachLaneLayer {
    fn default() -> Self {
        AttachLaneLayer {
            key: Key::from_static_str(DEFAULT_BAGGAGE_KEY),
        }
    }
}

impl AttachLaneLayer {
    /// Attaches the lane as the member [`DEFAULT_BAGGAGE_KEY`] (`gray.lane`).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches the lane under the key of the first `baggage` carrier of `carriers` (the
    /// default key without one).
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        self.key = Key::from(Arc::<str>::from(member_key(&carriers)));
        self
    }
}

impl<S> Layer<S> for AttachLaneLayer {
    type Service = AttachLane<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AttachLane::with_key(inner, self.key.clone())
    }
}

/// Makes the lane of each request's stain (request extensions, else the task-local stain)
/// a member of the current OpenTelemetry baggage for the inner `call()` and every poll of
/// its future.
///
/// Built by [`AttachLaneLayer`].
#[derive(Debug, Clone)]
pub struct AttachLane<S> {
    inner: S,
    key: Key,
}

impl<S> AttachLane<S> {
    /// Wraps `inner`, attaching the lane as `gray.lane`.
    pub fn new(inner: S) -> Self {
        Self::with_key(inner, Key::from_static_str(DEFAULT_BAGGAGE_KEY))
    }

    fn with_key(inner: S, key: Key) -> Self {
        AttachLane { inner, key }
    }

    define_inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for AttachLane<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = AttachedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let attached = task::or_current(req.extensions().get::<Stain>())
            .and_then(|stain| with_lane(&self.key, stain.lane()));
        let inner = match &attached {
            Some(otel_cx) => {
                let _guard = otel_cx.clone().attach();
                self.inner.call(req)
            }
            None => self.inner.call(req),
        };
        AttachedFuture { inner, attached }
    }
}

/// The former name of [`AttachedFuture`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `AttachedFuture` (one name for one thing); removed in 0.4.0"
)]
pub type ResponseFuture<F> = AttachedFuture<F>;

pin_project! {
    /// The response future of [`AttachLane`]: the inner future, polled with the
    /// OpenTelemetry context that carries the lane.
    #[derive(Debug)]
    pub struct AttachedFuture<F> {
        #[pin]
        inner: F,
        attached: Option<OtelContext>,
    }
}

impl<F: Future> Future for AttachedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _guard = this
            .attached
            .as_ref()
            .map(|otel_cx| otel_cx.clone().attach());
        this.inner.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use gray_core::Names;
    use http::Response;
    use opentelemetry::{KeyValue, context::FutureExt};
    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::StainExt;

    fn otel_lane() -> Option<String> {
        OtelContext::map_current(|cx| {
            cx.baggage()
                .get(DEFAULT_BAGGAGE_KEY)
                .map(|v| v.as_str().to_owned())
        })
    }

    async fn lane_in_baggage(stain: Option<Stain>) -> (Option<String>, Option<String>) {
        let svc = AttachLaneLayer::new().layer(service_fn(|_req: Request<()>| {
            let in_call = otel_lane();
            async move {
                tokio::task::yield_now().await;
                Ok::<_, std::convert::Infallible>(Response::new((in_call, otel_lane())))
            }
        }));
        let fut = svc.oneshot(Request::new(()));
        let res = match stain {
            Some(stain) => fut.with_stain(stain).await,
            None => fut.await,
        };
        res.unwrap().into_body()
    }

    #[tokio::test]
    async fn the_lane_is_in_the_baggage_for_the_call_and_the_future() {
        let gray = Stain::in_lane(Lane::new("gray").unwrap());
        let seen = lane_in_baggage(Some(gray.clone())).await;
        assert_eq!(seen, (Some("gray".into()), Some("gray".into())));
        assert_eq!(
            otel_lane(),
            None,
            "attached only while the request is handled"
        );

        // A baseline stain removes a stale member; other members stay.
        let stale = OtelContext::current_with_baggage([
            KeyValue::new(DEFAULT_BAGGAGE_KEY, "blue"),
            KeyValue::new("userId", "42"),
        ]);
        let seen = lane_in_baggage(Some(Stain::baseline()))
            .with_context(stale.clone())
            .await;
        assert_eq!(seen, (None, None));
        let (user, lane) = async {
            let seen = lane_in_baggage(Some(gray)).await;
            let user =
                OtelContext::map_current(|cx| cx.baggage().get("userId").map(|v| v.to_string()));
            (user, seen.1)
        }
        .with_context(stale.clone())
        .await;
        assert_eq!(
            (user.as_deref(), lane.as_deref()),
            (Some("42"), Some("gray"))
        );

        // Without a gray stain, the OpenTelemetry context is left as it is.
        let seen = lane_in_baggage(None).with_context(stale).await;
        assert_eq!(seen, (Some("blue".into()), Some("blue".into())));
    }

    #[test]
    fn a_lane_in_the_baggage_is_a_stain_when_valid() {
        let carriers = Carriers::default().with_names(Names::new());
        let _guard =
            OtelContext::current_with_baggage([KeyValue::new("gray.lane", "Canary")]).attach();
        assert_eq!(
            task::baggage_stain(&carriers).and_then(|s| s.lane().cloned()),
            Some(Lane::new("canary").unwrap())
        );
        let custom = Carriers::new().with(BaggageMember::new("lane").unwrap());
        assert_eq!(task::baggage_stain(&custom), None, "another key");
        let _bad = OtelContext::current_with_baggage([KeyValue::new("gray.lane", "a b")]).attach();
        assert_eq!(task::baggage_stain(&carriers), None);
    }
}
