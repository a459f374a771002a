//! The connection settings every endpoint of an [`HttpEndpoints`](super::HttpEndpoints)
//! shares.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::Protocol;

/// How the connections of every instance are kept.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Idle connections kept per instance; more are closed when released.
    pub(crate) max_idle: usize,
    /// Idle connections kept over every instance of these endpoints.
    pub(crate) idle_total: Arc<IdleBudget>,
    /// An idle connection older than this is closed instead of reused.
    pub(crate) idle_timeout: Duration,
    /// The HTTP/1 options of new connections.
    pub(crate) http1: http1::Builder,
    /// The HTTP/2 options of new connections.
    pub(crate) http2: http2::Builder<TokioExecutor>,
    /// Which HTTP version is spoken.
    pub(crate) protocol: Protocol,
    /// The time a request may take until its response head, connecting included.
    pub(crate) response_timeout: Option<Duration>,
    /// Connects running at once per instance ([`super::connecting`]).
    pub(crate) max_connects: usize,
    /// TLS as given, and ready for the protocol.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<(super::Tls, super::tls::Prepared)>,
}

// === impl Settings ===

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_idle: 256,
            idle_total: Arc::new(IdleBudget::new(usize::MAX)),
            idle_timeout: Duration::from_secs(4),
            http1: http1::Builder::new(),
            http2: {
                let mut http2 = http2::Builder::new(TokioExecutor::new());
                // HTTP/2 keep-alive pings (off unless set) need a timer.
                http2.timer(TokioTimer::new());
                http2
            },
            protocol: Protocol::Http1,
            response_timeout: None,
            max_connects: 8,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

/// The idle HTTP/1 connections of every instance of one `HttpEndpoints` together: each is
/// a socket, which a process's descriptor limit counts.
#[derive(Debug)]
pub(crate) struct IdleBudget {
    max: usize,
    idle: AtomicUsize,
}

impl IdleBudget {
    pub(crate) fn new(max: usize) -> Self {
        IdleBudget {
            max,
            idle: AtomicUsize::new(0),
        }
    }

    /// Counts one more idle connection, if that keeps within the budget.
    pub(crate) fn take_one(&self) -> bool {
        self.idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    /// `n` idle connections left the pools (taken, expired or closed).
    pub(crate) fn give_back(&self, n: usize) {
        if n > 0 {
            self.idle.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// The idle connections now.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.idle.load(Ordering::Acquire)
    }
}
