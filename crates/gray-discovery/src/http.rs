//! From instances to endpoints (feature `http`): each [`Instance`] becomes an
//! [`HttpEndpoint`], a `tower::Service<http::Request<B>>` that sends requests to the
//! instance over one shared hyper-util connection pool, and that is
//! [`Labelled`] so a label-aware balancer can choose it.
//!
//! [`HttpEndpoints`] owns the pooled client; [`HttpEndpoints::discover`] maps any discover
//! stream of instances (static, file, etcd) to a discover stream of endpoints. An endpoint
//! replaces the request URI's scheme and authority with the instance's address and keeps
//! the path and query (`/` when the request had none).
//!
//! ```
//! use bytes::Bytes;
//! use futures_util::StreamExt;
//! use gray_core::{Labelled, Labels};
//! use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
//! use http_body_util::Full;
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let endpoints = HttpEndpoints::<_, Full<Bytes>>::new();
//! let instances = StaticDiscover::new([Instance::new(
//!     "a".parse()?,
//!     "127.0.0.1:8081".parse()?,
//!     Labels::from_iter([("gray", "true")]),
//! )]);
//! let mut discover = endpoints.discover(instances);
//! let Some(Ok(Change::Insert(_, endpoint))) = discover.next().await else { unreachable!() };
//! assert_eq!(endpoint.labels().get("gray"), Some("true"));
//! assert_eq!(endpoint.instance().address().to_string(), "http://127.0.0.1:8081");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use futures_core::Stream;
use gray_core::{Labelled, Labels};
use http::{Request, Response, Uri, uri::PathAndQuery};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{self, Client, connect::Connect, connect::HttpConnector},
    rt::TokioExecutor,
};
use tower::{BoxError, discover::Change};
use tower_service::Service;

use crate::Instance;

/// The shared pooled client that turns instances into [`HttpEndpoint`]s.
pub struct HttpEndpoints<C, B> {
    client: Client<C, B>,
}

impl<C: Clone, B> Clone for HttpEndpoints<C, B> {
    fn clone(&self) -> Self {
        HttpEndpoints {
            client: self.client.clone(),
        }
    }
}

impl<C, B> fmt::Debug for HttpEndpoints<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoints").finish_non_exhaustive()
    }
}

impl<B> HttpEndpoints<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    /// A pool of plain-HTTP connections (HTTP/1.1), on the tokio runtime, with
    /// `TCP_NODELAY` set (requests and responses are small and latency-bound).
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        HttpEndpoints {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl<B> Default for HttpEndpoints<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clone, B> HttpEndpoints<C, B> {
    /// Endpoints sharing `client`, for another connector (TLS, for instance) or settings.
    pub fn with_client(client: Client<C, B>) -> Self {
        HttpEndpoints { client }
    }

    /// The endpoint of `instance`.
    pub fn endpoint(&self, instance: Instance) -> HttpEndpoint<C, B> {
        HttpEndpoint {
            client: self.client.clone(),
            instance,
        }
    }

    /// Maps a discover stream of instances to a discover stream of endpoints.
    pub fn discover<D>(&self, discover: D) -> Endpoints<D, C, B> {
        Endpoints {
            discover,
            endpoints: self.clone(),
        }
    }
}

/// One instance as an HTTP client service; see the [module docs](self).
pub struct HttpEndpoint<C, B> {
    client: Client<C, B>,
    instance: Instance,
}

impl<C: Clone, B> Clone for HttpEndpoint<C, B> {
    fn clone(&self) -> Self {
        HttpEndpoint {
            client: self.client.clone(),
            instance: self.instance.clone(),
        }
    }
}

impl<C, B> fmt::Debug for HttpEndpoint<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl<C, B> HttpEndpoint<C, B> {
    /// The instance this endpoint sends to.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }
}

impl<C, B> Labelled for HttpEndpoint<C, B> {
    fn labels(&self) -> &Labels {
        self.instance.labels()
    }
}

impl<C, B> Service<Request<B>> for HttpEndpoint<C, B>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The pool opens connections on demand.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let address = self.instance.address();
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(address.scheme().clone());
        parts.authority = Some(address.authority().clone());
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        match Uri::from_parts(parts) {
            Ok(uri) => {
                *request.uri_mut() = uri;
                ResponseFuture {
                    state: State::Sent(self.client.request(request)),
                }
            }
            Err(error) => ResponseFuture {
                state: State::Failed(Some(error.into())),
            },
        }
    }
}

/// The response future of [`HttpEndpoint`].
pub struct ResponseFuture {
    state: State,
}

enum State {
    Sent(legacy::ResponseFuture),
    Failed(Option<BoxError>),
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Incoming>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            State::Sent(future) => Pin::new(future).poll(cx).map_err(Into::into),
            State::Failed(error) => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "response future polled after completion".into()))),
        }
    }
}

pin_project_lite::pin_project! {
    /// A discover stream of [`HttpEndpoint`]s made from a discover stream of instances; see
    /// [`HttpEndpoints::discover`].
    pub struct Endpoints<D, C, B> {
        #[pin]
        discover: D,
        endpoints: HttpEndpoints<C, B>,
    }
}

impl<D: fmt::Debug, C, B> fmt::Debug for Endpoints<D, C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoints")
            .field("discover", &self.discover)
            .finish_non_exhaustive()
    }
}

impl<D, K, E, C, B> Stream for Endpoints<D, C, B>
where
    D: Stream<Item = Result<Change<K, Instance>, E>>,
    C: Clone,
{
    type Item = Result<Change<K, HttpEndpoint<C, B>>, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        this.discover.poll_next(cx).map(|item| {
            item.map(|change| {
                change.map(|change| match change {
                    Change::Insert(key, instance) => {
                        Change::Insert(key, this.endpoints.endpoint(instance))
                    }
                    Change::Remove(key) => Change::Remove(key),
                })
            })
        })
    }
}
