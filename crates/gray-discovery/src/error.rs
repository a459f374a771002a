//! The errors of this crate: [`Error`], and [`ParseError`] for an instance file that was
//! rejected, which names the file, the line, the column and the field.
//!
//! ```
//! use gray_discovery::{Error, InstanceId};
//!
//! let err = "orders/1".parse::<InstanceId>().unwrap_err();
//! assert!(matches!(err, Error::Invalid { what: "instance id", .. }));
//! assert_eq!(err.to_string(), "invalid instance id `orders/1`: it contains `/`");
//! ```

use std::{fmt, path::PathBuf};

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
    /// An instance file could not be parsed, or was empty.
    Parse(ParseError),
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

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Self {
        Error::Parse(e)
    }
}

/// An instance file whose content was rejected: where, which field, and why.
///
/// Its `Display` reads `FILE:LINE:COLUMN: field `FIELD`: MESSAGE`, the way compilers
/// report errors, so editors can jump to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub(crate) path: PathBuf,
    pub(crate) line: Option<usize>,
    pub(crate) column: Option<usize>,
    pub(crate) field: Option<String>,
    pub(crate) message: String,
}

impl ParseError {
    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The line of the error, from 1, when the parser knows it.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column of the error, from 1, when the parser knows it.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The path of the field in error, for example `services.orders[1].address`.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ParseError {}
