//! The connection settings every endpoint of an [`HttpEndpoints`](super::HttpEndpoints)
//! shares.

use std::time::Duration;

use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::Protocol;

/// How the connections of every instance are kept.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Idle connections kept per instance; more are closed when released.
    pub(crate) max_idle: usize,
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
