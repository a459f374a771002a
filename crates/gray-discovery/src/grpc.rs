//! Instances as gRPC channels (feature `tonic`): [`GrpcChannels`] makes one lazily
//! connected HTTP/2 [`tonic::transport::Channel`] per instance, so that a label-aware
//! balancer can route gRPC calls by the stain.
//!
//! The channel connects on its first call (never while the discover stream is polled), and
//! reconnects by itself. Give every channel its options (timeouts, HTTP/2 keep-alive, TLS
//! when tonic's TLS features are on) with [`GrpcChannels::with_endpoint`].
//!
//! A `Channel` is a `tower::buffer::Buffer`: its worker task does not see the caller's
//! task-local stain. Put `PropagateStainLayer` *outside* the balancer (the stain is written
//! into the request headers in the caller's task), as for any buffered client.
//!
//! A `Channel` takes `http::Request<tonic::body::Body>` only. [`GrpcChannels::any_body`]
//! makes channels that take any body ([`AnyBody`]), such as the replayable bodies a
//! retrying balancer (gray-balance's `retry::Retry`) sends. A channel connects in the
//! request's future and drops a request it could not send, so a retrying balancer over
//! channels keeps a copy of each request it may send again (gray-balance's
//! `retry::Copies::All`).
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::{Labelled, Labels};
//! use gray_discovery::{Instance, Registry, grpc::GrpcChannels};
//! use std::time::Duration;
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let registry = Registry::from_static([(
//!     "stock",
//!     [Instance::new("s-1".parse()?, "127.0.0.1:50051".parse()?, Labels::from_iter([("gray", "true")]))],
//! )])?;
//! let channels = GrpcChannels::new()
//!     .with_endpoint(|endpoint| endpoint.timeout(Duration::from_secs(2)));
//! let mut endpoints = registry.service("stock")?.endpoints(channels);
//! // Nothing listens there: the channel is made all the same, and connects on first use.
//! let Some(Ok(Change::Insert(_, channel))) = endpoints.next().await else { unreachable!() };
//! assert_eq!(channel.labels().get("gray"), Some("true"));
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use tonic::transport::{Channel, Endpoint};
use tower::BoxError;
use tower_service::Service;

use crate::{Instance, MakeEndpoint};

type Configure = dyn Fn(Endpoint) -> Endpoint + Send + Sync;

/// Makes a lazily connected tonic [`Channel`] per instance; see the [module docs](self).
#[derive(Clone, Default)]
pub struct GrpcChannels {
    configure: Option<Arc<Configure>>,
}

impl fmt::Debug for GrpcChannels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcChannels")
            .field("configured", &self.configure.is_some())
            .finish()
    }
}

impl GrpcChannels {
    /// Channels with tonic's default options.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `configure` to the [`Endpoint`] of every instance before its channel is
    /// made (timeouts, keep-alive, TLS, ...).
    #[must_use]
    pub fn with_endpoint(
        mut self,
        configure: impl Fn(Endpoint) -> Endpoint + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }

    /// Channels that take requests of any body; see [`AnyBody`].
    #[must_use]
    pub fn any_body(self) -> AnyBody<GrpcChannels> {
        AnyBody(self)
    }

    /// The endpoint of `instance`, configured.
    #[must_use]
    pub fn endpoint(&self, instance: &Instance) -> Endpoint {
        let endpoint = Endpoint::from(instance.address().uri());
        match &self.configure {
            Some(configure) => configure(endpoint),
            None => endpoint,
        }
    }
}

impl MakeEndpoint for GrpcChannels {
    type Service = Channel;

    /// A channel to `instance` that connects on its first call. Must be called within a
    /// tokio runtime (the channel spawns its worker).
    fn make_endpoint(&self, instance: &Instance) -> Channel {
        self.endpoint(instance).connect_lazy()
    }
}

/// A tonic [`Channel`] (or its maker, [`GrpcChannels::any_body`]) that takes
/// `http::Request<B>` for any body `B` of [`Bytes`], turned into a
/// `tonic::body::Body` (which boxes it; a `tonic::body::Body` is passed as it is).
///
/// ```
/// use futures_util::StreamExt;
/// use gray_core::Labels;
/// use gray_discovery::{Instance, Registry, grpc::GrpcChannels};
/// use http_body_util::Full;
/// use tower::{Service, discover::Change};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let registry = Registry::from_static([(
///     "stock",
///     [Instance::new("s-1".parse()?, "127.0.0.1:50051".parse()?, Labels::new())],
/// )])?;
/// let mut endpoints = registry.service("stock")?.endpoints(GrpcChannels::new().any_body());
/// let Some(Ok(Change::Insert(_, channel))) = endpoints.next().await else { unreachable!() };
/// fn takes<S: Service<http::Request<Full<bytes::Bytes>>>>(_: &S) {}
/// takes(&channel);
/// # Ok::<(), gray_discovery::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct AnyBody<S>(S);

impl<S> AnyBody<S> {
    /// The inner channel (or maker).
    pub fn get_ref(&self) -> &S {
        &self.0
    }

    /// The inner channel (or maker).
    pub fn into_inner(self) -> S {
        self.0
    }
}

impl MakeEndpoint for AnyBody<GrpcChannels> {
    type Service = AnyBody<Channel>;

    /// As [`GrpcChannels`] makes it, taking any body.
    fn make_endpoint(&self, instance: &Instance) -> AnyBody<Channel> {
        AnyBody(self.0.make_endpoint(instance))
    }
}

impl<S, B> Service<http::Request<B>> for AnyBody<S>
where
    S: Service<http::Request<tonic::body::Body>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        self.0.call(request.map(tonic::body::Body::new))
    }
}
