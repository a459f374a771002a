//! The HTTP/2 connection of one instance, shared by every request to it.
//!
//! One connection per instance, multiplexed: requests take a clone of its handle (a lock
//! held for a clone), and the connection runs on a task of its own (hyper's HTTP/2 client
//! needs one: it reads frames for every stream). When no connection is open, the first
//! request opens one and every request that arrives meanwhile waits for that same opening
//! (and gets its error if it fails): a burst of requests to a new instance opens one
//! connection, not one each. A connection that closed (the instance went away, or sent
//! `GOAWAY`) is replaced by the next request. A request that hyper hands back unsent (the
//! connection closed, or began shutting down, before the request went out) is sent once
//! more, on a new connection; when none can be had (the instance stopped listening), it
//! goes back to the caller whole, inside an [`Unsent`] (its body is kept unpinned until
//! hyper first polls it: [`H2Body`]), and a retrying balancer sends it elsewhere. A stream
//! the instance refused once it was sent (`REFUSED_STREAM`, or a stream above a graceful
//! `GOAWAY`'s last stream id) is not sent again here: the request fails with the stream's
//! error, which gray-balance's `classify` calls unsent (never processed), so a balancer
//! that kept a copy sends it elsewhere whatever its method. So does a request whose
//! connection failed before the instance sent its first byte: a server's connection
//! preface (its `SETTINGS`) comes before anything else it sends (RFC 9113 §3.4), so such a
//! connection processed nothing. That is the connection a closing listener accepted into
//! its backlog and then reset, as during a graceful shutdown: its error is wrapped in an
//! [`Unsent`] (the request itself is gone, sent into the connection).
//!
//! Requests beyond the instance's `SETTINGS_MAX_CONCURRENT_STREAMS` wait on the same
//! connection for a stream to end (hyper queues them): no second connection is opened,
//! as gRPC's own clients do.
//!
//! Over TLS with [`Protocol::Auto`](super::Protocol::Auto), opening a connection is also
//! how ALPN's choice is learned: an instance that chose HTTP/1.1 gets its requests over
//! HTTP/1.1 (the connection just opened goes to the idle HTTP/1 connections) until one of
//! its new connections chooses `h2` again.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
};

use futures_util::{FutureExt, future::Shared};
use gray_core::unsent::Unsent;
use http::{
    Request, Response, Uri, Version,
    header::HOST,
    uri::{self, Authority, PathAndQuery},
};
use hyper::{
    client::conn::http2::SendRequest,
    rt::{Read, ReadBuf, ReadBufCursor, Write},
};
use tower::BoxError;

use super::{
    body::ResponseBody,
    error::{RequestError, Stage},
    h1::Conn,
    h2_body::H2Body,
    target::{Deadline, MakeIo, Mode, SendBody, Target, TargetIo},
    transport::open,
};

/// What [`Target::h2_request`] changed of a request, to give it back as it came.
struct Original {
    uri: Uri,
    version: Version,
    host: Option<http::HeaderValue>,
}

/// The error of a request hyper handed back unsent: the request as it came inside an
/// [`Unsent`], when hyper never polled its body (a retrying balancer then sends it
/// elsewhere, whatever its method); else `error` alone.
fn handed_back<B: Send + 'static>(
    request: Request<H2Body<B>>,
    original: Original,
    error: impl Into<BoxError>,
) -> BoxError {
    let (mut parts, body) = request.into_parts();
    let Some(body) = body.into_inner() else {
        return error.into();
    };
    parts.uri = original.uri;
    parts.version = original.version;
    if let Some(host) = original.host {
        parts.headers.insert(HOST, host);
    }
    Box::new(Unsent::new(Request::from_parts(parts, body), error))
}

/// The handle that sends requests on an HTTP/2 connection, and whether the instance sent
/// anything on it yet ([`Heard`]).
struct Sender<B> {
    send: SendRequest<H2Body<B>>,
    heard: Arc<AtomicBool>,
}

impl<B> Clone for Sender<B> {
    fn clone(&self) -> Self {
        Sender {
            send: self.send.clone(),
            heard: self.heard.clone(),
        }
    }
}

impl<B> Sender<B> {
    fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    /// Whether the instance sent a first byte on the connection (its preface).
    fn heard(&self) -> bool {
        self.heard.load(Ordering::Acquire)
    }
}

/// An HTTP/2 connection's I/O that notes the first byte the instance sends (see the
/// [module docs](self)). Until then it reads through a small buffer of its own, since
/// safe code cannot tell how much a read filled of hyper's cursor; then it is the I/O
/// itself.
struct Heard<IO> {
    io: IO,
    heard: Arc<AtomicBool>,
}

impl<IO: Read + Unpin> Read for Heard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.heard.load(Ordering::Relaxed) {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let mut first = [0u8; 64];
        let len = buf.remaining().min(first.len());
        let mut read = ReadBuf::new(&mut first[..len]);
        ready!(Pin::new(&mut this.io).poll_read(cx, read.unfilled()))?;
        let filled = read.filled();
        if !filled.is_empty() {
            this.heard.store(true, Ordering::Release);
            buf.put_slice(filled);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: Write + Unpin> Write for Heard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// An opening connection, awaited by every request that needs it.
type Opening<B> = Shared<Pin<Box<dyn Future<Output = Result<Chosen<B>, RequestError>> + Send>>>;

/// What opening a connection gave: ALPN's choice, with the HTTP/2 handle when it chose `h2`.
enum Chosen<B> {
    Http2(Sender<B>),
    /// ALPN chose HTTP/1.1: the connection went to the idle HTTP/1 connections.
    Http1,
}

impl<B> Clone for Chosen<B> {
    fn clone(&self) -> Self {
        match self {
            Chosen::Http2(sender) => Chosen::Http2(sender.clone()),
            Chosen::Http1 => Chosen::Http1,
        }
    }
}

/// The instance's HTTP/2 connection, as far as it goes.
enum Slot<B> {
    Empty,
    /// Being opened; the number tells this opening from later ones.
    Opening(u64, Opening<B>),
    Ready(u64, Sender<B>),
}

/// The HTTP/2 connection of one instance; see the [module docs](self).
pub(crate) struct H2<B> {
    state: Mutex<Slot<B>>,
    openings: AtomicU64,
    /// ALPN chose HTTP/1.1 on the last connection opened ([`Mode::Alpn`] only).
    speaks_http1: AtomicBool,
}

// === impl H2 ===

impl<B> H2<B> {
    pub(crate) fn new() -> Self {
        H2 {
            state: Mutex::new(Slot::Empty),
            openings: AtomicU64::new(0),
            speaks_http1: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<B>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether ALPN chose HTTP/1.1 when a connection was last opened.
    pub(crate) fn speaks_http1(&self) -> bool {
        self.speaks_http1.load(Ordering::Relaxed)
    }

    pub(crate) fn set_speaks_http1(&self, http1: bool) {
        self.speaks_http1.store(http1, Ordering::Relaxed);
    }

    /// Forgets the connection of opening `number`, which could not take a request.
    fn forget(&self, number: u64) {
        let mut state = self.lock();
        if matches!(&*state, Slot::Ready(n, _) if *n == number) {
            *state = Slot::Empty;
        }
    }
}

impl<C: MakeIo<IO>, IO: TargetIo, B: SendBody> Target<C, IO, B> {
    /// The open connection's handle, or the one a new connection gives; `None` when ALPN
    /// chose HTTP/1.1.
    async fn sender(&mut self) -> Result<Option<(u64, Sender<B>)>, RequestError> {
        let (number, opening) = {
            let mut state = self.h2.lock();
            match &*state {
                Slot::Ready(number, sender) if !sender.is_closed() => {
                    return Ok(Some((*number, sender.clone())));
                }
                Slot::Opening(number, opening) => (*number, opening.clone()),
                _ => {
                    let number = self.h2.openings.fetch_add(1, Ordering::Relaxed);
                    let opening = self.opening().shared();
                    *state = Slot::Opening(number, opening.clone());
                    (number, opening)
                }
            }
        };
        let opened = opening.await;
        let mut state = self.h2.lock();
        let current = matches!(&*state, Slot::Opening(n, _) if *n == number);
        match opened {
            Ok(Chosen::Http2(sender)) => {
                if current {
                    *state = Slot::Ready(number, sender.clone());
                }
                Ok(Some((number, sender)))
            }
            Ok(Chosen::Http1) => {
                if current {
                    *state = Slot::Empty;
                }
                Ok(None)
            }
            Err(e) => {
                if current {
                    *state = Slot::Empty;
                }
                Err(e)
            }
        }
    }

    /// Opens a connection. It holds no reference to the endpoint: an opening nobody
    /// awaits any more keeps nothing alive.
    fn opening(&self) -> Pin<Box<dyn Future<Output = Result<Chosen<B>, RequestError>> + Send>> {
        let connector = self.connector.clone();
        let uri = self.uri.clone();
        let secure = self.secure.clone();
        let pool = self.pool.clone();
        let alpn = self.mode == Mode::Alpn;
        Box::pin(async move {
            let (io, h2) = open(connector, &uri, &secure).await?;
            let settings = &pool.settings;
            if alpn && !h2 {
                let conn = Conn::handshake(io, settings)
                    .await
                    .map_err(|e| RequestError::new(Stage::Handshake, uri.clone(), e))?;
                pool.put(conn);
                return Ok(Chosen::Http1);
            }
            let heard = Arc::new(AtomicBool::new(false));
            let io = Heard {
                io,
                heard: heard.clone(),
            };
            let (send, connection) = settings
                .http2
                .handshake(io)
                .await
                .map_err(|e| RequestError::new(Stage::Handshake, uri.clone(), e))?;
            let sender = Sender { send, heard };
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(target: "gray::discovery", instance = %uri, error = %e, "HTTP/2 connection closed");
                }
            });
            Ok(Chosen::Http2(sender))
        })
    }

    /// `request` in the form HTTP/2 sends it: absolute, its `Host` as its authority; and
    /// what [`restore`] needs to give it back as it came.
    fn h2_request(&self, mut request: Request<B>) -> (Request<H2Body<B>>, Original) {
        let original = Original {
            uri: request.uri().clone(),
            version: request.version(),
            host: request.headers().get(HOST).cloned(),
        };
        *request.version_mut() = Version::HTTP_2;
        let authority = request
            .headers_mut()
            .remove(HOST)
            .and_then(|host| Authority::try_from(host.as_bytes()).ok())
            .unwrap_or_else(|| self.authority.clone());
        let mut parts = uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(authority);
        parts.path_and_query = Some(
            request
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        (request.map(H2Body::new), original)
    }

    /// Sends `request` over HTTP/2 (or over HTTP/1.1, when ALPN chose it).
    pub(crate) fn run_h2(
        self,
        request: Request<B>,
        deadline: Deadline,
    ) -> Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, BoxError>> + Send>> {
        if super::is_upgrade_request(request.headers()) {
            // HTTP/2 has no `Upgrade` (RFC 9113 §8.6): nothing is sent.
            let error = self.error(
                Stage::Send,
                "an HTTP/1.1 upgrade (WebSocket) cannot be sent over HTTP/2, which this \
                 instance speaks: give its endpoints the protocol http1",
            );
            return Box::pin(std::future::ready(Err(error)));
        }
        Box::pin(self.exchange_h2(request, deadline))
    }

    async fn exchange_h2(
        mut self,
        request: Request<B>,
        deadline: Deadline,
    ) -> Result<Response<ResponseBody>, BoxError> {
        let exchange = async {
            let first = match self.sender().await {
                Ok(first) => first,
                // No connection: nothing was sent, the request goes back to the caller
                // (a retrying balancer sends it elsewhere).
                Err(e) => return Err(Box::new(Unsent::new(request, e)) as BoxError),
            };
            let Some((mut number, mut sender)) = first else {
                self.h2.set_speaks_http1(true);
                return self.clone().run_h1(request, None).await;
            };
            self.h2.set_speaks_http1(false);
            let (mut request, original) = self.h2_request(request);
            let mut again = true;
            loop {
                match sender.send.try_send_request(request).await {
                    Ok(response) => return Ok(response.map(|body| ResponseBody::new(body, None))),
                    // Not sent: the connection closed (or is shutting down: a GOAWAY) under
                    // us. Once more, on a new one; and when that cannot be had, the request
                    // goes back to the caller, unsent (a retrying balancer sends it
                    // elsewhere, whatever its method).
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if again => {
                            again = false;
                            self.h2.forget(number);
                            request = unsent;
                            match self.sender().await {
                                Ok(Some((n, s))) => (number, sender) = (n, s),
                                Ok(None) => {
                                    let error = self.error(
                                        Stage::Send,
                                        "the instance chose HTTP/1.1 on its new connection",
                                    );
                                    return Err(handed_back(request, original, error));
                                }
                                Err(error) => return Err(handed_back(request, original, error)),
                            }
                        }
                        Some(unsent) => {
                            self.h2.forget(number);
                            let error = self.error(Stage::Send, e.into_error());
                            return Err(handed_back(unsent, original, error));
                        }
                        None => {
                            let error = self.error(Stage::Send, e.into_error());
                            if sender.heard() {
                                return Err(error);
                            }
                            // The instance never sent its preface: it processed nothing.
                            return Err(Box::new(Unsent::new((), error)));
                        }
                    },
                }
            }
        };
        match deadline {
            Some((at, after)) => tokio::time::timeout_at(at, exchange)
                .await
                .map_err(|_| self.timeout(after))?,
            None => exchange.await,
        }
    }
}
