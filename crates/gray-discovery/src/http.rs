//! From instances to endpoints (feature `http`): each [`Instance`] becomes an
//! [`HttpEndpoint`], a `tower::Service<http::Request<B>>` that sends requests to the
//! instance over HTTP/1.1 keep-alive connections or one HTTP/2 connection, in cleartext or
//! over TLS (feature `tls`), and that is [`Labelled`] so a label-aware balancer can choose
//! it.
//!
//! [`HttpEndpoints`] holds the connector and the connection settings, and is a
//! [`MakeEndpoint`]: `registry.service("orders")?.endpoints(endpoints)`
//! is the discover stream of a registry's service as endpoints, and
//! [`HttpEndpoints::discover`] maps any discover stream of instances. An endpoint sends the
//! request's path and query (`/` when it has none) to its instance, whatever scheme and
//! authority the request URI names; it keeps the request's `Host` header (over HTTP/2, as
//! the `:authority`), or uses the instance's authority when there is none; it speaks the
//! endpoints' [`Protocol`] to the instance whatever version the request arrived in.
//! Bodies stream both ways, trailers included (gRPC's `grpc-status` is one).
//!
//! **Protocols** ([`HttpEndpoints::with_protocol`]):
//!
//! | [`Protocol`] | cleartext | TLS (ALPN offered) |
//! |---|---|---|
//! | `Http1` (default) | HTTP/1.1 | HTTP/1.1 (`http/1.1`) |
//! | `Http2` | HTTP/2 with prior knowledge (h2c) | HTTP/2 (`h2`) |
//! | `Auto` | HTTP/1.1: there is no ALPN to ask | what the instance chose (`h2`, `http/1.1`) |
//!
//! **TLS** (feature `tls`, [`HttpEndpoints::with_tls`]): instances whose address is
//! `https://host:port` are reached over TLS, with the rustls configuration of a [`Tls`]
//! (or every instance, [`Tls::with_every_instance`]); the certificate is checked against
//! the address's host, or a name of your choice. A failed handshake (an untrusted or
//! expired certificate, a name it is not valid for, a client certificate the instance
//! refused) fails the request with a [`RequestError`] whose
//! [`is_tls`](RequestError::is_tls) is true, holding rustls's error as its source: a
//! balancer's passive health (gray-balance's `is_connection_error`, feature `rustls`)
//! counts it as a connection failure. An `https://` instance with no [`Tls`] given fails
//! every request with an error that says so: it is never spoken to in cleartext.
//!
//! **HTTP/1 connections.** Each endpoint keeps its own idle connections (up to
//! [`HttpEndpoints::with_max_idle_per_instance`]; one idle for longer than
//! [`HttpEndpoints::with_idle_timeout`], 4 s by default, is closed). A request takes the
//! most recent idle connection that is still open, or opens one; connections idle past the
//! timeout are closed oldest first whenever a request takes one or one is released
//! (nothing reaps the idle list in the background: an instance that gets no more requests
//! keeps its connections until its endpoint is dropped). An idempotent request without a
//! body that was sent on a connection idle for 100 ms or more that the instance had just closed (its keep-alive
//! timeout racing our reuse: the connection closes before any answer) is sent again, once,
//! on a new connection; a request with a body is not (a retrying balancer decides). Its
//! future drives the connection until the response head
//! arrives, and the response's [`ResponseBody`] drives it while the body is read. When the
//! body ends, the connection is idle again; a body dropped before its end closes it. No
//! task is spawned per connection and no channel hop is taken per request, which is what
//! makes this cheaper than hyper-util's pooled client (see the figures in the workspace's
//! `docs/performance.md`). A request
//! that finds its idle connection closed by the instance is sent again on another one when
//! it was not sent at all; once written, it is never resent.
//!
//! **Connects are capped and cancel-safe.** At most
//! [`HttpEndpoints::with_max_connects_per_instance`] connects to an instance run at once, each
//! on a task of its own; requests that find no idle connection wait in order for the
//! connections they produce, or for one released by another request. A request dropped
//! while it waits (its client reset the stream) leaves the queue, and the connect finishes
//! anyway: its connection waits idle for the next request instead of being closed unused.
//! (Over TLS with [`Protocol::Auto`], an instance that chose HTTP/1.1 is connected to
//! directly, uncapped.)
//!
//! **HTTP/2 connections.** Each endpoint keeps **one** connection, which every request to
//! the instance shares (multiplexed), driven by a task of its own. A burst of requests to
//! an instance with no connection opens one, which they all wait for. Requests beyond the
//! instance's `SETTINGS_MAX_CONCURRENT_STREAMS` wait on that connection for a stream to
//! end: no second connection is opened. A closed connection is replaced by the next
//! request. [`HttpEndpoints::with_http2`] sets the connection's options (windows, frame
//! size, keep-alive pings).
//!
//! **Upgrades (WebSocket).** A request that asks for an HTTP/1.1 upgrade
//! ([`is_upgrade_request`]: an `Upgrade` header and `Connection: upgrade`, as a WebSocket
//! handshake) goes out like any other; when the instance answers `101 Switching
//! Protocols`, its connection leaves the pool for good and the response carries it:
//! [`upgraded`] takes it out, as an [`Upgraded`] whose reads start with what the instance
//! sent past the answer's head. Over HTTP/2 there is no upgrade: such a request to an
//! instance spoken to in HTTP/2 fails without being sent.
//!
//! **No request depends on other traffic.** An instance may answer before it has read the
//! whole request body (an early 413 or 200, then close). When such a response ends while
//! its request body is still being sent, the connection is closed rather than kept idle: an
//! idle connection is polled by nobody, and the request body it still held (in a proxy,
//! the body the client is still uploading) would wait for the next request to take the
//! connection. Every request thus ends with its response, or an error, within the
//! [response timeout](HttpEndpoints::with_response_timeout).
//!
//! ```
//! use bytes::Bytes;
//! use futures_util::StreamExt;
//! use gray_core::{Labelled, Labels};
//! use gray_discovery::{Instance, Registry, http::{HttpEndpoints, Protocol}};
//! use http_body_util::Full;
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let endpoints = HttpEndpoints::<_, Full<Bytes>>::new()
//!     .with_max_idle_per_instance(32)
//!     .with_protocol(Protocol::Http2);
//! assert_eq!(endpoints.protocol(), Protocol::Http2);
//! let registry = Registry::from_static([(
//!     "orders",
//!     [Instance::new("a".parse()?, "127.0.0.1:8081".parse()?, Labels::from_iter([("gray", "true")]))],
//! )])?;
//! let mut discover = registry.service("orders")?.endpoints(endpoints);
//! let Some(Ok(Change::Insert(_, endpoint))) = discover.next().await else { unreachable!() };
//! assert_eq!(endpoint.labels().get("gray"), Some("true"));
//! assert_eq!(endpoint.instance().address().to_string(), "127.0.0.1:8081");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

mod body;
mod connecting;
mod error;
mod h1;
mod h2;
mod h2_body;
mod pool;
mod protocol;
mod sent_body;
mod settings;
mod target;
#[cfg(feature = "tls")]
mod tls;
mod transport;
mod upgrade;

use std::{
    fmt,
    marker::PhantomData,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use gray_core::{Labelled, Labels, Origin};
use http::{
    Request, Uri,
    uri::{Authority, PathAndQuery, Scheme},
};
use http_body::Body;
use hyper::{
    body::Incoming,
    rt::{Read, Write},
};
use hyper_util::client::legacy::connect::HttpConnector;
use tower::BoxError;
use tower_service::Service;

#[cfg(feature = "tls")]
pub use self::tls::Tls;
pub use self::{
    body::ResponseBody,
    error::RequestError,
    protocol::Protocol,
    target::EndpointFuture,
    upgrade::{Upgraded, is_upgrade_request, upgraded},
};
use self::{
    settings::Settings,
    target::{Peer, Target},
    transport::Secure,
};
/// The rustls this crate is built with (feature `tls`): build a [`Tls`]'s `ClientConfig`
/// with it.
#[cfg(feature = "tls")]
pub use rustls;

/// The former name of [`EndpointFuture`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `EndpointFuture` (one name for one thing); removed in 0.4.0"
)]
pub type ResponseFuture = EndpointFuture;
use crate::{Endpoints, Instance, MakeEndpoint};

/// The default connector of [`HttpEndpoints`]: plain TCP (hyper-util's `HttpConnector`),
/// named here so that an endpoint's type can be written without depending on hyper-util:
/// `HttpEndpoint` is `HttpEndpoint<Connector, hyper::body::Incoming>`, the endpoint a
/// proxy forwards its inbound requests through.
pub type Connector = HttpConnector;

/// The connector and pool settings that turn instances into [`HttpEndpoint`]s; see the
/// [module docs](self). `C` is the connector ([`Connector`] by default, any
/// `tower::Service<Uri>` yielding a hyper IO for TLS or Unix sockets), `B` the request
/// body type (by default hyper's `Incoming`: what a proxy forwards).
pub struct HttpEndpoints<C = Connector, B = Incoming> {
    connector: C,
    settings: Arc<Settings>,
    _body: PhantomData<fn(B)>,
}

impl<C: Clone, B> Clone for HttpEndpoints<C, B> {
    fn clone(&self) -> Self {
        HttpEndpoints {
            connector: self.connector.clone(),
            settings: self.settings.clone(),
            _body: PhantomData,
        }
    }
}

impl<C, B> fmt::Debug for HttpEndpoints<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoints")
            .field("protocol", &self.settings.protocol)
            .field("max_idle_per_instance", &self.settings.max_idle)
            .field("idle_timeout", &self.settings.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl<B> HttpEndpoints<HttpConnector, B> {
    /// Endpoints over TCP with `TCP_NODELAY` set (requests and responses are small and
    /// latency-bound), HTTP/1.1, 256 idle connections per instance at most, each kept 4 s.
    #[must_use]
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // `https://` instances get TCP from it too: TLS is layered by the endpoint.
        connector.enforce_http(false);
        Self::with_connector(connector)
    }
}

impl<B> Default for HttpEndpoints<HttpConnector, B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C, B> HttpEndpoints<C, B> {
    /// Endpoints whose connections `connector` opens: it is called with
    /// `scheme://authority/` of the instance and yields the connection's IO (any
    /// `hyper::rt::Read + Write`, such as `hyper_util::rt::TokioIo<tokio::net::UnixStream>`).
    /// The workspace tests a connector that maps each instance's authority to a Unix
    /// socket, behind a balancer (`tests/tests/unix_socket.rs`). TLS is not the
    /// connector's job: [`with_tls`](Self::with_tls) runs it over whatever the connector
    /// yields, and so learns what ALPN chose.
    pub fn with_connector(connector: C) -> Self {
        HttpEndpoints {
            connector,
            settings: Arc::default(),
            _body: PhantomData,
        }
    }

    /// Keeps at most `max` idle connections per instance (default 256); a connection
    /// released when `max` are idle is closed. `0` closes every connection after its
    /// response.
    #[must_use]
    pub fn with_max_idle_per_instance(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.settings).max_idle = max;
        self
    }

    /// Keeps at most `max` idle HTTP/1 connections over every instance of these endpoints
    /// together (default: no bound but the per-instance one); a connection released when
    /// `max` are idle is closed. Each is a socket: with many instances, this is what keeps
    /// the idle ones within the process's descriptor limit.
    #[must_use]
    pub fn with_max_idle_total(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.settings).idle_total = Arc::new(settings::IdleBudget::new(max));
        self
    }

    /// Closes, instead of reusing, a connection that has been idle longer than `timeout`
    /// (default 4 s: below the keep-alive timeouts of common servers, 5 s for Node.js,
    /// Apache and uvicorn, so that a connection is rarely reused just as the instance
    /// closes it; nginx keeps 75 s, Go 90 s, and a longer timeout saves connects there).
    #[must_use]
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.settings).idle_timeout = timeout;
        self
    }

    /// Fails a request whose response head has not arrived `timeout` after the endpoint
    /// was called (connecting included) with a [`RequestError`] whose
    /// [`is_timeout`](RequestError::is_timeout) is true, and closes its connection. While
    /// the request body is still being sent and moving (a frame sent within the last
    /// `timeout`), the wait starts again: a slow upload is bounded by its body's own
    /// limits (a proxy's request body timeout), not by the wait for the answer.
    /// Default: no limit. Each connection keeps one timer and moves it from request to
    /// request, which costs an atomic operation per request rather than two visits to
    /// tokio's timer wheel, as wrapping each call in `tokio::time::timeout` does.
    #[must_use]
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.settings).response_timeout = Some(timeout);
        self
    }

    /// Opens at most `max` connections to an instance at once (default 8; at least 1).
    /// Requests that find no idle connection wait in order for the connections these
    /// connects produce, or for one released by another request. A connect goes on when
    /// the request that started it is dropped (bounded by the response timeout), and its
    /// connection waits idle for the next request: a client that starts and cancels
    /// requests costs no more connections than the requests that are sent.
    #[must_use]
    pub fn with_max_connects_per_instance(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.settings).max_connects = max.max(1);
        self
    }

    /// The HTTP/1 options of new connections (header limits, buffer sizes, and so on).
    #[must_use]
    pub fn with_http1(mut self, builder: hyper::client::conn::http1::Builder) -> Self {
        Arc::make_mut(&mut self.settings).http1 = builder;
        self
    }

    /// The HTTP/2 options of new connections (flow-control windows, frame and header
    /// sizes, keep-alive pings: a builder made with `hyper_util::rt::TokioExecutor`; the
    /// default one has `hyper_util::rt::TokioTimer` as its timer, which keep-alive needs).
    #[must_use]
    pub fn with_http2(
        mut self,
        builder: hyper::client::conn::http2::Builder<hyper_util::rt::TokioExecutor>,
    ) -> Self {
        Arc::make_mut(&mut self.settings).http2 = builder;
        self
    }

    /// Speaks `protocol` to the instances (default [`Protocol::Http1`]); see the
    /// [module docs](self#protocols).
    #[must_use]
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        let settings = Arc::make_mut(&mut self.settings);
        settings.protocol = protocol;
        #[cfg(feature = "tls")]
        if let Some((tls, prepared)) = &mut settings.tls {
            *prepared = tls.prepare(protocol);
        }
        self
    }

    /// The protocol spoken to the instances.
    #[must_use]
    pub fn protocol(&self) -> Protocol {
        self.settings.protocol
    }

    /// Reaches the `https://` instances (or every instance, [`Tls::with_every_instance`])
    /// over TLS (feature `tls`); see the [module docs](self).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    #[must_use]
    pub fn with_tls(mut self, tls: Tls) -> Self {
        let settings = Arc::make_mut(&mut self.settings);
        let prepared = tls.prepare(settings.protocol);
        settings.tls = Some((tls, prepared));
        self
    }

    /// How the instance at `address` is reached: plain, TLS, or refused (an `https://`
    /// instance without TLS settings).
    fn secure(&self, address: &crate::Address) -> Secure {
        let https = address.scheme() == &Scheme::HTTPS;
        #[cfg(feature = "tls")]
        if let Some((_, prepared)) = &self.settings.tls {
            return prepared.secure(address.authority(), https);
        }
        if !https {
            return Secure::Plain;
        }
        Secure::Refused(Arc::from(if cfg!(feature = "tls") {
            "the instance's address is `https://`, and these endpoints have no TLS settings \
             (HttpEndpoints::with_tls)"
        } else {
            "the instance's address is `https://`, and gray-discovery was built without its \
             `tls` feature"
        }))
    }
}

impl<C, B> HttpEndpoints<C, B>
where
    C: Service<Uri> + Clone,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    /// The endpoint of `instance`, with its own idle connections.
    pub fn endpoint(&self, instance: Instance) -> HttpEndpoint<C, B> {
        let address = instance.address();
        let secure = self.secure(address);
        let peer = Peer::new(self.settings.clone(), address.uri(), secure);
        HttpEndpoint {
            target: Target::new(self.connector.clone(), peer),
            instance,
        }
    }
}

impl<C, B> MakeEndpoint for HttpEndpoints<C, B>
where
    C: Service<Uri> + Clone,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    type Service = HttpEndpoint<C, B>;

    fn make_endpoint(&self, instance: &Instance) -> HttpEndpoint<C, B> {
        self.endpoint(instance.clone())
    }
}

impl<C: Clone, B> HttpEndpoints<C, B> {
    /// Maps a discover stream of instances (a registry's, a [`StaticDiscover`](crate::StaticDiscover),
    /// your own) to a discover stream of [`Endpoint`](crate::Endpoint)s of [`HttpEndpoint`]s.
    pub fn discover<D>(&self, discover: D) -> Endpoints<D, Self> {
        Endpoints::new(discover, self.clone())
    }
}

/// One instance as an HTTP client service; see the [module docs](self). Clones share the
/// instance's idle connections. The defaults are those of [`HttpEndpoints`]: plain TCP,
/// forwarding hyper's `Incoming` bodies.
pub struct HttpEndpoint<C = Connector, B = Incoming>
where
    C: Service<Uri>,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    target: Target<C, C::Response, B>,
    instance: Instance,
}

impl<C, B> Clone for HttpEndpoint<C, B>
where
    C: Service<Uri> + Clone,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    fn clone(&self) -> Self {
        HttpEndpoint {
            target: self.target.clone(),
            instance: self.instance.clone(),
        }
    }
}

impl<C, B> fmt::Debug for HttpEndpoint<C, B>
where
    C: Service<Uri>,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl<C, B> HttpEndpoint<C, B>
where
    C: Service<Uri>,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    /// The instance this endpoint sends to.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }
}

impl<C, B> Labelled for HttpEndpoint<C, B>
where
    C: Service<Uri>,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    fn labels(&self) -> &Labels {
        self.instance.labels()
    }

    /// The instance's address: a balancer probes it before an ejected endpoint comes
    /// back.
    fn origin(&self) -> Option<&dyn Origin> {
        Some(self)
    }
}

impl<C, B> Origin for HttpEndpoint<C, B>
where
    C: Service<Uri>,
    C::Response: Read + Write + Unpin,
    B: Body + 'static,
{
    fn scheme(&self) -> &Scheme {
        self.instance.address().scheme()
    }

    fn authority(&self) -> &Authority {
        self.instance.address().authority()
    }
}

impl<C, B> Service<Request<B>> for HttpEndpoint<C, B>
where
    C: Service<Uri> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
    C::Response: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<ResponseBody>;
    type Error = BoxError;
    type Future = EndpointFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Connections are opened on demand.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        // Origin-form: the instance gets the path and query only.
        let origin = match request.uri().path_and_query() {
            Some(pq) if request.uri().authority().is_none() && pq.as_str().starts_with('/') => None,
            Some(pq) => Some(pq.clone()),
            None => Some(PathAndQuery::from_static("/")),
        };
        if let Some(pq) = origin {
            *request.uri_mut() = Uri::from(pq);
        }
        self.target.clone().send(request)
    }
}
