//! What one request to an instance carries ([`Target`]): the connector and the instance
//! ([`Peer`]: its connections and addresses), and how a request is sent in the
//! instance's protocol (HTTP/1.1: `super::h1`; HTTP/2: `super::h2`), returning an
//! [`EndpointFuture`].

use std::{
    fmt,
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::{
    HeaderValue, Request, Response, Uri,
    uri::{Authority, Scheme},
};
use http_body::Body;
use hyper::rt::{Read, Write};
use tower::BoxError;
use tower_service::Service;

use super::{
    Protocol,
    body::ResponseBody,
    error::{RequestError, Stage},
    h2::H2,
    pool::Pool,
    settings::Settings,
    transport::Secure,
};

/// Everything one request to an instance needs, moved into its future: the connector and
/// one reference count to clone per request (the balancer clones the endpoint, then the
/// request clones its target).
pub(crate) struct Target<C, IO: Read + Write + Unpin, B: Body + 'static> {
    pub(crate) connector: C,
    peer: Arc<Peer<IO, B>>,
}

/// Which HTTP version one instance is spoken to in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Http1,
    Http2,
    /// Over TLS, as ALPN decides ([`Protocol::Auto`]).
    Alpn,
}

/// One instance as its requests reach it: its connections (the idle HTTP/1 ones, the
/// HTTP/2 one) and its addresses; what a [`Target`] shares between the endpoint's clones
/// and its requests.
pub(crate) struct Peer<IO: Read + Write + Unpin, B: Body + 'static> {
    /// The idle HTTP/1 connections.
    pub(crate) pool: Arc<Pool<IO, B>>,
    /// The HTTP/2 connection.
    pub(crate) h2: H2<B>,
    /// `scheme://authority/` of the instance, what the connector is given.
    pub(crate) uri: Uri,
    /// The instance's authority, the `Host` of requests that have none.
    pub(crate) host: HeaderValue,
    /// The instance's authority, the `:authority` of HTTP/2 requests that have no `Host`.
    pub(crate) authority: Authority,
    /// `https` over TLS, else `http`: the `:scheme` of HTTP/2 requests.
    pub(crate) scheme: Scheme,
    /// Plain or TLS.
    pub(crate) secure: Secure,
    pub(crate) mode: Mode,
}

// === impl Peer ===

impl<IO: Read + Write + Unpin, B: Body + 'static> Peer<IO, B> {
    /// The instance at `uri`, with no connection yet.
    pub(crate) fn new(settings: Arc<Settings>, uri: Uri, secure: Secure) -> Self {
        let authority = uri
            .authority()
            .cloned()
            .unwrap_or_else(|| Authority::from_static("localhost"));
        let host = HeaderValue::from_str(authority.as_str())
            .unwrap_or_else(|_| unreachable!("an authority is a valid header value"));
        let mode = match settings.protocol {
            Protocol::Http1 => Mode::Http1,
            Protocol::Http2 => Mode::Http2,
            // Over cleartext there is no ALPN: HTTP/1.1.
            Protocol::Auto if secure.is_tls() => Mode::Alpn,
            Protocol::Auto => Mode::Http1,
        };
        let scheme = if secure.is_tls() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        // An instance reached over TLS is `https://` in errors and to the connector, whatever
        // its address said (`Tls::with_every_instance`).
        let uri = if uri.scheme() == Some(&scheme) {
            uri
        } else {
            let mut parts = uri.clone().into_parts();
            parts.scheme = Some(scheme.clone());
            Uri::from_parts(parts).unwrap_or(uri)
        };
        Peer {
            pool: Arc::new(Pool::new(settings)),
            h2: H2::new(),
            uri,
            host,
            authority,
            scheme,
            secure,
            mode,
        }
    }
}

// === impl Target ===

impl<C, IO: Read + Write + Unpin, B: Body + 'static> Target<C, IO, B> {
    pub(crate) fn new(connector: C, peer: Peer<IO, B>) -> Self {
        Target {
            connector,
            peer: Arc::new(peer),
        }
    }
}

impl<C: Clone, IO: Read + Write + Unpin, B: Body + 'static> Clone for Target<C, IO, B> {
    fn clone(&self) -> Self {
        Target {
            connector: self.connector.clone(),
            peer: self.peer.clone(),
        }
    }
}

impl<C, IO: Read + Write + Unpin, B: Body + 'static> std::ops::Deref for Target<C, IO, B> {
    type Target = Peer<IO, B>;

    fn deref(&self) -> &Peer<IO, B> {
        &self.peer
    }
}

/// What a [`Target`] connects with: a service from the instance's `Uri` to its I/O, with
/// the bounds every request needs, named once for `h1`, `h2` and this module.
pub(crate) trait MakeIo<IO>:
    Service<Uri, Response = IO, Future: Send, Error: Into<BoxError>> + Clone + Send + 'static
{
}

impl<C, IO> MakeIo<IO> for C where
    C: Service<Uri, Response = IO, Future: Send, Error: Into<BoxError>> + Clone + Send + 'static
{
}

/// A connection's I/O, as a [`Target`] reads and writes it.
pub(crate) trait TargetIo: Read + Write + Unpin + Send + 'static {}

impl<IO: Read + Write + Unpin + Send + 'static> TargetIo for IO {}

/// A request body a [`Target`] sends.
pub(crate) trait SendBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

impl<B: Body<Data: Send, Error: Into<BoxError>> + Send + 'static> SendBody for B {}

/// The response future of an endpoint.
pub struct EndpointFuture {
    inner: Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, BoxError>> + Send>>,
}

// === impl EndpointFuture ===

impl fmt::Debug for EndpointFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointFuture").finish_non_exhaustive()
    }
}

impl Future for EndpointFuture {
    type Output = Result<Response<ResponseBody>, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

/// When a request's response head is due, and the limit it was given.
pub(crate) type Deadline = Option<(tokio::time::Instant, Duration)>;

impl<C: MakeIo<IO>, IO: TargetIo, B: SendBody> Target<C, IO, B> {
    /// Sends `request` (origin-form URI) in the instance's protocol: HTTP/1.1 on an idle
    /// connection or a new one, or HTTP/2 on the instance's connection.
    pub(crate) fn send(self, request: Request<B>) -> EndpointFuture {
        let deadline = self
            .pool
            .settings
            .response_timeout
            .map(|after| (tokio::time::Instant::now() + after, after));
        let http2 = match self.mode {
            Mode::Http1 => false,
            Mode::Http2 => true,
            Mode::Alpn => !self.h2.speaks_http1(),
        };
        EndpointFuture {
            inner: if http2 {
                self.run_h2(request, deadline)
            } else {
                Box::pin(self.run_h1(request, deadline))
            },
        }
    }

    pub(crate) fn error(&self, stage: Stage, source: impl Into<BoxError>) -> BoxError {
        Box::new(RequestError::new(stage, self.uri.clone(), source))
    }

    pub(crate) fn timeout(&self, after: Duration) -> BoxError {
        // An I/O timeout as the source: `gray_balance::error::status_of` reads it as 504.
        self.error(
            Stage::Timeout(after),
            io::Error::from(io::ErrorKind::TimedOut),
        )
    }
}
