//! The accept loop: limits on clients' connections, and graceful shutdown.
//!
//! Each accepted TCP connection goes through its listener's [`Handshake`] (none for
//! plaintext, TLS for the `[tls]` listener, in `crate::tls`), then is served by hyper-util's
//! `auto` connection (HTTP/1.1, or HTTP/2: with prior knowledge, or by ALPN over TLS) over
//! the connection's tower service, and watched by the [`Drain`](crate::drain::Drain): on
//! shutdown, in-flight requests complete and idle connections close. Both listeners share
//! one [`Server`]: its HTTP settings and its count of connections.
//!
//! Measured against hyper-util's `GracefulShutdown` and `TowerToHyperService`
//! (`cargo xtask bench-gateway --targets gateway --instructions`, user-space instructions per
//! request under callgrind, two runs each): both from hyper-util 37.9–38.1 k; hyper-util's
//! adapter with this drain 37.5–37.6 k; both here 37.1–37.2 k. The drain checks an atomic
//! flag per poll where `GracefulShutdown` polls a `watch` receiver (a lock), and the adapter
//! calls the service at once when it is ready where `TowerToHyperService` goes through
//! `Oneshot`.
//!
//! Limits (see the [crate docs](crate#limits)):
//!
//! - **connections**: at most `max_connections` are served at once; the accept loop stops
//!   accepting while that many are open, so further clients wait in the kernel's listen
//!   backlog (their TCP handshake completes; nothing is read from them) until one closes.
//! - **request heads**: a connection must send a complete request head within
//!   `header_read_timeout` of being accepted (its TLS handshake included), or of the first
//!   byte it sends after its previous response: else it is closed (slowloris). A head
//!   larger than `max_header_bytes` gets `431 Request Header Fields Too Large` (HTTP/1.1;
//!   HTTP/2 sends the limit as `SETTINGS_MAX_HEADER_LIST_SIZE` and resets larger streams).
//! - **idle connections**: a connection with no request in flight (response bodies
//!   included) and nothing sent for `idle_timeout` is closed.
//! - **stalled responses**: a connection whose response bodies make no progress for
//!   `send_timeout` is closed.
//! - **cancelled streams**: a connection whose client cancels most of its streams before
//!   their response is shut down gracefully (GOAWAY; [`limits`](crate::limits)).
//!
//! The timeouts are enforced by a watchdog task per connection, which looks at the
//! connection every quarter of the shortest timeout and closes it once its head has been
//! pending, or the connection idle, for the timeout: so a connection is closed between its
//! timeout and 1.25 times it. A request costs a few relaxed atomic operations: no clock
//! read, no timer, nothing polled in the connection's task.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
    task::AbortHandle,
};
use tower::Service;

use crate::{config::Limits, limits::Cancels};

/// How long a shutdown waits for the connections to finish before it drops them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What a connection goes through between its accept and HTTP: nothing ([`Plain`]), or a
/// TLS handshake (`crate::tls::Acceptor`). It runs in the connection's own task, within
/// the connection's limits: it holds one of the `max_connections` slots, and the
/// watchdog's head timeout, which starts at the accept, covers it.
pub(crate) trait Handshake: Send + Sync + 'static {
    /// The connection once it is ready for HTTP.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The handshake in progress.
    type Future: Future<Output = io::Result<Self::Io>> + Send + 'static;

    /// Starts the handshake of the connection `tcp`.
    fn handshake(&self, tcp: TcpStream) -> Self::Future;
}

/// No handshake: HTTP over the TCP connection itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    type Future = std::future::Ready<io::Result<TcpStream>>;

    fn handshake(&self, tcp: TcpStream) -> Self::Future {
        std::future::ready(Ok(tcp))
    }
}

/// What every listener of the proxy shares: the HTTP settings, the limits, and the count
/// of open connections (`max_connections` counts the plaintext and the TLS ones together).
#[derive(Debug)]
pub(crate) struct Server {
    builder: auto::Builder<TokioExecutor>,
    permits: Arc<Semaphore>,
    limits: Limits,
}

impl Server {
    /// The HTTP settings of every client connection, under `limits`.
    pub(crate) fn new(limits: Limits) -> Arc<Server> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            // Messages are written with one copy into one buffer and one `send`, rather than
            // as a vectored write of head and body: cheaper for the small messages that
            // dominate, at the cost of a copy of large bodies.
            .writev(false)
            // The head timeout is this module's (it also starts at a keep-alive connection's
            // first byte, not when the previous response ends, as hyper's does).
            .header_read_timeout(None)
            .max_buf_size(limits.max_header_bytes);
        builder
            .http2()
            .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
        crate::limits::http2(&mut builder, &limits);
        Arc::new(Server {
            builder,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
        })
    }
}

/// Serves connections from `listener`, each through `handshake`, then with the service
/// `make` builds for its peer, until `stopped` is set; then shuts down gracefully.
pub(crate) async fn serve<H, M, S, B>(
    server: Arc<Server>,
    listener: TcpListener,
    handshake: H,
    make: M,
    mut stopped: watch::Receiver<bool>,
) where
    H: Handshake,
    M: Fn(SocketAddr) -> S,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = crate::drain::Drain::new();
    let limits = server.limits;
    loop {
        let permit = tokio::select! {
            permit = server.permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = until_stopped(&mut stopped) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    crate::limits::warn(crate::limits::Warning::Accept, |suppressed| {
                        tracing::warn!(error = %e, suppressed, "accept failed");
                    });
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = until_stopped(&mut stopped) => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new(&limits));
        let service = Tracked {
            inner: make(peer),
            activity: activity.clone(),
            peer,
        };
        let handshaking = handshake.handshake(stream);
        let (server, graceful, watched) = (server.clone(), graceful.clone(), activity.clone());
        let cancels = activity.cancels.clone();
        let task = tokio::spawn(async move {
            match handshaking.await {
                Ok(io) => {
                    let io = TokioIo::new(Watched {
                        io,
                        activity: watched,
                    });
                    let conn = server
                        .builder
                        .serve_connection(io, Adapter { service })
                        .into_owned();
                    if let Err(e) = graceful.watch(conn).with_cancels(cancels).await {
                        tracing::debug!(error = %e, %peer, "connection closed with an error");
                    }
                }
                Err(e) => tracing::debug!(error = %e, %peer, "handshake failed"),
            }
            drop(permit);
        });
        if tick(&limits).is_some() {
            tokio::spawn(watchdog(activity, task.abort_handle(), limits, peer));
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; closing them");
    }
}

/// Resolves once the stop flag is set (or its sender is gone).
pub(crate) async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped at once: it must not live across an await.
    let _ = stopped.wait_for(|s| *s).await.map(|_| ());
}

// === Activity ===

/// What a connection is doing, shared by its reads, its requests and its watchdog. Kept
/// with a few relaxed atomic operations per request and no clock read: the watchdog
/// compares what it sees from one tick to the next.
#[derive(Debug)]
struct Activity {
    /// Requests whose response (body included) is not finished.
    in_flight: AtomicUsize,
    /// Requests finished so far.
    finished: AtomicU64,
    /// Bytes arrived while no request was in flight: a request head is being read. A new
    /// connection starts reading its head at once.
    head: AtomicBool,
    /// Response bodies being sent, and their frames sent so far: what `send_timeout`
    /// watches.
    bodies: AtomicUsize,
    sent: AtomicU64,
    /// Streams cancelled before their response.
    cancels: Arc<Cancels>,
}

impl Activity {
    fn new(limits: &Limits) -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
            head: AtomicBool::new(true),
            bodies: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            cancels: Arc::new(Cancels::new(limits.max_cancelled_streams_percent)),
        }
    }

    /// What `send_timeout` compares between ticks: `None` while no response body is sent.
    fn sending(&self) -> Option<u64> {
        (self.bodies.load(Ordering::Relaxed) > 0).then(|| self.sent.load(Ordering::Relaxed))
    }

    /// Bytes arrived: with no request in flight, they start a request head.
    fn read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 && !self.head.load(Ordering::Relaxed) {
            self.head.store(true, Ordering::Relaxed);
        }
    }

    /// A request head was read: the request is in flight.
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head.store(false, Ordering::Relaxed);
    }

    /// A response (body included) is finished.
    fn end(&self) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// What the watchdog compares between ticks: `None` while a request is in flight.
    fn state(&self) -> Option<(u64, bool)> {
        (self.in_flight.load(Ordering::Relaxed) == 0).then(|| {
            (
                self.finished.load(Ordering::Relaxed),
                self.head.load(Ordering::Relaxed),
            )
        })
    }
}

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    /// No complete request head in time.
    Head,
    /// Idle for too long.
    Idle,
    /// Response bodies made no progress for too long.
    Send,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expired::Head => "no complete request head within header_read_timeout",
            Expired::Idle => "idle for idle_timeout",
            Expired::Send => "response bodies made no progress for send_timeout",
        })
    }
}

/// Ends a request's flight when dropped: with its response body (then `true`), or with
/// its future.
#[derive(Debug)]
struct InFlight(Arc<Activity>, bool);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.1 {
            self.0.bodies.fetch_sub(1, Ordering::Relaxed);
        } else {
            // The response future was dropped before its response.
            self.0.cancels.cancelled();
        }
        self.0.end();
    }
}

// === Watchdog ===

/// How often a watchdog looks at its connection: a quarter of the shortest timeout, so a
/// connection is closed between its timeout and 1.25 times it.
fn tick(limits: &Limits) -> Option<Duration> {
    [
        limits.idle_timeout,
        limits.header_read_timeout,
        limits.send_timeout,
    ]
    .into_iter()
    .flatten()
    .min()
    .map(|t| (t / 4).max(Duration::from_millis(1)))
}

/// Watches one connection, on a task of its own (the connection's task pays nothing per
/// poll): every tick it compares the connection's [`Activity`] with the previous tick's and
/// aborts the connection's task (closing the connection) once the same head has been
/// pending, or the connection idle, for the timeout. Ends with the connection.
async fn watchdog(activity: Arc<Activity>, conn: AbortHandle, limits: Limits, peer: SocketAddr) {
    let Some(tick) = tick(&limits) else {
        return;
    };
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    // The state seen, and for how long it has been seen unchanged.
    let mut seen = None;
    let mut unchanged = Duration::ZERO;
    let (mut sending, mut stalled) = (None, Duration::ZERO);
    loop {
        interval.tick().await;
        if conn.is_finished() {
            return;
        }
        if let Some(limit) = limits.send_timeout {
            let now = activity.sending();
            if now.is_some() && now == sending {
                stalled += tick;
                if stalled >= limit {
                    tracing::debug!(%peer, "connection closed: {}", Expired::Send);
                    conn.abort();
                    return;
                }
            } else {
                (sending, stalled) = (now, Duration::ZERO);
            }
        }
        let now = activity.state();
        if now.is_none() || now != seen {
            seen = now;
            unchanged = Duration::ZERO;
            continue;
        }
        unchanged += tick;
        let (expired, limit) = match now {
            Some((_, true)) => (Expired::Head, limits.header_read_timeout),
            _ => (Expired::Idle, limits.idle_timeout),
        };
        if limit.is_some_and(|limit| unchanged >= limit) {
            tracing::debug!(%peer, "connection closed: {expired}");
            conn.abort();
            return;
        }
    }
}

// === Watched I/O ===

pin_project! {
    /// A connection (its socket, or its TLS stream), telling its [`Activity`] when bytes
    /// arrive.
    struct Watched<I> {
        #[pin]
        io: I,
        activity: Arc<Activity>,
    }
}

impl<I: AsyncRead> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        ready!(this.io.poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.read();
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

// === Tracked service and body ===

/// The connection's service, keeping its [`Activity`]'s count of requests in flight.
#[derive(Debug, Clone)]
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    peer: SocketAddr,
}

impl<S, B> Service<Request<Incoming>> for Tracked<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        self.activity.begin();
        if self.activity.cancels.begin() {
            let peer = self.peer;
            crate::limits::warn(crate::limits::Warning::Cancelling, |suppressed| {
                tracing::warn!(%peer, suppressed, "GOAWAY: the client cancels most of its streams (max_cancelled_streams_percent)");
            });
        }
        TrackedFuture {
            inner: self.inner.call(req),
            flight: Some(InFlight(self.activity.clone(), false)),
        }
    }
}

pin_project! {
    /// The response future of [`Tracked`]: moves the request's flight into the body.
    struct TrackedFuture<F> {
        #[pin]
        inner: F,
        flight: Option<InFlight>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx))?;
        let flight = this.flight.take().map(|mut flight| {
            flight.0.bodies.fetch_add(1, Ordering::Relaxed);
            flight.1 = true;
            flight
        });
        Poll::Ready(Ok(res.map(|inner| TrackedBody {
            inner,
            _flight: flight,
        })))
    }
}

pin_project! {
    /// A response body that ends its request's flight when dropped.
    #[derive(Debug)]
    pub(crate) struct TrackedBody<B> {
        #[pin]
        inner: B,
        _flight: Option<InFlight>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let (Some(flight), Some(Ok(_))) = (this._flight.as_ref(), &frame) {
            flight.0.sent.fetch_add(1, Ordering::Relaxed);
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

/// The connection's tower service as hyper calls it: each request goes through a clone of
/// it, called at once when it is ready (the proxy stack always is), else through
/// `Oneshot`.
#[derive(Clone)]
struct Adapter<S> {
    service: S,
}

impl<S> hyper::service::Service<Request<Incoming>> for Adapter<S>
where
    S: Service<Request<Incoming>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures_util::future::Either<S::Future, tower::util::Oneshot<S, Request<Incoming>>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        use tower::ServiceExt;
        let mut service = self.service.clone();
        let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
        match service.poll_ready(&mut noop) {
            Poll::Ready(Ok(())) => futures_util::future::Either::Left(service.call(req)),
            _ => futures_util::future::Either::Right(service.oneshot(req)),
        }
    }
}
