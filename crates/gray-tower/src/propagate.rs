//! Client side: write the stain onto every outbound request.
//!
//! [`PropagateStainLayer`] wraps any `tower::Service<http::Request<B>>` client: the
//! hyper-util `Client`, a tonic `Channel`, a balancer. For each request it takes the context
//! from the request extensions first, else from the task-local context (see
//! [`crate::task`]), and writes it into the configured [`Carriers`]. A request with neither
//! is sent as it is.
//!
//! # A request that already carries a stain
//!
//! [`Existing::Keep`] (the default): when any configured carrier is already present on the
//! outbound request, for example because the handler set it on purpose or copied the inbound
//! headers, the request is sent untouched. [`Existing::Replace`]: the carriers are removed
//! (for `baggage`, only the stain's member) and rewritten from the context.
//!
//! ```
//! use gray_core::{Stain, Lane};
//! use gray_tower::{StainExt, PropagateStainLayer};
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
//! let ctx = Stain::in_lane(Lane::new("canary")?);
//! let res = client.oneshot(Request::new(())).with_stain(ctx).await?;
//! assert_eq!(res.body().as_ref().unwrap(), "canary");
//! # Ok(())
//! # }
//! ```

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{Carriers, Stain};
use http::{HeaderMap, Request};
use tower_layer::Layer;
use tower_service::Service;

use crate::task;

/// What to do with an outbound request that already carries a stain carrier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Existing {
    /// Send the request untouched (the caller's explicit stain wins).
    #[default]
    Keep,
    /// Remove the carriers and write the current context instead.
    Replace,
}

/// How a context is written onto outbound headers; shared by [`PropagateStain`] and the
/// reqwest middleware.
#[derive(Debug, Clone, Default)]
pub(crate) struct Propagator {
    pub(crate) carriers: Carriers,
    pub(crate) existing: Existing,
}

impl Propagator {
    /// Writes `ctx` (or, without one, the task-local context) into `headers`.
    pub(crate) fn apply(&self, ctx: Option<&Stain>, headers: &mut HeaderMap) {
        let current;
        let ctx = match ctx {
            Some(ctx) => ctx,
            None => match task::current() {
                Some(ctx) => {
                    current = ctx;
                    &current
                }
                None => return,
            },
        };
        match self.existing {
            // Writing a baseline context only removes absent carriers: nothing to do.
            Existing::Keep if ctx.is_baseline() => {}
            Existing::Keep => {
                if !self.carriers.is_present(headers) {
                    self.carriers.inject(ctx, headers);
                }
            }
            Existing::Replace => {
                self.carriers.strip(headers);
                self.carriers.inject(ctx, headers);
            }
        }
    }
}

/// Builds [`PropagateStain`]: writes the stain onto each outbound request.
#[derive(Debug, Clone, Default)]
pub struct PropagateStainLayer {
    propagator: Arc<Propagator>,
}

impl PropagateStainLayer {
    /// Writes the default carriers (`x-gray-lane` and `x-gray-info`), keeping existing ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `carriers`, keeping existing ones.
    pub fn with_carriers(carriers: Carriers) -> Self {
        PropagateStainLayer {
            propagator: Arc::new(Propagator {
                carriers,
                existing: Existing::Keep,
            }),
        }
    }

    /// Sets the rule for a request that already carries a stain.
    pub fn existing(self, existing: Existing) -> Self {
        PropagateStainLayer {
            propagator: Arc::new(Propagator {
                carriers: self.propagator.carriers.clone(),
                existing,
            }),
        }
    }
}

impl<S> Layer<S> for PropagateStainLayer {
    type Service = PropagateStain<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PropagateStain {
            inner,
            propagator: self.propagator.clone(),
        }
    }
}

/// Writes the stain of the request (extensions first, else the task-local context) onto it.
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
        PropagateStainLayer::new().layer(inner)
    }

    /// A layer that writes the default carriers.
    pub fn layer() -> PropagateStainLayer {
        PropagateStainLayer::new()
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

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // Cloning a context is at most two `Arc` increments.
        let ctx = req.extensions().get::<Stain>().cloned();
        self.propagator.apply(ctx.as_ref(), req.headers_mut());
        self.inner.call(req)
    }
}
