//! What failed when sending a request to an instance.

use std::{error::Error as StdError, fmt, sync::Arc, time::Duration};

use http::Uri;
use tower::BoxError;

/// What failed when sending a request to an instance: the stage (connecting, the TLS
/// handshake, sending, waiting for the response head), the instance's URI, and the cause
/// as its [`source`](StdError::source) (an `io::Error` for a refused connection, the
/// `io::Error` holding a `rustls::Error` for a certificate the instance's peer refused,
/// a `hyper::Error` for a connection that broke).
#[derive(Debug, Clone)]
pub struct RequestError {
    stage: Stage,
    instance: Uri,
    // Shared: the requests that waited for one HTTP/2 connection all get its error.
    source: Arc<dyn StdError + Send + Sync>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Connect,
    Tls,
    Handshake,
    Send,
    Timeout(Duration),
}

// === impl RequestError ===

impl RequestError {
    pub(crate) fn new(stage: Stage, instance: Uri, source: impl Into<BoxError>) -> Self {
        RequestError {
            stage,
            instance,
            source: Arc::from(source.into()),
        }
    }

    /// Whether the connection could not be established, the TLS handshake included (the
    /// request was not sent).
    pub fn is_connect(&self) -> bool {
        matches!(self.stage, Stage::Connect | Stage::Tls | Stage::Handshake)
    }

    /// Whether the TLS handshake with the instance failed (an untrusted or expired
    /// certificate, a name it is not valid for, a client certificate the instance refused,
    /// no common protocol version or ALPN protocol).
    pub fn is_tls(&self) -> bool {
        self.stage == Stage::Tls
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
            Stage::Tls => "TLS handshake failed with",
            Stage::Handshake => "HTTP handshake failed with",
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
