//! What a client connection is doing ([`Activity`]), as its reads ([`Watched`]), its
//! requests (`super::tracked`) and its [`watchdog`] see it: the timeouts of the
//! [module docs](super), and whether an HTTP/1.1 connection may be parked
//! (`super::conn`).

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker, ready},
    time::Duration,
};

use futures_util::task::AtomicWaker;

use pin_project_lite::pin_project;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    task::AbortHandle,
};

use crate::{config::Limits, limits::Cancels};

// === Activity ===

/// What a connection is doing, shared by its reads, its requests and its watchdog. Kept
/// with a few relaxed atomic operations per request and no clock read: the watchdog
/// compares what it sees from one tick to the next.
#[derive(Debug)]
pub(super) struct Activity {
    /// Requests whose response (body included) is not finished.
    in_flight: AtomicUsize,
    /// Requests finished so far.
    finished: AtomicU64,
    /// Bytes arrived while no request was in flight: a request head is being read. A new
    /// connection starts reading its head at once.
    head: AtomicBool,
    /// Response bodies being sent, and their frames sent so far: what `send_timeout`
    /// watches.
    pub(super) bodies: AtomicUsize,
    pub(super) sent: AtomicU64,
    /// Streams cancelled before their response.
    pub(super) cancels: Arc<Cancels>,
    /// Whether the last request came with no body (its connection then reads nothing
    /// more of it once its response is sent).
    bodyless: AtomicBool,
    /// What the connection's I/O last did: [`READ_PENDING`], [`UNFLUSHED`].
    io: AtomicU8,
    /// The watchdog saw the connection idle for a tick: park it when it can be.
    park: AtomicBool,
    /// Wakes the connection's task for that.
    waker: AtomicWaker,
    /// Times the connection was parked (written by its task only; what tests check).
    #[cfg(test)]
    parks: AtomicU64,
}

/// The last read found nothing to read.
const READ_PENDING: u8 = 1;
/// Bytes were written and not flushed since.
const UNFLUSHED: u8 = 2;

impl Activity {
    pub(super) fn new(limits: &Limits) -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
            head: AtomicBool::new(true),
            bodies: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            cancels: Arc::new(Cancels::new(limits.max_cancelled_streams_percent)),
            bodyless: AtomicBool::new(false),
            io: AtomicU8::new(0),
            park: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            #[cfg(test)]
            parks: AtomicU64::new(0),
        }
    }

    /// Whether an HTTP/1.1 connection should be parked now (`super::conn`): it has
    /// nothing left to do until its client sends again (a request was served and its
    /// response is finished and flushed, the request had no body, no byte arrived since,
    /// and the last read found nothing: hyper is idle between requests), and either the
    /// watchdog saw it idle for a tick or the server is `crowded`.
    pub(super) fn parkable(&self, crowded: impl FnOnce() -> bool) -> bool {
        self.io.load(Ordering::Relaxed) == READ_PENDING
            && self.in_flight.load(Ordering::Relaxed) == 0
            && !self.head.load(Ordering::Relaxed)
            && self.bodyless.load(Ordering::Relaxed)
            && (self.park.load(Ordering::Relaxed) || crowded())
    }

    /// Sets or clears `flag` of the I/O state. Only the connection's task writes it, so a
    /// load and a store do (no read-modify-write).
    fn set_io(&self, flag: u8, on: bool) {
        let now = self.io.load(Ordering::Relaxed);
        let new = if on { now | flag } else { now & !flag };
        if new != now {
            self.io.store(new, Ordering::Relaxed);
        }
    }

    /// The connection is parked (with nothing read ahead).
    #[cfg(test)]
    pub(super) fn parked(&self) {
        self.parks
            .store(self.parks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Times the connection was parked.
    #[cfg(test)]
    pub(super) fn parks(&self) -> u64 {
        self.parks.load(Ordering::Relaxed)
    }

    /// Registers the task that runs the connection's bursts, to be woken when the
    /// watchdog asks for a park. A task's waker stays valid for its life, so once per
    /// burst is enough.
    pub(super) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// The watchdog saw the connection idle for a tick.
    fn request_park(&self) {
        self.park.store(true, Ordering::Relaxed);
        self.waker.wake();
    }

    /// Whether the watchdog asked for a park since the burst started.
    #[cfg(test)]
    pub(super) fn park_requested(&self) -> bool {
        self.park.load(Ordering::Relaxed)
    }

    /// A new burst starts: nothing is known of its I/O yet.
    pub(super) fn unpark(&self) {
        self.park.store(false, Ordering::Relaxed);
        self.io.store(0, Ordering::Relaxed);
        self.bodyless.store(false, Ordering::Relaxed);
    }

    /// What `send_timeout` compares between ticks: `None` while no response body is sent.
    pub(super) fn sending(&self) -> Option<u64> {
        (self.bodies.load(Ordering::Relaxed) > 0).then(|| self.sent.load(Ordering::Relaxed))
    }

    /// Bytes arrived: with no request in flight, they start a request head.
    fn read(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0 && !self.head.load(Ordering::Relaxed) {
            self.head.store(true, Ordering::Relaxed);
        }
    }

    /// A request head was read: the request is in flight; `bodyless` if it has no body.
    pub(super) fn begin(&self, bodyless: bool) {
        self.bodyless.store(bodyless, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head.store(false, Ordering::Relaxed);
    }

    /// A response (body included) is finished.
    pub(super) fn end(&self) {
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
pub(super) struct InFlight(pub(super) Arc<Activity>, pub(super) bool);

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

/// The timeouts a watchdog enforces (a copy per connection: only what it needs of the
/// [`Limits`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeouts {
    idle_timeout: Option<Duration>,
    header_read_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
}

impl From<&Limits> for Timeouts {
    fn from(limits: &Limits) -> Self {
        Timeouts {
            idle_timeout: limits.idle_timeout,
            header_read_timeout: limits.header_read_timeout,
            send_timeout: limits.send_timeout,
        }
    }
}

/// The longest tick: with no timeout shorter than this, a watchdog still looks at its
/// connection every quarter of it, to park it when idle.
const LONGEST: Duration = Duration::from_secs(10);

/// How often a watchdog looks at its connection: a quarter of the shortest timeout (or of
/// [`LONGEST`]), so a connection is closed between its timeout and 1.25 times it, and an
/// idle HTTP/1.1 connection is parked between one and two ticks after its last response.
fn tick(limits: &Timeouts) -> Duration {
    [
        limits.idle_timeout,
        limits.header_read_timeout,
        limits.send_timeout,
        Some(LONGEST),
    ]
    .into_iter()
    .flatten()
    .min()
    .map_or(LONGEST, |t| t / 4)
    .max(Duration::from_millis(1))
}

/// Watches one connection, on a task of its own (the connection's task pays nothing per
/// poll): every tick it compares the connection's [`Activity`] with the previous tick's and
/// aborts the connection's task (closing the connection) once the same head has been
/// pending, or the connection idle, for the timeout. Ends with the connection.
pub(super) async fn watchdog(
    activity: Arc<Activity>,
    conn: AbortHandle,
    limits: Timeouts,
    peer: SocketAddr,
) {
    let tick = tick(&limits);
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
        if unchanged == tick && matches!(now, Some((_, false))) {
            // Idle for a tick: an HTTP/1.1 connection drops its buffers.
            activity.request_park();
        }
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
    pub(super) struct Watched<I> {
        #[pin]
        io: I,
        activity: Arc<Activity>,
    }
}

impl<I> Watched<I> {
    /// `io`, telling `activity`.
    pub(super) fn new(io: I, activity: Arc<Activity>) -> Self {
        Watched { io, activity }
    }

    /// The connection, unwrapped.
    pub(super) fn into_inner(self) -> I {
        self.io
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
        let Poll::Ready(read) = this.io.poll_read(cx, buf) else {
            this.activity.set_io(READ_PENDING, true);
            return Poll::Pending;
        };
        this.activity.set_io(READ_PENDING, false);
        read?;
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
        let this = self.project();
        this.activity.set_io(UNFLUSHED, true);
        this.io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        ready!(this.io.poll_flush(cx))?;
        this.activity.set_io(UNFLUSHED, false);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.activity.set_io(UNFLUSHED, true);
        this.io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
