//! Why a source could not be read.

use std::{fmt, io, path::PathBuf, time::Duration};

/// Why a source could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// An etcd request failed.
    #[cfg(feature = "etcd")]
    Etcd {
        /// What was being done: `list /gray/orders/`, `watch /gray/rules from revision 8`.
        action: String,
        /// etcd's error.
        source: etcd_client::Error,
    },
    /// A request got no answer in time.
    Timeout {
        /// What was being done.
        action: String,
        /// The time allowed.
        after: Duration,
    },
    /// The source is configured wrongly.
    Config {
        /// The setting.
        field: &'static str,
        /// What is wrong and what was expected.
        message: String,
    },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            #[cfg(feature = "etcd")]
            SourceError::Etcd { action, source } => write!(f, "etcd {action} failed: {source}"),
            SourceError::Timeout { action, after } => {
                write!(f, "{action}: no answer within {after:?}")
            }
            SourceError::Config { field, message } => write!(f, "setting `{field}`: {message}"),
        }
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SourceError::Read { source, .. } => Some(source),
            #[cfg(feature = "etcd")]
            SourceError::Etcd { source, .. } => Some(source),
            _ => None,
        }
    }
}
