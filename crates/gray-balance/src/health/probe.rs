//! [`Probe`]: how an ejected endpoint is checked, by the balancer's driver, before it
//! takes requests again.

use std::{fmt, future::Future, pin::Pin, time::Duration};

use gray_core::Origin;
use http::uri::{Authority, Scheme};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tower::BoxError;

/// The default time a probe may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The most bytes of an HTTP answer read to find its status line.
const STATUS_LINE_MAX: usize = 1024;

/// What a probe checks; see [`Probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Check {
    /// No probe: the endpoint comes back when its backoff is over, and the next request
    /// that fits it finds out whether it works (the behaviour before probes).
    None,
    /// A TCP connection to the instance's address is opened and closed.
    Connect,
    /// `GET` of this path (and query) over plain HTTP/1.1 must answer 2xx. An `https`
    /// instance gets the connect check instead (the probe speaks no TLS).
    Http {
        /// The path, starting with `/`.
        path: String,
    },
    /// `grpc.health.v1.Health/Check` over plain HTTP/2 must answer `SERVING` (feature
    /// `grpc-health`). An `https` instance gets the connect check instead.
    #[cfg(feature = "grpc-health")]
    Grpc {
        /// The service asked about (`""`: the server as a whole).
        service: String,
    },
}

/// How an ejected (or unready) endpoint is checked before it takes requests again; see
/// the [module docs](super), "Re-admission".
///
/// When an endpoint's backoff is over, the balancer's driver runs the probe (no request
/// of a user is spent on it): when it passes, the endpoint is readmitted; when it fails,
/// the endpoint stays out for the next, longer backoff, and is probed again then. Only
/// endpoints that know their address ([`Labelled::origin`](gray_core::Labelled::origin):
/// gray-discovery's instances and endpoints do) are probed; others come back when their
/// backoff is over, as with [`Check::None`].
///
/// ```
/// use std::time::Duration;
/// use gray_balance::health::{Check, Probe};
///
/// assert_eq!(Probe::default().check(), &Check::Connect);
/// let http = Probe::http("/healthz").with_timeout(Duration::from_millis(500));
/// assert_eq!(http.check(), &Check::Http { path: "/healthz".into() });
/// assert_eq!(http.timeout(), Duration::from_millis(500));
/// assert_eq!(Probe::disabled().check(), &Check::None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    check: Check,
    timeout: Duration,
}

impl Default for Probe {
    /// The connect check, within 1 s.
    fn default() -> Self {
        Probe::connect()
    }
}

impl Probe {
    /// A TCP connect check, within 1 s (the default).
    #[must_use]
    pub fn connect() -> Self {
        Probe {
            check: Check::Connect,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// `GET path` must answer 2xx, within 1 s. A path that does not start with `/` gets
    /// one.
    #[must_use]
    pub fn http(path: impl Into<String>) -> Self {
        let mut path = path.into();
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        Probe {
            check: Check::Http { path },
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// `grpc.health.v1.Health/Check` for `service` (`""`: the whole server) must answer
    /// `SERVING`, within 1 s.
    #[cfg(feature = "grpc-health")]
    #[must_use]
    pub fn grpc(service: impl Into<String>) -> Self {
        Probe {
            check: Check::Grpc {
                service: service.into(),
            },
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// No probe: an endpoint comes back when its backoff is over.
    #[must_use]
    pub fn disabled() -> Self {
        Probe {
            check: Check::None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The time a probe may take before it counts as failed.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What is checked.
    #[must_use]
    pub fn check(&self) -> &Check {
        &self.check
    }

    /// The time a probe may take.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The probe of the instance at `origin`, as a future the driver polls; `None` when
    /// there is no probe.
    pub(crate) fn start(&self, origin: &dyn Origin) -> Option<ProbeFuture> {
        let target = Target {
            scheme: origin.scheme().clone(),
            authority: origin.authority().clone(),
        };
        let timeout = self.timeout;
        let check = match &self.check {
            Check::None => return None,
            check => check.clone(),
        };
        Some(Box::pin(async move {
            match tokio::time::timeout(timeout, target.run(check)).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer within {timeout:?}").into()),
            }
        }))
    }
}

/// A running probe.
pub(crate) type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// Where a probe goes.
struct Target {
    scheme: Scheme,
    authority: Authority,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl Target {
    async fn connect(&self) -> Result<TcpStream, BoxError> {
        let host = self.authority.host();
        // An IPv6 literal comes in brackets.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = self
            .authority
            .port_u16()
            .unwrap_or(if self.scheme == Scheme::HTTPS {
                443
            } else {
                80
            });
        let stream = TcpStream::connect((host, port)).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }

    async fn run(self, check: Check) -> Result<(), BoxError> {
        let stream = self.connect().await?;
        if self.scheme == Scheme::HTTPS {
            return Ok(());
        }
        match check {
            Check::None | Check::Connect => Ok(()),
            Check::Http { path } => self.http(stream, &path).await,
            #[cfg(feature = "grpc-health")]
            Check::Grpc { service } => super::grpc::check(stream, &self.authority, &service).await,
        }
    }

    /// `GET path`, expecting a 2xx status line.
    async fn http(&self, mut stream: TcpStream, path: &str) -> Result<(), BoxError> {
        let request = format!(
            "GET {path} HTTP/1.1\r\nhost: {}\r\nuser-agent: gray-balance-probe\r\nconnection: close\r\n\r\n",
            self.authority
        );
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::with_capacity(128);
        let mut buf = [0; 256];
        let line = loop {
            if let Some(end) = head.windows(2).position(|w| w == b"\r\n") {
                break &head[..end];
            }
            if head.len() >= STATUS_LINE_MAX {
                return Err("no HTTP status line in the answer".into());
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err("the connection closed before a status line".into());
            }
            head.extend_from_slice(&buf[..n]);
        };
        let status = status(line).ok_or_else(|| {
            format!(
                "not an HTTP status line: {:?}",
                String::from_utf8_lossy(line)
            )
        })?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(format!("GET {path} answered {status}").into())
        }
    }
}

/// The status of an HTTP/1.x status line (`HTTP/1.1 204 No Content`).
fn status(line: &[u8]) -> Option<u16> {
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status(b"HTTP/1.1 204 No Content"), Some(204));
        assert_eq!(status(b"HTTP/1.0 503"), Some(503));
        assert_eq!(status(b"HTTP/2 200"), None);
        assert_eq!(status(b"HTTP/1.1 2x0 OK"), None);
        assert_eq!(status(b"SSH-2.0-OpenSSH"), None);
        assert_eq!(
            Probe::http("healthz").check(),
            &Check::Http {
                path: "/healthz".into()
            }
        );
    }
}
