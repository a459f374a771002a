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

use std::{fmt, sync::Arc};

use tonic::transport::{Channel, Endpoint};

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
