//! The connections of one instance, driven by the requests that use them.
//!
//! A hyper HTTP/1 connection is a future that must be polled for the connection to read and
//! write. hyper-util's pooled client spawns a task per connection for that, so each request
//! crosses two tasks and two channels. Here the request's own future polls the connection
//! until the response head arrives, and the response body ([`ResponseBody`]) polls it while
//! the body is read; when the body ends, the connection goes back to the instance's idle
//! list. One task, no hand-off, and nothing to clean up: an idle connection that the
//! instance closed is found closed (and dropped) the next time it is taken.
//!
//! A connection goes back to the idle list only once it no longer holds its request body.
//! An instance may answer before it has read the body (then close): the response ends
//! while the body is still being sent, and nobody would poll an idle connection to send
//! the rest. In a proxy, that body is the client's upload, and the client's connection
//! would wait for an unrelated request to take this one. So such a connection is closed
//! when its response ends, which drops the request body, and the request is over.

use std::{
    fmt,
    future::{Future, poll_fn},
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use gray_core::unsent::Unsent;
use http::{
    HeaderValue, Request, Response, Uri, Version,
    header::HOST,
    uri::{Authority, Scheme},
};
use http_body::{Body, Frame, SizeHint};
use hyper::{
    client::conn::http1::{Connection, SendRequest},
    rt::{Read, Write},
};
use tokio::time::Sleep;
use tower::BoxError;
use tower_service::Service;

use super::connecting::{Connects, Home};
pub(crate) use super::settings::Settings;
use super::{
    Protocol,
    body::{Lease, ResponseBody},
    error::{RequestError, Stage},
    h2::H2,
    transport::{Secure, Transport, open},
};

pin_project_lite::pin_project! {
    /// A request body that tells its connection when the connection has let go of it: once
    /// written whole (or abandoned), hyper drops it.
    pub(crate) struct Tracked<B> {
        #[pin]
        inner: B,
        released: Released,
    }
}

/// Sets its flag when dropped; counts the body's frames (its progress) meanwhile.
struct Released(Arc<AtomicBool>, Arc<AtomicU64>);

// === impl Released ===

impl Drop for Released {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

// === impl Tracked ===

impl<B> Tracked<B> {
    fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(_)) = frame {
            this.released.1.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An HTTP/1 connection and the handle that sends requests on it.
pub(crate) struct Conn<IO: Read + Write + Unpin, B: Body + 'static> {
    sender: SendRequest<Tracked<B>>,
    driver: Connection<Transport<IO>, Tracked<B>>,
    /// Whether the connection has let go of the last request's body (sent it whole, or
    /// dropped it): only then may it wait idle for the next request.
    body_released: Arc<AtomicBool>,
    /// Frames of request bodies sent so far: a body still moving holds off the response
    /// timeout.
    body_frames: Arc<AtomicU64>,
    /// The driver finished: the connection is closed (or failed).
    ended: bool,
    /// When it was released to the idle list.
    idle_since: Instant,
    /// The pool it returns to, while it is leased.
    pool: Option<Arc<Pool<IO, B>>>,
    /// The response timeout of the request in flight, kept for the next request: moving a
    /// registered tokio timer to a later deadline is one atomic operation, where a new timer
    /// per request takes the timer wheel's lock twice (register, deregister).
    timer: Option<Pin<Box<Sleep>>>,
}

// === impl Conn ===

impl<IO, B> Conn<IO, B>
where
    IO: Read + Write + Unpin,
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// The HTTP/1 handshake over `io` (it sends nothing).
    pub(crate) async fn handshake(
        io: Transport<IO>,
        settings: &Settings,
    ) -> Result<Box<Self>, hyper::Error> {
        let (sender, driver) = settings.http1.handshake(io).await?;
        Ok(Box::new(Conn {
            sender,
            driver,
            body_released: Arc::new(AtomicBool::new(true)),
            body_frames: Arc::new(AtomicU64::new(0)),
            ended: false,
            idle_since: Instant::now(),
            pool: None,
            timer: None,
        }))
    }

    /// Lets the connection read and write what it can. Never waits.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.ended && Pin::new(&mut self.driver).poll(cx).is_ready() {
            // Closed by the peer, or failed: the request or body in flight sees the error
            // through its own channel.
            self.ended = true;
        }
    }

    /// Whether a new request can be sent now: the connection is open and idle.
    fn usable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx);
        !self.ended && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }
}

/// The idle connections of one instance.
pub(crate) struct Pool<IO: Read + Write + Unpin, B: Body + 'static> {
    idle: Mutex<Vec<Box<Conn<IO, B>>>>,
    /// Requests waiting for a connection, and the connects that serve them.
    connects: Connects<Box<Conn<IO, B>>>,
    pub(crate) settings: Arc<Settings>,
}

// === impl Pool ===

impl<IO: Read + Write + Unpin, B: Body + 'static> Pool<IO, B> {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            connects: Connects::new(settings.max_connects),
            settings,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Box<Conn<IO, B>>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently released connection that is still fresh, if any. The lock is held
    /// for a pop; older connections than the idle timeout are dropped on the way.
    fn take(&self) -> Option<Box<Conn<IO, B>>> {
        let now = Instant::now();
        loop {
            let conn = self.lock().pop()?;
            if now.saturating_duration_since(conn.idle_since) <= self.settings.idle_timeout {
                return Some(conn);
            }
        }
    }

    pub(crate) fn put(self: &Arc<Self>, mut conn: Box<Conn<IO, B>>)
    where
        IO: Send + 'static,
        B: Send,
        B::Data: Send,
    {
        // A connection still sending its request body (the instance answered early) is
        // closed here: idle, nobody would poll it to send the rest.
        if conn.ended || conn.sender.is_closed() || !conn.body_released.load(Ordering::Acquire) {
            return;
        }
        conn.pool = None;
        // Requests waiting for a connection come first.
        let Some(mut conn) = self.connects.offer(conn, self) else {
            return;
        };
        conn.idle_since = Instant::now();
        let mut idle = self.lock();
        if idle.len() < self.settings.max_idle {
            idle.push(conn);
        }
    }
}

impl<IO, B> Home<Box<Conn<IO, B>>> for Pool<IO, B>
where
    IO: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
{
    fn home(self: Arc<Self>, conn: Box<Conn<IO, B>>) {
        self.put(conn);
    }
}

impl<IO, B> Lease for Conn<IO, B>
where
    IO: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    fn drive(&mut self, cx: &mut Context<'_>) {
        Conn::drive(self, cx);
    }

    fn release(mut self: Box<Self>) {
        if let Some(pool) = self.pool.take() {
            pool.put(self);
        }
    }
}

/// Everything one request to an instance needs, moved into its future: the connector and
/// one reference count to clone per request (the balancer clones the endpoint, then the
/// request clones its target).
pub(crate) struct Target<C, IO: Read + Write + Unpin, B: Body + 'static> {
    pub(crate) connector: C,
    shared: Arc<Shared<IO, B>>,
}

/// Which HTTP version one instance is spoken to in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Http1,
    Http2,
    /// Over TLS, as ALPN decides ([`Protocol::Auto`]).
    Alpn,
}

/// What a [`Target`] shares between the endpoint's clones and its requests.
pub(crate) struct Shared<IO: Read + Write + Unpin, B: Body + 'static> {
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

// === impl Shared ===

impl<IO: Read + Write + Unpin, B: Body + 'static> Shared<IO, B> {
    /// The shared state of the endpoint of the instance at `uri`.
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
        Shared {
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
    pub(crate) fn new(connector: C, shared: Shared<IO, B>) -> Self {
        Target {
            connector,
            shared: Arc::new(shared),
        }
    }
}

impl<C: Clone, IO: Read + Write + Unpin, B: Body + 'static> Clone for Target<C, IO, B> {
    fn clone(&self) -> Self {
        Target {
            connector: self.connector.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<C, IO: Read + Write + Unpin, B: Body + 'static> std::ops::Deref for Target<C, IO, B> {
    type Target = Shared<IO, B>;

    fn deref(&self) -> &Shared<IO, B> {
        &self.shared
    }
}

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

/// A new connection, as an HTTP/1 request opened it.
enum Opened<IO: Read + Write + Unpin, B: Body + 'static> {
    Http1(Box<Conn<IO, B>>),
    /// ALPN chose HTTP/2 ([`Mode::Alpn`]): the request goes to the HTTP/2 connection.
    Http2,
}

impl<C, IO, B> Target<C, IO, B>
where
    C: Service<Uri, Response = IO> + Clone + Send + 'static,
    C::Future: Send,
    C::Error: Into<BoxError>,
    IO: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
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

    /// A new HTTP/1 connection (what the capped connects of [`Connects`] open).
    async fn connect_h1(&mut self) -> Result<Box<Conn<IO, B>>, BoxError> {
        let (io, _) = open(self.connector.clone(), &self.uri, &self.secure).await?;
        Conn::handshake(io, &self.pool.settings)
            .await
            .map_err(|e| self.error(Stage::Handshake, e))
    }

    /// A connection for a request that found no idle one: from the instance's
    /// [`Connects`], once one is free (a connect started here if fewer than the cap run,
    /// or a connection released by another request); over TLS with ALPN to choose
    /// ([`Mode::Alpn`]), a connection of its own, which may turn out to speak HTTP/2.
    async fn handed(&mut self) -> Result<Option<Opened<IO, B>>, BoxError> {
        if self.mode == Mode::Alpn {
            return self.connect().await.map(Some);
        }
        let waiter = self.pool.connects.wait();
        if waiter.start {
            let mut target = self.clone();
            // Bounded like a request's connect, whether or not the request still waits.
            let limit = self.pool.settings.response_timeout;
            tokio::spawn(async move {
                let pool = target.pool.clone();
                loop {
                    let connected = match limit {
                        Some(after) => tokio::time::timeout(after, target.connect_h1())
                            .await
                            .unwrap_or_else(|_| Err(target.timeout(after))),
                        None => target.connect_h1().await,
                    };
                    if !pool.connects.finished(connected, &pool) {
                        break;
                    }
                }
            });
        }
        match waiter.handed.await {
            Ok(handed) => handed.map(|h| h.take().map(Opened::Http1)),
            Err(_) => Err(self.error(Stage::Connect, "the connect task ended")),
        }
    }

    async fn connect(&mut self) -> Result<Opened<IO, B>, BoxError> {
        let (io, h2) = open(self.connector.clone(), &self.uri, &self.secure).await?;
        if h2 && self.mode == Mode::Alpn {
            // The instance speaks HTTP/2 again: this connection is not needed.
            self.h2.set_speaks_http1(false);
            return Ok(Opened::Http2);
        }
        let conn = Conn::handshake(io, &self.pool.settings)
            .await
            .map_err(|e| self.error(Stage::Handshake, e))?;
        Ok(Opened::Http1(conn))
    }

    pub(crate) fn timeout(&self, after: Duration) -> BoxError {
        // An I/O timeout as the source: `gray_balance::error::status_of` reads it as 504.
        self.error(
            Stage::Timeout(after),
            io::Error::from(io::ErrorKind::TimedOut),
        )
    }

    /// Sends `request` over HTTP/1.1.
    ///
    /// Not an `async fn`, which keeps its arguments twice in its future (as captured and as
    /// locals): this future is boxed for every request, so it is kept small (about 800
    /// bytes), with the rare connect path in a box of its own.
    pub(crate) fn run_h1(
        mut self,
        mut request: Request<B>,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Response<ResponseBody>, BoxError>> + Send + 'static {
        *request.version_mut() = Version::HTTP_11;
        let added_host = !request.headers().contains_key(HOST);
        if added_host {
            request.headers_mut().insert(HOST, self.host.clone());
        }
        async move {
            loop {
                // An idle connection that is still open, else a new one.
                let mut fresh = false;
                let mut conn = loop {
                    match self.pool.take() {
                        Some(mut conn) => {
                            if poll_fn(|cx| Poll::Ready(conn.usable(cx))).await {
                                break conn;
                            }
                        }
                        None => {
                            fresh = true;
                            // Connecting is rare: a timer of its own, and a box, so that
                            // the request's future stays small.
                            let handed = Box::pin(self.handed());
                            let handed = match deadline {
                                Some((at, after)) => {
                                    match tokio::time::timeout_at(at, handed).await {
                                        Ok(handed) => handed,
                                        Err(_) => return Err(self.timeout(after)),
                                    }
                                }
                                None => handed.await,
                            };
                            match handed {
                                Ok(Some(Opened::Http1(mut conn))) => {
                                    if poll_fn(|cx| Poll::Ready(conn.usable(cx))).await {
                                        break conn;
                                    }
                                }
                                Ok(Some(Opened::Http2)) => {
                                    if added_host {
                                        request.headers_mut().remove(HOST);
                                    }
                                    return self.run_h2(request, deadline).await;
                                }
                                Ok(None) => {}
                                // Nothing was sent: the request goes back to the caller, as
                                // it came (a retrying balancer sends it elsewhere).
                                Err(e) => {
                                    if added_host {
                                        request.headers_mut().remove(HOST);
                                    }
                                    return Err(Box::new(Unsent::new(request, e)));
                                }
                            }
                        }
                    }
                };
                if let Some((at, _)) = deadline {
                    match &mut conn.timer {
                        Some(timer) => timer.as_mut().reset(at),
                        None => conn.timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                conn.body_released.store(false, Ordering::Release);
                let released = Released(conn.body_released.clone(), conn.body_frames.clone());
                let mut frames_seen = conn.body_frames.load(Ordering::Relaxed);
                let tracked = request.map(|inner| Tracked { inner, released });
                let mut sent = std::pin::pin!(conn.sender.try_send_request(tracked));
                let result = poll_fn(|cx| {
                    conn.drive(cx);
                    if let Poll::Ready(result) = sent.as_mut().poll(cx) {
                        return Poll::Ready(Some(result));
                    }
                    let (Some(timer), Some((_, after))) = (&mut conn.timer, deadline) else {
                        return Poll::Pending;
                    };
                    loop {
                        ready!(timer.as_mut().poll(cx));
                        // A request body still being sent, and moving since the timer was set,
                        // is bounded by its own limits (the caller's): the wait for the
                        // answer starts again.
                        let frames = conn.body_frames.load(Ordering::Relaxed);
                        if conn.body_released.load(Ordering::Acquire) || frames == frames_seen {
                            return Poll::Ready(None);
                        }
                        frames_seen = frames;
                        timer.as_mut().reset(tokio::time::Instant::now() + after);
                    }
                })
                .await;
                let Some(result) = result else {
                    // Timed out: dropping the connection closes it (its request is in flight).
                    let after = deadline.map_or(Duration::ZERO, |(_, after)| after);
                    return Err(self.timeout(after));
                };
                match result {
                    Ok(response) => {
                        conn.pool = Some(self.pool.clone());
                        let lease: Box<dyn Lease> = conn;
                        return Ok(response.map(|body| ResponseBody::new(body, Some(lease))));
                    }
                    // Not sent: the idle connection was closed under us. Try another one; a
                    // new connection that cannot take the request is an error.
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !fresh => request = unsent.map(Tracked::into_inner),
                        _ => return Err(self.error(Stage::Send, e.into_error())),
                    },
                }
            }
        }
    }
}
