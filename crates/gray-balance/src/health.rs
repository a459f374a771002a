//! Passive health: endpoints whose calls fail with connection errors are ejected.
//!
//! Every response of an endpoint is observed. When [`Ejection::consecutive`] calls in a
//! row fail with a *connection error*, the endpoint is ejected: it leaves every subset
//! and counts as absent for the fallback, so a gray request whose only gray instance is
//! down falls back as if that instance were gone. It comes back after a backoff that
//! doubles with each ejection in a row ([`Ejection::base`] up to [`Ejection::max`]); one
//! successful call resets both the error count and the backoff. Any other outcome (a
//! response, or an error that is not a connection error, such as a timeout of a request
//! already sent) also resets the error count: the endpoint was reachable.
//!
//! Ejection takes effect the next time the balancer looks at the endpoint (when it is
//! picked, or polled ready again), so it costs nothing on the request path.
//!
//! What a connection error is, is decided by a [`Classifier`], a plain function over the
//! endpoint's error; the default, [`is_connection_error`], walks the error's `source()`
//! chain for an [`std::io::Error`] of a connection kind (refused, reset, aborted, not
//! connected, address not available) and, with the `hyper-util` feature, for a
//! hyper-util legacy client error whose `is_connect()` is true. The endpoints of
//! `gray_discovery::http` keep the connector's `io::Error` as the source of their errors,
//! so a refused or reset instance is recognised without a feature.
//!
//! ```
//! use std::{io, time::Duration};
//! use gray_balance::health::{Ejection, is_connection_error};
//!
//! let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
//! assert!(is_connection_error(&refused));
//! assert!(!is_connection_error(&io::Error::from(io::ErrorKind::InvalidData)));
//!
//! let ejection = Ejection::default();
//! assert_eq!(ejection.backoff(0), ejection.base);
//! assert_eq!(ejection.backoff(1), ejection.base * 2);
//! assert_eq!(ejection.backoff(40), ejection.max);
//! # let _ = Duration::ZERO;
//! ```

use std::{
    error::Error,
    io,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

/// Decides whether an endpoint's error is a connection error.
pub type Classifier = fn(&(dyn Error + 'static)) -> bool;

/// The default [`Classifier`]; see the [module docs](self).
pub fn is_connection_error(error: &(dyn Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        #[cfg(feature = "hyper-util")]
        if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            if client.is_connect() {
                return true;
            }
        }
        current = e.source();
    }
    false
}

/// When and for how long endpoints are ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Connection errors in a row that eject an endpoint; `0` turns ejection off.
    pub consecutive: u32,
    /// The first ejection's length.
    pub base: Duration,
    /// The longest ejection.
    pub max: Duration,
}

impl Default for Ejection {
    /// Five connection errors in a row; one second, doubling up to a minute.
    fn default() -> Self {
        Ejection {
            consecutive: 5,
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Ejection {
    /// No ejection at all.
    pub fn disabled() -> Self {
        Ejection {
            consecutive: 0,
            ..Ejection::default()
        }
    }

    /// The length of an ejection after `streak` earlier ejections in a row.
    pub fn backoff(&self, streak: u32) -> Duration {
        let factor = 1u32.checked_shl(streak.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

/// Shared between the balancer and the response futures of one endpoint.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Connection errors in a row.
    failures: AtomicU32,
    /// Ejections in a row.
    streak: AtomicU32,
}

impl Health {
    pub(crate) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.streak.load(Ordering::Relaxed) != 0 {
            self.streak.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn reachable(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn connection_failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn should_eject(&self, ejection: &Ejection) -> bool {
        ejection.consecutive > 0 && self.failures.load(Ordering::Relaxed) >= ejection.consecutive
    }

    /// Records an ejection and returns its length.
    pub(crate) fn eject(&self, ejection: &Ejection) -> Duration {
        self.failures.store(0, Ordering::Relaxed);
        let streak = self.streak.fetch_add(1, Ordering::Relaxed);
        ejection.backoff(streak)
    }
}
