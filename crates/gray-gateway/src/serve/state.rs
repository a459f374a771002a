//! A client connection's state ([`ConnState`]): every change of it is a method here, called
//! from where it happens — its reads and writes ([`ObservedIo`](super::observed::ObservedIo)),
//! its requests and their responses ([`Counted`](super::counted::Counted), through a
//! request's [`Exchange`]), its bursts (`super::conn`) and its [`watchdog`](super::watchdog)
//! — and the two questions asked of it are answered here: whether an HTTP/1.1 connection
//! may be parked now ([`ConnState::parkable`]), and what the watchdog compares between
//! its ticks ([`ConnState::idle_since_tick`], [`ConnState::sending`]).
//!
//! Kept with a few relaxed atomic operations per request and no clock read: the watchdog
//! compares what it sees from one tick to the next. Only the connection's task writes the
//! I/O flags, the park request's flag aside (the watchdog's).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
    },
    task::Waker,
};

use futures_util::task::AtomicWaker;

use crate::{config::Limits, limits::Cancels};

/// What a connection is doing, shared by its reads, its requests and its watchdog; see the
/// [module docs](self).
#[derive(Debug)]
pub(super) struct ConnState {
    /// Requests whose response (body included) is not finished.
    in_flight: AtomicUsize,
    /// Requests finished so far.
    finished: AtomicU64,
    /// Bytes arrived while no request was in flight: a request head is being read. A new
    /// connection starts reading its head at once.
    head: AtomicBool,
    /// The connection speaks HTTP/2: bytes between requests are frames of the connection
    /// (PINGs, WINDOW_UPDATEs, SETTINGS), not a request head, and an idle connection is
    /// judged by the idle timeout alone, whatever control frames its client sends.
    http2: AtomicBool,
    /// Response bodies being sent, and their frames sent so far: what `send_timeout`
    /// watches.
    bodies: AtomicUsize,
    sent: AtomicU64,
    /// The watchdog closed the connection for `send_timeout`: the bodies then dropped
    /// unfinished say so, with their service and instance.
    send_expired: AtomicBool,
    /// HTTP/2 streams cancelled before their response (`limits::cancel`).
    cancels: Arc<Cancels>,
    /// Whether the last request came with no body (its connection then reads nothing
    /// more of it once its response is sent).
    bodyless: AtomicBool,
    /// The last read of the connection's I/O found nothing to read.
    read_pending: AtomicBool,
    /// Bytes were written to the connection's I/O and not flushed since.
    unflushed: AtomicBool,
    /// The watchdog saw the connection idle for a tick: park it when it can be.
    park: AtomicBool,
    /// Wakes the connection's task for that.
    waker: AtomicWaker,
    /// The tunnel of an upgrade the instance accepted, for the connection to run once
    /// hyper has written the `101` ([`crate::upgrade`]).
    tunnel: std::sync::Mutex<Option<Box<crate::upgrade::Tunnel>>>,
    /// The connection is a tunnel now: the watchdog has nothing more to watch.
    upgraded: AtomicBool,
    /// Times the connection was parked (written by its task only; what tests check).
    #[cfg(test)]
    parks: AtomicU64,
}

/// Why an HTTP/1.1 connection may not be parked now; see [`ConnState::parkable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Busy {
    /// Its last read did not find the socket empty: hyper may have bytes to parse, or be
    /// about to read them.
    Reading,
    /// Bytes written are not flushed: hyper still owes the client part of a response.
    Unflushed,
    /// A request's response (its body included) is not finished.
    InFlight,
    /// Bytes of a request head have arrived.
    Head,
    /// The last request had a body, which hyper may still be reading or discarding.
    Body,
    /// Nothing to do, but neither did the watchdog ask for a park nor is the server
    /// crowded: it stays as it is, buffers and all, for a quick next request.
    NotAsked,
}

// === impl ConnState ===

impl ConnState {
    pub(super) fn new(limits: &Limits) -> Self {
        ConnState {
            in_flight: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
            head: AtomicBool::new(true),
            http2: AtomicBool::new(false),
            bodies: AtomicUsize::new(0),
            sent: AtomicU64::new(0),
            send_expired: AtomicBool::new(false),
            cancels: Arc::new(Cancels::new(limits.max_cancelled_streams_percent)),
            bodyless: AtomicBool::new(false),
            read_pending: AtomicBool::new(false),
            unflushed: AtomicBool::new(false),
            park: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            tunnel: std::sync::Mutex::new(None),
            upgraded: AtomicBool::new(false),
            #[cfg(test)]
            parks: AtomicU64::new(0),
        }
    }

    /// The instance accepted the connection's upgrade: its tunnel waits for the `101` to
    /// be written.
    pub(super) fn hand_over(&self, tunnel: crate::upgrade::Tunnel) {
        *self.tunnel.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(tunnel));
    }

    /// The tunnel handed over, if any; the connection is a tunnel from now on.
    pub(super) fn take_tunnel(&self) -> Option<Box<crate::upgrade::Tunnel>> {
        let tunnel = self.tunnel.lock().unwrap_or_else(|p| p.into_inner()).take();
        if tunnel.is_some() {
            self.upgraded.store(true, Relaxed);
        }
        tunnel
    }

    /// Whether the connection became a tunnel (its own limits apply, not the watchdog's).
    pub(super) fn is_upgraded(&self) -> bool {
        self.upgraded.load(Relaxed)
    }

    /// The watchdog closes the connection for `send_timeout` (its response bodies are
    /// dropped unfinished next).
    pub(super) fn expire_send(&self) {
        self.send_expired.store(true, Relaxed);
    }

    /// The connection's count of cancelled HTTP/2 streams, which its drain member watches.
    pub(super) fn cancels(&self) -> &Arc<Cancels> {
        &self.cancels
    }

    /// Whether an HTTP/1.1 connection may be parked now (`super::conn`): `Ok` when it has
    /// nothing left to do until its client sends again, and the watchdog saw it idle for a
    /// tick or the server is `crowded`; else why not.
    ///
    /// Each condition, and why it is needed. Parking ends the burst: `conn` calls hyper's
    /// `server::conn::http1::Connection::graceful_shutdown`, then `without_shutdown`, and
    /// takes the socket and the bytes hyper read ahead (`Parts::io`, `Parts::read_buf`)
    /// back. That is lossless only when hyper is between requests:
    ///
    /// - the last read found the socket empty ([`Busy::Reading`]): hyper reads until its
    ///   read returns `Pending` before it waits, so bytes read are either parsed or in its
    ///   read buffer, which `without_shutdown` hands back;
    /// - everything written is flushed ([`Busy::Unflushed`]): hyper flushes a response
    ///   before it polls for the next request, and `graceful_shutdown` on an idle
    ///   connection closes it without writing anything more;
    /// - no request is in flight, its response body included ([`Busy::InFlight`]), and no
    ///   request head has begun ([`Busy::Head`]): `graceful_shutdown` would otherwise let
    ///   that request finish first, or drop a head half read;
    /// - the last request had no body ([`Busy::Body`]): hyper may still be reading, or
    ///   discarding, a body the service did not read, and those bytes are not in
    ///   `read_buf`.
    ///
    /// `super::contract` checks each behaviour of hyper relied on against hyper itself,
    /// so a hyper that changes one fails there, not in production (the workspace asks for
    /// the hyper those tests passed with, at least).
    pub(super) fn parkable(&self, crowded: impl FnOnce() -> bool) -> Result<(), Busy> {
        if !self.read_pending.load(Relaxed) {
            return Err(Busy::Reading);
        }
        if self.unflushed.load(Relaxed) {
            return Err(Busy::Unflushed);
        }
        if self.in_flight.load(Relaxed) != 0 {
            return Err(Busy::InFlight);
        }
        if self.head.load(Relaxed) {
            return Err(Busy::Head);
        }
        if !self.bodyless.load(Relaxed) {
            return Err(Busy::Body);
        }
        if self.park.load(Relaxed) || crowded() {
            Ok(())
        } else {
            Err(Busy::NotAsked)
        }
    }

    // --- the connection's I/O (`super::observed`) ---

    /// A read found nothing to read (`true`), or returned (`false`).
    pub(super) fn read_pending(&self, pending: bool) {
        set(&self.read_pending, pending);
    }

    /// The connection turned out to speak HTTP/2 (its preface was read): from now on no
    /// request head is ever pending between requests (see `http2`).
    pub(super) fn serving_http2(&self) {
        self.http2.store(true, Relaxed);
        self.head.store(false, Relaxed);
    }

    /// Bytes arrived: with no request in flight, they start a request head (HTTP/1.1).
    pub(super) fn bytes_read(&self) {
        if self.in_flight.load(Relaxed) == 0
            && !self.head.load(Relaxed)
            && !self.http2.load(Relaxed)
        {
            self.head.store(true, Relaxed);
        }
    }

    /// Bytes were written (`true`), or everything written was flushed (`false`).
    pub(super) fn unflushed(&self, unflushed: bool) {
        set(&self.unflushed, unflushed);
    }

    // --- its requests (`super::counted`) ---

    /// A request head was read: the request is in flight, `bodyless` if it has no body,
    /// and counted among the connection's streams when it is an HTTP/2 one (its return:
    /// whether that decided a GOAWAY, which the caller logs). Ends when its [`Exchange`] is
    /// dropped.
    pub(super) fn begin(self: &Arc<Self>, bodyless: bool, http2: bool) -> (Exchange, bool) {
        self.bodyless.store(bodyless, Relaxed);
        self.in_flight.fetch_add(1, Relaxed);
        self.head.store(false, Relaxed);
        let goaway = http2 && self.cancels.begin();
        let flight = Exchange {
            state: self.clone(),
            progress: Progress::Awaiting { counted: http2 },
        };
        (flight, goaway)
    }

    // --- its bursts (`super::conn`) ---

    /// Registers the task that runs the connection's bursts, to be woken when the
    /// watchdog asks for a park. A task's waker stays valid for its life, so once per
    /// burst is enough.
    pub(super) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }

    /// A new burst starts: nothing is known of its I/O yet.
    pub(super) fn unpark(&self) {
        self.park.store(false, Relaxed);
        self.read_pending.store(false, Relaxed);
        self.unflushed.store(false, Relaxed);
        self.bodyless.store(false, Relaxed);
    }

    /// The connection is parked (with nothing read ahead).
    #[cfg(test)]
    pub(super) fn parked(&self) {
        self.parks.store(self.parks.load(Relaxed) + 1, Relaxed);
    }

    /// Times the connection was parked.
    #[cfg(test)]
    pub(super) fn parks(&self) -> u64 {
        self.parks.load(Relaxed)
    }

    // --- its watchdog (`super::watchdog`) ---

    /// The watchdog saw the connection idle for a tick.
    pub(super) fn request_park(&self) {
        self.park.store(true, Relaxed);
        self.waker.wake();
    }

    /// Whether the watchdog asked for a park since the burst started.
    #[cfg(test)]
    pub(super) fn park_requested(&self) -> bool {
        self.park.load(Relaxed)
    }

    /// What `send_timeout` compares between ticks: `None` while no response body is sent.
    pub(super) fn sending(&self) -> Option<u64> {
        (self.bodies.load(Relaxed) > 0).then(|| self.sent.load(Relaxed))
    }

    /// What the idle and head timeouts compare between ticks: `None` while a request is
    /// in flight, else the requests finished so far and whether a head has begun.
    pub(super) fn idle_since_tick(&self) -> Option<(u64, bool)> {
        (self.in_flight.load(Relaxed) == 0)
            .then(|| (self.finished.load(Relaxed), self.head.load(Relaxed)))
    }
}

/// Stores `on` in `flag` unless it holds it already. Only the connection's task writes
/// the I/O flags, so a load and a store do (no read-modify-write).
fn set(flag: &AtomicBool, on: bool) {
    if flag.load(Relaxed) != on {
        flag.store(on, Relaxed);
    }
}

// === Exchange ===

/// One request in flight on its connection: from its head to the end of its response
/// body, or to its cancellation. Its transitions are the state's: dropped, it ends the
/// request's flight.
#[derive(Debug)]
pub(super) struct Exchange {
    state: Arc<ConnState>,
    progress: Progress,
}

/// Where a request's flight is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Waiting for its response; `counted` when it is an HTTP/2 stream, counted toward
    /// the GOAWAY of a client that cancels most of its streams.
    Awaiting { counted: bool },
    /// Its response began: its body is being sent.
    Streaming,
}

// === impl Exchange ===

impl Exchange {
    /// The response head is out: its body is sent from now on.
    pub(super) fn response_began(&mut self) {
        if self.progress != Progress::Streaming {
            self.state.bodies.fetch_add(1, Relaxed);
            self.progress = Progress::Streaming;
        }
    }

    /// A frame of the response body was sent.
    pub(super) fn frame_sent(&self) {
        self.state.sent.fetch_add(1, Relaxed);
    }

    /// Whether the connection was closed for `send_timeout`.
    pub(super) fn send_expired(&self) -> bool {
        self.state.send_expired.load(Relaxed)
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        match self.progress {
            Progress::Streaming => {
                self.state.bodies.fetch_sub(1, Relaxed);
            }
            // The response future was dropped before its response.
            Progress::Awaiting { counted: true } => self.state.cancels.cancelled(),
            Progress::Awaiting { counted: false } => {}
        }
        self.state.finished.fetch_add(1, Relaxed);
        self.state.in_flight.fetch_sub(1, Relaxed);
    }
}
