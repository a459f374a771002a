//! Copy the task-local stain into the request extensions, for layers that run elsewhere.
//!
//! A service behind `tower::buffer::Buffer` (tonic's `Channel` is one) runs its `call()` in
//! the buffer's worker task, where the caller's task-local stain is not set. Put
//! [`CaptureStainLayer`] *outside* the buffer: it stores the caller's stain in the
//! request extensions, which travel with the request, so that [`PropagateStain`] or a
//! balancer inside the buffer still sees it. A request that already has a stain in its
//! extensions keeps it. With the `opentelemetry` feature, a request without a gray stain
//! gets the lane of the current OpenTelemetry baggage, if any (module `otel`).
//!
//! Inserting into `http::Extensions` allocates (three times into empty extensions: the map,
//! its table and the boxed value; once when the map exists); when you can, put
//! [`PropagateStain`] outside the buffer instead, which needs no capture.
//!
//! [`PropagateStain`]: crate::PropagateStain
//!
//! ```
//! use gray_tower::{CaptureStainLayer, Lane, PropagateStainLayer, Stain, StainExt};
//! use http::{Request, Response};
//! use tower::{ServiceBuilder, ServiceExt, buffer::Buffer, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let inner = ServiceBuilder::new()
//!     .layer(PropagateStainLayer::new())
//!     .service(service_fn(|req: Request<()>| async move {
//!         Ok::<_, tower::BoxError>(Response::new(req.headers().get("x-gray-lane").cloned()))
//!     }));
//! // The buffer's worker task runs `inner`; the capture layer runs in the caller's task.
//! let client = ServiceBuilder::new()
//!     .layer(CaptureStainLayer::new())
//!     .service(Buffer::new(inner, 16));
//!
//! let stain = Stain::in_lane(Lane::new("gray")?);
//! let res = client.oneshot(Request::new(())).with_stain(stain).await?;
//! assert_eq!(res.body().as_ref().unwrap(), "gray");
//! # Ok(())
//! # }
//! ```

use std::task::{Context, Poll};

use gray_core::Stain;
use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use crate::task;

/// Builds [`CaptureStain`].
#[derive(Debug, Clone, Default)]
pub struct CaptureStainLayer {
    #[cfg(feature = "opentelemetry")]
    carriers: std::sync::Arc<gray_core::Carriers>,
}

impl CaptureStainLayer {
    /// A new capture layer.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The carriers of the client inside (feature `opentelemetry`): a stain taken from the
    /// OpenTelemetry baggage reads their `baggage` member key (default `gray.lane`) and
    /// interns the lane with their names.
    #[cfg(feature = "opentelemetry")]
    #[must_use]
    pub fn with_carriers(mut self, carriers: gray_core::Carriers) -> Self {
        self.carriers = std::sync::Arc::new(carriers);
        self
    }
}

impl<S> Layer<S> for CaptureStainLayer {
    type Service = CaptureStain<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CaptureStain {
            inner,
            #[cfg(feature = "opentelemetry")]
            carriers: self.carriers.clone(),
        }
    }
}

/// Stores the task-local stain in the request extensions, unless one is there already.
///
/// Built by [`CaptureStainLayer`].
#[derive(Debug, Clone)]
pub struct CaptureStain<S> {
    inner: S,
    #[cfg(feature = "opentelemetry")]
    carriers: std::sync::Arc<gray_core::Carriers>,
}

impl<S> CaptureStain<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        CaptureStain {
            inner,
            #[cfg(feature = "opentelemetry")]
            carriers: Default::default(),
        }
    }

    define_inner_service_accessors!();

    // `self` is read only with the `opentelemetry` feature.
    #[cfg_attr(not(feature = "opentelemetry"), allow(clippy::unused_self))]
    fn current(&self) -> Option<Stain> {
        let current = task::current();
        #[cfg(feature = "opentelemetry")]
        let current = current.or_else(|| task::baggage_stain(&self.carriers));
        current
    }
}

impl<S, B> Service<Request<B>> for CaptureStain<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.extensions().get::<Stain>().is_none()
            && let Some(stain) = self.current()
        {
            req.extensions_mut().insert(stain);
        }
        self.inner.call(req)
    }
}
