//! Passive health: endpoints whose calls fail with connection errors are ejected.
//!
//! Every completion of an endpoint is observed, in atomics of its own. When
//! [`Ejection::consecutive`] requests in a row fail with a *connection error*, the
//! response future that saw the last one asks the balancer's background task to eject the
//! endpoint: it leaves every subset and counts as absent for the fallback, so a gray
//! request whose only gray instance is down falls back as if that instance were gone. It
//! comes back after [`Ejection::backoff`]'s delay for the number of ejections in a row
//! (`gray_core::backoff::Backoff`: doubling, with jitter); one successful request resets
//! both the error count and the streak. Any other outcome (a response, or an error that is
//! not a connection error, such as a timeout of a request already sent) also resets the
//! error count: the endpoint was reachable. A readmitted endpoint is probed again like a
//! new one (see the crate docs, "New endpoints").
//!
//! An endpoint whose `poll_ready` fails is *unready*: it leaves the ready lists at once but
//! still counts as present (the policy's `OnUnready` decides whether its subset then fails
//! fast or falls back), and it comes back after the same backoff.
//!
//! Ejection and readmission are applied by the background task, never on the request path,
//! so the counts the policy walks stay exact and the request path takes no lock. Until the
//! task has ejected an endpoint that reached the threshold (microseconds, on a runtime
//! that is not starved), picks avoid it: p2c takes the other candidate and probes skip it;
//! only a subset with that one endpoint still sends to it.
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
//! use gray_core::backoff::Backoff;
//!
//! let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
//! assert!(is_connection_error(&refused));
//! assert!(!is_connection_error(&io::Error::from(io::ErrorKind::InvalidData)));
//!
//! let ejection = Ejection::new()
//!     .with_backoff(Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).without_jitter())
//!     .with_consecutive(3);
//! assert_eq!(ejection.consecutive(), 3);
//! assert_eq!(ejection.backoff().delay(1), Duration::from_secs(1));
//! assert_eq!(ejection.backoff().delay(2), Duration::from_secs(2));
//! assert_eq!(Ejection::disabled().consecutive(), 0);
//! ```

use std::{error::Error, io, time::Duration};

use gray_core::backoff::Backoff;

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

/// When and for how long endpoints are ejected; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Ejection {
    consecutive: u32,
    backoff: Backoff,
}

impl Default for Ejection {
    /// Five connection errors in a row; one second, doubling up to a minute, with jitter.
    fn default() -> Self {
        Ejection {
            consecutive: 5,
            backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        }
    }
}

impl Ejection {
    /// The default: see [`Ejection::default`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// No ejection at all.
    #[must_use]
    pub fn disabled() -> Self {
        Ejection::new().with_consecutive(0)
    }

    /// Connection errors in a row that eject an endpoint; `0` turns ejection off.
    #[must_use]
    pub fn with_consecutive(mut self, consecutive: u32) -> Self {
        self.consecutive = consecutive;
        self
    }

    /// How long an endpoint stays out: `backoff.delay(n)` for the `n`th ejection in a row
    /// (also how long an unready endpoint stays out).
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Connection errors in a row that eject an endpoint (`0`: never).
    #[must_use]
    pub fn consecutive(&self) -> u32 {
        self.consecutive
    }

    /// The backoff of ejections in a row.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }
}
