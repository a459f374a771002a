//! TLS termination: the `[tls]` listener's handshake, its certificates, and their live
//! reload (feature `tls`).
//!
//! - [`load`]: the files of the table, read and checked (PEM, the certificate's validity
//!   period, the key against the certificate, the client CAs) into a rustls
//!   `ServerConfig` with ALPN `h2` and `http/1.1`; the same checks at start-up, in
//!   `--check` and at every reload.
//! - [`Acceptor`]: the listener's [`Handshake`]: each new connection is handshaken with
//!   the configuration in force when it was accepted (an `arc-swap` load), within
//!   `handshake_timeout`. A connection keeps the configuration it was handshaken with
//!   until it closes, so requests and connections in flight finish on the old
//!   certificate.
//! - `reload`: the certificate, the key and the client CA file are each followed by a
//!   polled [`FileSource`](gray_discovery::source::file::FileSource) (so files written in place are read
//!   once settled, and Kubernetes secret mounts are followed); a version of the files is
//!   checked once none of them has changed for an interval and a settle delay (a renewal
//!   writes the certificate and the key one after the other), then installed, or refused
//!   with an ERROR that names the file and the reason while the previous one stays in
//!   force.
//!
//! rustls on `ring`, the workspace's one crypto provider (`docs/performance.md`, "TLS at the gateway against nginx").

mod load;
mod reload;
mod validity;

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use pin_project_lite::pin_project;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::counter::ConstCounter,
};
use rustls::ServerConfig;
use tokio::{net::TcpStream, time::Sleep};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

pub(crate) use self::load::{Files, Loaded, TlsError, load};
pub(crate) use self::validity::Utc;
use crate::{config::TlsSettings, serve::Handshake};

/// A certificate that expires sooner than this is warned about when it is loaded.
const EXPIRES_SOON: Duration = Duration::from_secs(14 * 86_400);

/// Reads and checks the files of `settings`, and follows them when they are to be
/// reloaded: the listener's acceptor, and the task that follows the files (stopped when
/// dropped).
pub(crate) fn start(
    settings: &TlsSettings,
) -> Result<(Acceptor, Option<gray_discovery::source::WatchHandle>), TlsError> {
    let files = Files::read(settings)?;
    let loaded = load(settings, &files, SystemTime::now())?;
    warn_if_expiring(settings, &loaded);
    let live = Arc::new(Live {
        config: ArcSwap::new(loaded.config.clone()),
        generation: AtomicU64::new(1),
        rejected: AtomicU64::new(0),
        not_after: AtomicI64::new(loaded.validity.not_after),
        handshake_failures: AtomicU64::new(0),
    });
    let watch = settings
        .reload_interval
        .map(|interval| reload::follow(settings.clone(), interval, live.clone(), files));
    let acceptor = Acceptor {
        live,
        timeout: settings.handshake_timeout,
    };
    Ok((acceptor, watch))
}

/// A WARN when the certificate just loaded expires within [`EXPIRES_SOON`].
fn warn_if_expiring(settings: &TlsSettings, loaded: &Loaded) {
    let left = loaded.validity.remaining(SystemTime::now());
    if left < EXPIRES_SOON {
        tracing::warn!(
            cert_file = %settings.cert_file.display(),
            not_after = %Utc(loaded.validity.not_after),
            "the TLS certificate expires in {} hours",
            left.as_secs() / 3600
        );
    }
}

// === impl Live ===

/// The TLS configuration in force, and what happened to it.
#[derive(Debug)]
struct Live {
    config: ArcSwap<ServerConfig>,
    /// Versions of the files installed, the first included.
    generation: AtomicU64,
    /// Versions of the files refused.
    rejected: AtomicU64,
    /// The served certificate's `notAfter`, in seconds since the Unix epoch.
    not_after: AtomicI64,
    handshake_failures: AtomicU64,
}

impl Live {
    /// Serves `loaded` to every handshake from now on.
    fn install(&self, loaded: &Loaded) {
        self.config.store(loaded.config.clone());
        self.not_after
            .store(loaded.validity.not_after, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }
}

// === impl Acceptor ===

/// The TLS listener's handshake; see the [module docs](self).
#[derive(Debug, Clone)]
pub(crate) struct Acceptor {
    live: Arc<Live>,
    timeout: Option<Duration>,
}

impl Acceptor {
    /// What `/metrics` shows of it.
    pub(crate) fn metrics(&self) -> TlsMetrics {
        TlsMetrics(self.live.clone())
    }
}

impl crate::serve::ClientIo for TlsStream<TcpStream> {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A TLS stream is parked only after a read of it found nothing: no record it
        // received is left undecrypted or unread, so only new bytes on the socket matter.
        crate::serve::ClientIo::poll_read_ready(self.get_ref().0, cx)
    }
}

impl Handshake for Acceptor {
    type Io = TlsStream<TcpStream>;
    type Future = Handshaking;

    fn handshake(&self, tcp: TcpStream) -> Handshaking {
        let acceptor = TlsAcceptor::from(self.live.config.load_full());
        Handshaking {
            accept: acceptor.accept(tcp),
            deadline: self.timeout.map(tokio::time::sleep),
            live: self.live.clone(),
        }
    }
}

pin_project! {
    /// A TLS handshake in progress, within its deadline.
    pub(crate) struct Handshaking {
        #[pin]
        accept: tokio_rustls::Accept<TcpStream>,
        #[pin]
        deadline: Option<Sleep>,
        live: Arc<Live>,
    }
}

impl Future for Handshaking {
    type Output = io::Result<TlsStream<TcpStream>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.accept.poll(cx) {
            Poll::Ready(result) => result,
            Poll::Pending => match this.deadline.as_pin_mut().map(|d| d.poll(cx)) {
                Some(Poll::Ready(())) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no TLS handshake within handshake_timeout",
                )),
                _ => return Poll::Pending,
            },
        };
        if result.is_err() {
            this.live.handshake_failures.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(result)
    }
}

// === impl TlsMetrics ===

/// The TLS listener's metrics, read at each scrape.
#[derive(Debug)]
pub(crate) struct TlsMetrics(Arc<Live>);

impl Collector for TlsMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let live = &self.0;
        crate::metrics::gauge(
            &mut encoder,
            "tls_generation",
            "Versions of the TLS certificate files installed since the start (the first included)",
            live.generation.load(Ordering::Relaxed) as i64,
        )?;
        crate::metrics::gauge(
            &mut encoder,
            "tls_rejected",
            "Versions of the TLS certificate files refused since the start (the previous one stayed in force)",
            live.rejected.load(Ordering::Relaxed) as i64,
        )?;
        crate::metrics::gauge(
            &mut encoder,
            "tls_certificate_not_after_seconds",
            "When the served TLS certificate expires, in seconds since the Unix epoch",
            live.not_after.load(Ordering::Relaxed),
        )?;
        let failures = ConstCounter::new(live.handshake_failures.load(Ordering::Relaxed));
        failures.encode(encoder.encode_descriptor(
            "tls_handshake_failures",
            "TLS handshakes that failed or timed out",
            None,
            failures.metric_type(),
        )?)
    }
}
