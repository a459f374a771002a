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
    error::Error as StdError,
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

use bytes::Bytes;
use gray_core::unsent::Unsent;
use http::{HeaderValue, Request, Response, Uri, Version, header::HOST};
use http_body::{Body, Frame, SizeHint};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, Connection, SendRequest},
    rt::{Read, Write},
};
use tokio::time::Sleep;
use tower::BoxError;
use tower_service::Service;

use super::connecting::{Connects, Handoff, Home};

/// How the connections of every instance are kept.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Idle connections kept per instance; more are closed when released.
    pub(crate) max_idle: usize,
    /// An idle connection older than this is closed instead of reused.
    pub(crate) idle_timeout: Duration,
    /// The HTTP/1 options of new connections.
    pub(crate) http1: http1::Builder,
    /// The time a request may take until its response head, connecting included.
    pub(crate) response_timeout: Option<Duration>,
    /// Connects running at once per instance ([`super::connecting`]).
    pub(crate) max_connects: usize,
}

// === impl Settings ===

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_idle: 256,
            idle_timeout: Duration::from_secs(90),
            http1: http1::Builder::new(),
            response_timeout: None,
            max_connects: 8,
        }
    }
}

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

/// A connection and the handle that sends requests on it.
struct Conn<IO: Read + Write, B: Body + 'static> {
    sender: SendRequest<Tracked<B>>,
    driver: Connection<IO, Tracked<B>>,
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
pub(crate) struct Pool<IO: Read + Write, B: Body + 'static> {
    idle: Mutex<Vec<Box<Conn<IO, B>>>>,
    /// Requests waiting for a connection, and the connects that serve them.
    connects: Connects<Box<Conn<IO, B>>>,
    settings: Arc<Settings>,
}

// === impl Pool ===

impl<IO: Read + Write, B: Body + 'static> Pool<IO, B> {
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

    fn put(self: &Arc<Self>, mut conn: Box<Conn<IO, B>>)
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
    IO: Read + Write + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
{
    fn home(self: Arc<Self>, conn: Box<Conn<IO, B>>) {
        self.put(conn);
    }
}

/// A leased connection, as the response body sees it: something to drive, then release.
trait Lease: Send {
    fn drive(&mut self, cx: &mut Context<'_>);
    fn release(self: Box<Self>);
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

/// The body of a response from an instance: hyper's body, and the connection it arrives
/// on, which reading the body drives. When the body ends the connection is reused; when
/// the body is dropped before its end, the connection is closed.
pub struct ResponseBody {
    inner: Incoming,
    lease: Option<Box<dyn Lease>>,
}

// === impl ResponseBody ===

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("leased", &self.lease.is_some())
            .finish()
    }
}

impl ResponseBody {
    fn new(inner: Incoming, lease: Box<dyn Lease>) -> Self {
        let mut body = ResponseBody {
            inner,
            lease: Some(lease),
        };
        body.release_if_done();
        body
    }

    fn release_if_done(&mut self) {
        if self.inner.is_end_stream() {
            if let Some(lease) = self.lease.take() {
                lease.release();
            }
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(lease) = &mut this.lease {
            lease.drive(cx);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => {
                if let Some(lease) = this.lease.take() {
                    lease.release();
                }
            }
            Some(Ok(_)) => this.release_if_done(),
            // The connection failed: dropping the lease closes it.
            Some(Err(_)) => this.lease = None,
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

/// What failed when sending a request to an instance.
#[derive(Debug)]
pub struct RequestError {
    stage: Stage,
    instance: Uri,
    source: BoxError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Connect,
    Handshake,
    Send,
    Timeout(Duration),
}

// === impl RequestError ===

impl RequestError {
    /// Whether the connection could not be established (the request was not sent).
    pub fn is_connect(&self) -> bool {
        matches!(self.stage, Stage::Connect | Stage::Handshake)
    }

    /// Whether the response head did not arrive within the
    /// [response timeout](super::HttpEndpoints::with_response_timeout).
    pub fn is_timeout(&self) -> bool {
        matches!(self.stage, Stage::Timeout(_))
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.stage {
            Stage::Connect => "cannot connect to",
            Stage::Handshake => "HTTP/1 handshake failed with",
            Stage::Send => "request failed at",
            Stage::Timeout(after) => {
                return write!(f, "no response from {} within {after:?}", self.instance);
            }
        };
        write!(f, "{what} {}: {}", self.instance, self.source)
    }
}

impl StdError for RequestError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// Everything one request to an instance needs, moved into its future: the connector and
/// one reference count to clone per request (the balancer clones the endpoint, then the
/// request clones its target).
pub(crate) struct Target<C, IO: Read + Write, B: Body + 'static> {
    pub(crate) connector: C,
    shared: Arc<Shared<IO, B>>,
}

/// What a [`Target`] shares between the endpoint's clones and its requests.
pub(crate) struct Shared<IO: Read + Write, B: Body + 'static> {
    pub(crate) pool: Arc<Pool<IO, B>>,
    /// `scheme://authority/` of the instance, what the connector is given.
    pub(crate) uri: Uri,
    /// The instance's authority, the `Host` of requests that have none.
    pub(crate) host: HeaderValue,
}

// === impl Target ===

impl<C, IO: Read + Write, B: Body + 'static> Target<C, IO, B> {
    pub(crate) fn new(connector: C, shared: Shared<IO, B>) -> Self {
        Target {
            connector,
            shared: Arc::new(shared),
        }
    }
}

impl<C: Clone, IO: Read + Write, B: Body + 'static> Clone for Target<C, IO, B> {
    fn clone(&self) -> Self {
        Target {
            connector: self.connector.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<C, IO: Read + Write, B: Body + 'static> std::ops::Deref for Target<C, IO, B> {
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
    /// Sends `request` (origin-form URI, HTTP/1.1, `Host` set if missing) on an idle
    /// connection, or on a new one.
    pub(crate) fn send(self, mut request: Request<B>) -> EndpointFuture {
        *request.version_mut() = Version::HTTP_11;
        let added_host = !request.headers().contains_key(HOST);
        if added_host {
            request.headers_mut().insert(HOST, self.host.clone());
        }
        EndpointFuture {
            inner: Box::pin(self.run(request, added_host)),
        }
    }

    fn error(&self, stage: Stage, source: impl Into<BoxError>) -> BoxError {
        Box::new(RequestError {
            stage,
            instance: self.uri.clone(),
            source: source.into(),
        })
    }

    async fn connect(&mut self) -> Result<Box<Conn<IO, B>>, BoxError> {
        poll_fn(|cx| self.connector.poll_ready(cx))
            .await
            .map_err(|e| self.error(Stage::Connect, e))?;
        let io = self
            .connector
            .call(self.uri.clone())
            .await
            .map_err(|e| self.error(Stage::Connect, e))?;
        let (sender, driver) = self
            .pool
            .settings
            .http1
            .handshake(io)
            .await
            .map_err(|e| self.error(Stage::Handshake, e))?;
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

    /// A connection from the instance's [`Connects`], once one is free: from a connect
    /// (started here if fewer than the cap run), or released by another request.
    async fn handed(&mut self) -> Result<Option<Box<Conn<IO, B>>>, BoxError> {
        let waiter = self.pool.connects.wait();
        if waiter.start {
            let mut target = self.clone();
            // Bounded like a request's connect, whether or not the request still waits.
            let limit = self.pool.settings.response_timeout;
            tokio::spawn(async move {
                let pool = target.pool.clone();
                loop {
                    let connected = match limit {
                        Some(after) => tokio::time::timeout(after, target.connect())
                            .await
                            .unwrap_or_else(|_| Err(target.timeout(after))),
                        None => target.connect().await,
                    };
                    if !pool.connects.finished(connected, &pool) {
                        break;
                    }
                }
            });
        }
        match waiter.handed.await {
            Ok(handed) => handed.map(Handoff::take),
            Err(_) => Err(self.error(Stage::Connect, "the connect task ended")),
        }
    }

    fn timeout(&self, after: Duration) -> BoxError {
        // An I/O timeout as the source: `gray_balance::error::status_of` reads it as 504.
        self.error(
            Stage::Timeout(after),
            io::Error::from(io::ErrorKind::TimedOut),
        )
    }

    async fn run(
        mut self,
        mut request: Request<B>,
        added_host: bool,
    ) -> Result<Response<ResponseBody>, BoxError> {
        let limit = self.pool.settings.response_timeout;
        let deadline = limit.map(|after| (tokio::time::Instant::now() + after, after));
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
                        // Connecting is rare: a timer of its own.
                        let handed = match deadline {
                            Some((at, after)) => {
                                match tokio::time::timeout_at(at, self.handed()).await {
                                    Ok(handed) => handed,
                                    Err(_) => return Err(self.timeout(after)),
                                }
                            }
                            None => self.handed().await,
                        };
                        match handed {
                            Ok(Some(mut conn)) => {
                                if poll_fn(|cx| Poll::Ready(conn.usable(cx))).await {
                                    break conn;
                                }
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
                    return Ok(response.map(|body| ResponseBody::new(body, conn)));
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
