//! Any service per instance: a [`MakeEndpoint`] turns an [`Instance`] into a client service
//! (an HTTP/1 [`HttpEndpoint`](crate::http::HttpEndpoint), a tonic `Channel`, your own
//! client), and [`Endpoint`] keeps the instance beside it, so that a label-aware balancer
//! sees its labels ([`Labelled`]) and a URL-rewriting client its origin ([`Origin`]).
//!
//! | maker | service per instance | feature |
//! |---|---|---|
//! | [`HttpEndpoints`](crate::http::HttpEndpoints) | [`HttpEndpoint`](crate::http::HttpEndpoint): HTTP/1.1, its own keep-alive connections | `http` |
//! | [`GrpcChannels`](crate::grpc::GrpcChannels) | a lazily connected HTTP/2 `tonic::transport::Channel` | `tonic` |
//! | any `Fn(&Instance) -> S` | `S` | |
//!
//! [`ServiceInstances::endpoints`](crate::ServiceInstances::endpoints) gives the
//! [`Endpoints`] discover stream of a registry's service; [`Endpoints::new`] maps any
//! discover stream of instances.
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::{Labelled, Labels, Origin};
//! use gray_discovery::{Instance, Registry};
//! use tower::{ServiceExt, discover::Change, service_fn};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let registry = Registry::from_static([(
//!     "orders",
//!     [Instance::new("a".parse()?, "10.0.0.7:8080".parse()?, Labels::from_iter([("gray", "true")]))],
//! )])?;
//! // A service per instance that answers with the instance's authority.
//! let make = |instance: &Instance| {
//!     let authority = instance.address().authority().to_string();
//!     service_fn(move |path: &'static str| {
//!         let answer = format!("{authority}{path}");
//!         async move { Ok::<_, std::convert::Infallible>(answer) }
//!     })
//! };
//! let mut endpoints = registry.service("orders")?.endpoints(make);
//! let Some(Ok(Change::Insert(_, endpoint))) = endpoints.next().await else { unreachable!() };
//! assert_eq!(endpoint.labels().get("gray"), Some("true"));
//! assert_eq!(endpoint.authority().as_str(), "10.0.0.7:8080");
//! assert_eq!(endpoint.oneshot("/items").await.unwrap(), "10.0.0.7:8080/items");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use futures_core::Stream;
use gray_core::{Labelled, Labels, Origin};
use http::uri::{Authority, Scheme};
use tower::discover::Change;
use tower_service::Service;

use crate::Instance;

/// Makes the client service of an instance; see the [module docs](self).
pub trait MakeEndpoint {
    /// The service of one instance.
    type Service;

    /// The service that sends requests to `instance`. Called once per new or changed
    /// instance, from the task that polls the discover stream.
    fn make_endpoint(&self, instance: &Instance) -> Self::Service;
}

impl<F, S> MakeEndpoint for F
where
    F: Fn(&Instance) -> S,
{
    type Service = S;

    fn make_endpoint(&self, instance: &Instance) -> S {
        self(instance)
    }
}

/// A client service and the instance it sends to: [`Labelled`] by the instance's labels,
/// [`Origin`] by its address, a `tower::Service` that delegates to the inner service.
#[derive(Clone)]
pub struct Endpoint<S> {
    service: S,
    instance: Instance,
}

impl<S> Endpoint<S> {
    /// `service`, sending to `instance`.
    pub fn new(instance: Instance, service: S) -> Self {
        Endpoint { service, instance }
    }

    /// The instance.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.service
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.service
    }
}

impl<S> fmt::Debug for Endpoint<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl<S> Labelled for Endpoint<S> {
    fn labels(&self) -> &Labels {
        self.instance.labels()
    }

    /// The instance's address: a balancer probes it before an ejected endpoint comes
    /// back.
    fn origin(&self) -> Option<&dyn Origin> {
        Some(self)
    }
}

impl<S> Origin for Endpoint<S> {
    fn scheme(&self) -> &Scheme {
        self.instance.address().scheme()
    }

    fn authority(&self) -> &Authority {
        self.instance.address().authority()
    }
}

impl<S, R> Service<R> for Endpoint<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.service.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.service.call(request)
    }
}

pin_project_lite::pin_project! {
    /// A discover stream of [`Endpoint`]s made by a [`MakeEndpoint`] from a discover stream
    /// of instances: each `Insert` of an instance becomes an `Insert` of its endpoint, with
    /// the same key; a `Remove` stays a `Remove`.
    pub struct Endpoints<D, M> {
        #[pin]
        discover: D,
        maker: M,
    }
}

impl<D, M> Endpoints<D, M> {
    /// Maps `discover` with `maker`.
    pub fn new(discover: D, maker: M) -> Self {
        Endpoints { discover, maker }
    }

    /// The maker.
    pub fn maker(&self) -> &M {
        &self.maker
    }
}

impl<D: fmt::Debug, M> fmt::Debug for Endpoints<D, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoints")
            .field("discover", &self.discover)
            .finish_non_exhaustive()
    }
}

impl<D, K, E, M> Stream for Endpoints<D, M>
where
    D: Stream<Item = Result<Change<K, Instance>, E>>,
    M: MakeEndpoint,
{
    type Item = Result<Change<K, Endpoint<M::Service>>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        this.discover.poll_next(cx).map(|item| {
            item.map(|change| {
                change.map(|change| match change {
                    Change::Insert(key, instance) => {
                        let service = this.maker.make_endpoint(&instance);
                        Change::Insert(key, Endpoint::new(instance, service))
                    }
                    Change::Remove(key) => Change::Remove(key),
                })
            })
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.discover.size_hint()
    }
}
