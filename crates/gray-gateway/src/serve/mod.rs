//! The accept loop: limits on clients' connections, and graceful shutdown.
//!
//! Each accepted TCP connection goes through its listener's [`Handshake`] (none for
//! plaintext, TLS for the `[tls]` listener, in `crate::tls`), then is served over the
//! connection's tower service as HTTP/2 (with prior knowledge, or by ALPN over TLS), or
//! as HTTP/1.1 in bursts, holding no buffer while it is idle ([`conn`]), and watched by
//! the [`Drain`](crate::drain::Drain): on shutdown, in-flight requests complete and idle
//! connections close. Both listeners share one [`Server`]: its HTTP settings and its count
//! of connections.
//!
//! Measured against hyper-util's `GracefulShutdown` and `TowerToHyperService`, before
//! connections were served in bursts (hyper-util's `auto` connection then)
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
//! - **idle buffers**: an idle HTTP/1.1 connection is parked (its hyper connection and
//!   buffers dropped, [`conn`]) a tick after its last response, or at once while more
//!   than `release_buffers_above` connections are open.
//!
//! The timeouts are enforced by a watchdog task per connection, which looks at the
//! connection every quarter of the shortest timeout (at most every 2.5 s) and closes it
//! once its head has been pending, or the connection idle, for the timeout: so a
//! connection is closed between its timeout and 1.25 times it. It also asks an idle
//! connection to park. A request costs a few relaxed atomic operations: no clock read, no
//! timer, nothing polled in the connection's task.

mod conn;
#[cfg(test)]
mod contract;
mod counted;
mod observed;
mod state;
#[cfg(test)]
mod tests;
mod watchdog;

use std::{convert::Infallible, future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioExecutor;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
};
use tower::Service;

use crate::config::Limits;

pub(crate) use conn::ClientIo;
pub(crate) use counted::Answered;
use counted::Counted;
use state::ConnState;
use watchdog::{Timeouts, watchdog};

/// Where the proxy hands the tunnel of an accepted upgrade to the client's connection
/// ([`crate::upgrade::Offer`]).
#[derive(Clone)]
pub(crate) struct Handoff(Arc<ConnState>);

impl Handoff {
    /// The instance switched protocols: the connection runs `tunnel` once its `101` is
    /// written.
    pub(crate) fn hand_over(&self, tunnel: crate::upgrade::Tunnel) {
        self.0.hand_over(tunnel);
    }
}

/// How long a shutdown waits for the connections to finish before it drops them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What a connection goes through between its accept and HTTP: nothing ([`Plain`]), or a
/// TLS handshake (`crate::tls::Acceptor`). It runs in the connection's own task, within
/// the connection's limits: it holds one of the `max_connections` slots, and the
/// watchdog's head timeout, which starts at the accept, covers it.
pub(crate) trait Handshake: Send + Sync + 'static {
    /// The connection once it is ready for HTTP.
    type Io: ClientIo;
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
    http1: hyper::server::conn::http1::Builder,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    permits: Arc<Semaphore>,
    limits: Limits,
}

impl Server {
    /// Whether more client connections than `release_buffers_above` are open: idle ones
    /// are then parked at once (`conn`).
    fn crowded(&self) -> bool {
        self.limits.max_connections - self.permits.available_permits()
            > self.limits.release_buffers_above
    }
}

impl Server {
    /// The HTTP settings of every client connection, under `limits`.
    pub(crate) fn new(limits: Limits) -> Arc<Server> {
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            // Messages are written with one copy into one buffer and one `send`, rather than
            // as a vectored write of head and body: cheaper for the small messages that
            // dominate, at the cost of a copy of large bodies.
            .writev(false)
            // The head timeout is this module's (it also starts at a keep-alive connection's
            // first byte, not when the previous response ends, as hyper's does).
            .header_read_timeout(None)
            .max_buf_size(limits.max_header_bytes);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2.max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
        crate::limits::http2(&mut http2, &limits);
        Arc::new(Server {
            http1,
            http2,
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
        + Unpin
        + 'static,
    S::Future: Send + 'static,
    B: Body + Answered + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = crate::drain::Drain::new();
    let limits = server.limits;
    let timeouts = Timeouts::from(&limits);
    // The connections' tasks: what a shutdown closes once its grace is over.
    let mut connections = tokio::task::JoinSet::new();
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
        let state = Arc::new(ConnState::new(&limits));
        let service = Counted {
            inner: make(peer),
            state: state.clone(),
            peer,
        };
        let handshaking = handshake.handshake(stream);
        let (server, graceful) = (server.clone(), graceful.clone());
        // Reaps the connections that ended, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
        let task = connections.spawn(async move {
            match handshaking.await {
                Ok(io) => {
                    let member = graceful.join();
                    let service = counted::Adapter { service };
                    if let Err(e) = conn::serve(&server, io, service, member).await {
                        tracing::debug!(error = %e, %peer, "connection closed with an error");
                    }
                }
                Err(e) => tracing::debug!(error = %e, %peer, "handshake failed"),
            }
            drop(permit);
        });
        tokio::spawn(watchdog(state, task, timeouts, peer));
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = connections.len(),
            "connections still open after {SHUTDOWN_GRACE:?}; closing them"
        );
        // Dropping a task closes its connection: its socket is dropped with it.
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}

/// Resolves once the stop flag is set (or its sender is gone).
pub(crate) async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped at once: it must not live across an await.
    let _ = stopped.wait_for(|s| *s).await.map(|_| ());
}
