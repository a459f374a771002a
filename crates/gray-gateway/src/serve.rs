//! The accept loop: limits on clients' connections, and graceful shutdown.
//!
//! Each accepted TCP connection is served by hyper-util's `auto` connection (HTTP/1.1, or
//! HTTP/2 with prior knowledge) over the connection's tower service, and watched by the
//! [`Drain`](crate::drain::Drain): on shutdown, in-flight requests complete and idle
//! connections close.
//!
//! Measured against hyper-util's `GracefulShutdown` and `TowerToHyperService`
//! (`scripts/bench-gateway --targets gateway --instructions`, user-space instructions per
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
//!   `header_read_timeout` of being accepted, or of the first byte it sends after its
//!   previous response: else it is closed (slowloris). A head larger than
//!   `max_header_bytes` gets `431 Request Header Fields Too Large` (HTTP/1.1; HTTP/2 sends
//!   the limit as `SETTINGS_MAX_HEADER_LIST_SIZE` and resets larger streams).
//! - **idle connections**: a connection with no request in flight (response bodies
//!   included) and nothing sent for `idle_timeout` is closed.
//!
//! The timeouts are enforced by one timer per connection, which wakes at the connection's
//! deadline and at least once per shortest timeout to see whether the deadline moved; a
//! request costs a few atomic updates and a clock read, not a timer reset.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
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
    time::{Instant, Sleep},
};
use tower::Service;

use crate::config::Limits;

/// How long a shutdown waits for the connections to finish before it drops them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Serves connections from `listener`, each with the service `make` builds for its peer,
/// until `stopped` is set; then shuts down gracefully.
pub(crate) async fn serve<M, S, B>(
    listener: TcpListener,
    make: M,
    limits: Limits,
    mut stopped: watch::Receiver<bool>,
) where
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
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = until_stopped(&mut stopped) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = until_stopped(&mut stopped) => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let service = Tracked {
            inner: make(peer),
            activity: activity.clone(),
        };
        let io = TokioIo::new(Watched {
            io: stream,
            activity: activity.clone(),
        });
        let conn = builder
            .serve_connection(io, Adapter { service })
            .into_owned();
        let conn = Timeouts::new(graceful.watch(conn), activity, limits);
        tokio::spawn(async move {
            match conn.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, %peer, "connection closed with an error"),
                Err(expired) => tracing::debug!(%peer, "connection closed: {expired}"),
            }
            drop(permit);
        });
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

/// What a connection is doing, shared by its reads, its requests and its timer.
#[derive(Debug)]
struct Activity {
    /// The connection's start, from which the times below count (in nanoseconds).
    start: Instant,
    /// Requests whose response (body included) is not finished.
    in_flight: AtomicUsize,
    /// When the last request finished (the start, before the first).
    idle_since: AtomicU64,
    /// When the first byte of the next request head arrived, plus one; 0 while no head
    /// is being read. A new connection starts reading its head at once.
    head_since: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(1),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    fn at(&self, nanos: u64) -> Instant {
        self.start + Duration::from_nanos(nanos)
    }

    /// Bytes arrived: with no request in flight, they start a request head.
    fn read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Acquire) == 0
        {
            self.head_since.store(self.now() + 1, Ordering::Release);
        }
    }

    /// A request head was read: the request is in flight.
    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(0, Ordering::Release);
    }

    /// A response (body included) is finished.
    fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle_since.store(self.now(), Ordering::Release);
        }
    }

    /// The deadline the connection must act by, and what it is.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Expired)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        match self.head_since.load(Ordering::Acquire) {
            0 => limits.idle_timeout.map(|t| {
                (
                    self.at(self.idle_since.load(Ordering::Acquire)) + t,
                    Expired::Idle,
                )
            }),
            since => limits
                .header_read_timeout
                .map(|t| (self.at(since - 1) + t, Expired::Head)),
        }
    }
}

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No complete request head in time.
    Head,
    /// Idle for too long.
    Idle,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Expired::Head => "no complete request head within header_read_timeout",
            Expired::Idle => "idle for idle_timeout",
        })
    }
}

/// Ends a request's flight when dropped: with its response body, or with its future.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

// === Timeouts ===

pin_project! {
    /// A connection, closed (dropped) when it misses a deadline of its [`Activity`].
    struct Timeouts<C> {
        #[pin]
        conn: C,
        #[pin]
        sleep: Sleep,
        activity: Arc<Activity>,
        limits: Limits,
    }
}

impl<C> Timeouts<C> {
    fn new(conn: C, activity: Arc<Activity>, limits: Limits) -> Self {
        let first = next_wake(activity.deadline(&limits).map(|(at, _)| at), &limits);
        Timeouts {
            conn,
            sleep: tokio::time::sleep_until(first),
            activity,
            limits,
        }
    }
}

/// When to look again: at `deadline`, but never later than the shortest timeout from now,
/// since what the connection does meanwhile may bring its deadline forward (a keep-alive
/// connection that finishes a request has its idle deadline before its head deadline).
fn next_wake(deadline: Option<Instant>, limits: &Limits) -> Instant {
    let shortest = [limits.idle_timeout, limits.header_read_timeout]
        .into_iter()
        .flatten()
        .min();
    let cap = match shortest {
        Some(t) => Instant::now() + t,
        None => Instant::now() + Duration::from_secs(86_400 * 365),
    };
    deadline.map_or(cap, |at| at.min(cap))
}

impl<C: Future> Future for Timeouts<C> {
    type Output = Result<C::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(out) = this.conn.poll(cx) {
            return Poll::Ready(Ok(out));
        }
        while this.sleep.as_mut().poll(cx).is_ready() {
            let deadline = this.activity.deadline(this.limits);
            if let Some((at, expired)) = deadline {
                if at <= Instant::now() {
                    return Poll::Ready(Err(expired));
                }
            }
            let next = next_wake(deadline.map(|(at, _)| at), this.limits);
            this.sleep.as_mut().reset(next);
        }
        Poll::Pending
    }
}

// === Watched I/O ===

pin_project! {
    /// A connection's socket, telling its [`Activity`] when bytes arrive.
    struct Watched {
        #[pin]
        io: TcpStream,
        activity: Arc<Activity>,
    }
}

impl AsyncRead for Watched {
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

impl AsyncWrite for Watched {
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
        TrackedFuture {
            inner: self.inner.call(req),
            flight: Some(InFlight(self.activity.clone())),
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
        let flight = this.flight.take();
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
        self.project().inner.poll_frame(cx)
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
