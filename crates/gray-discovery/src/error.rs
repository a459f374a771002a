//! The errors of this crate: [`Error`]; an instance file that was rejected is an
//! [`Error::Parse`] holding gray-core's [`ConfigError`], which names the file (or etcd key),
//! the line, the column and the field.
//!
//! ```
//! use gray_discovery::{Error, InstanceId};
//!
//! let err = "orders/1".parse::<InstanceId>().unwrap_err();
//! assert!(matches!(err, Error::Invalid { what: "instance id", .. }));
//! assert_eq!(err.to_string(), "invalid instance id `orders/1`: it contains `/`");
//! ```

use std::fmt;

pub use gray_config::ConfigError;
use gray_source::SourceError;

/// What went wrong in a registry, a registration or an endpoint.
///
/// Every variant names what failed (the file, the field, the etcd key or request) and why.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A value that is not a valid instance id, address or service name.
    Invalid {
        /// What the value was meant to be: `"instance id"`, `"address"`, `"service name"`.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The source could not be read (a file that is missing, etcd unreachable).
    Source(SourceError),
    /// An instance file could not be parsed, or was empty: gray-config's loader says
    /// where (file, line, column, field) and why.
    Parse(ConfigError),
    /// A request to etcd failed.
    #[cfg(feature = "etcd")]
    Etcd {
        /// The request that failed, for example `"grant a lease"`.
        action: String,
        /// The etcd client error.
        source: etcd_client::Error,
    },
    /// A request to etcd did not answer in time.
    #[cfg(feature = "etcd")]
    Timeout {
        /// The request that timed out.
        action: String,
    },
}

impl Error {
    pub(crate) fn invalid(what: &'static str, value: &str, reason: &'static str) -> Self {
        Error::Invalid {
            what,
            value: value.to_owned(),
            reason,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid {
                what,
                value,
                reason,
            } => write!(f, "invalid {what} `{value}`: {reason}"),
            Error::Source(e) => fmt::Display::fmt(e, f),
            Error::Parse(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "etcd")]
            Error::Etcd { action, source } => write!(f, "etcd: cannot {action}: {source}"),
            #[cfg(feature = "etcd")]
            Error::Timeout { action } => write!(f, "etcd: cannot {action}: timed out"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Displayed as themselves: their sources are this error's.
            Error::Source(e) => std::error::Error::source(e),
            Error::Parse(e) => std::error::Error::source(e),
            #[cfg(feature = "etcd")]
            Error::Etcd { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Parse(e)
    }
}
