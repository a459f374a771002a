//! Passive health: endpoints whose calls fail with connection errors are ejected, and
//! come back through a probe.
//!
//! Every completion of an endpoint is observed, in atomics of its own, and its error (if
//! any) is classified as a [`Failure`] by a [`Classifier`] ([`classify`] by default):
//!
//! - **Refused**, and **Unresponsive** (an HTTP/2 keep-alive PING left unanswered: a
//!   black-holed host): nothing listens, or nothing answers. One of them ejects the
//!   endpoint at once: the response future that saw it marks the endpoint (picks avoid
//!   it from that moment) and asks the balancer's background task to eject it, through
//!   the same event as any ejection, so the counts the policy walks stay exact.
//! - **Unsent** and **Broken**: when [`Ejection::consecutive`] requests in a row fail with
//!   a connection error (refused, unsent, broken or unresponsive), the endpoint is
//!   ejected.
//! - Any other outcome (a response, or an error that is not a connection error, such as
//!   a timeout of a request already sent) resets the error count: the endpoint was
//!   reachable. One successful request also resets the ejection streak.
//!
//! An ejected endpoint leaves every subset and counts as absent for the fallback, so a
//! gray request whose only gray instance is down falls back as if that instance were
//! gone. An endpoint whose `poll_ready` fails is *unready*: it leaves the ready lists at
//! once but still counts as present (the policy's `OnUnready` decides whether its subset
//! then fails fast or falls back).
//!
//! # Re-admission
//!
//! An ejected (or unready) endpoint stays out for [`Ejection::backoff`]'s delay for the
//! number of ejections in a row (`gray_core::backoff::Backoff`: doubling, with jitter).
//! Then the background task runs its [`Probe`] (a TCP connect by default; an HTTP `GET`
//! of a path, or a gRPC health check, if configured) without spending any user's request
//! on it: when the probe passes, the endpoint is readmitted and probed again like a new
//! one (see the crate docs, "New endpoints"); when it fails, the endpoint stays out for
//! the next, longer delay. Endpoints that do not know their address
//! ([`Labelled::origin`](gray_core::Labelled::origin) is `None`), and every endpoint under
//! [`Probe::disabled`], come back when their delay is over, and the next request that
//! fits them finds out whether they work.
//!
//! Ejection and readmission are applied by the background task, never on the request path,
//! so the counts the policy walks stay exact and the request path takes no lock. Until the
//! task has ejected an endpoint that reached the threshold (microseconds, on a runtime
//! that is not starved), picks avoid it: p2c takes the other candidate and probes skip it;
//! only a subset with that one endpoint still sends to it (a [retry](crate::retry) then
//! excludes it).
//!
//! [`classify`] walks the error's `source()` chain for an [`std::io::Error`] of a
//! connection kind, for gray-core's [`Unsent`](gray_core::unsent::Unsent) (an endpoint that
//! handed back a request it did not send) and, with the `hyper-util` feature, for
//! hyper-util's and hyper's client errors. The endpoints of `gray_discovery::http` keep the
//! connector's `io::Error` as the source of their errors, so a refused or reset instance is
//! recognised without a feature.
//!
//! ```
//! use std::{io, time::Duration};
//! use gray_balance::health::{Ejection, Failure, classify, is_connection_error};
//! use gray_core::backoff::Backoff;
//!
//! let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
//! assert_eq!(classify(&refused), Failure::Refused);
//! assert!(is_connection_error(&refused));
//! assert_eq!(classify(&io::Error::from(io::ErrorKind::ConnectionReset)), Failure::Broken);
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

mod failure;
#[cfg(feature = "grpc-health")]
mod grpc;
mod probe;

use std::time::Duration;

use gray_core::backoff::Backoff;

pub(crate) use self::probe::ProbeFuture;
pub use self::{
    failure::{Classifier, Failure, classify, is_connection_error},
    probe::{Check, Probe},
};

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

    /// Connection errors in a row that eject an endpoint; `0` turns ejection off (a
    /// refusal then ejects nothing either).
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
