//! Errors of rule sources.

use std::{fmt, io, path::PathBuf};

use gray_core::rules::RulesError;

/// A rule source that could not produce a rule set.
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file's extension names no known format and none was configured.
    UnknownFormat(PathBuf),
    /// The rule set is invalid.
    Rules(RulesError),
    /// The etcd key does not exist.
    MissingKey(String),
    /// The etcd value is not UTF-8 text.
    NotText(String),
    /// etcd failed.
    #[cfg(feature = "etcd")]
    Etcd(etcd_client::Error),
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Io { path, source } => {
                write!(f, "cannot read rule file {}: {source}", path.display())
            }
            SourceError::UnknownFormat(path) => write!(
                f,
                "cannot tell the format of rule file {}: expected a .toml, .yaml, .yml or .json extension",
                path.display()
            ),
            SourceError::Rules(e) => fmt::Display::fmt(e, f),
            SourceError::MissingKey(key) => write!(f, "etcd key {key:?} does not exist"),
            SourceError::NotText(key) => write!(f, "etcd key {key:?} does not hold UTF-8 text"),
            #[cfg(feature = "etcd")]
            SourceError::Etcd(e) => write!(f, "etcd failed: {e}"),
        }
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SourceError::Io { source, .. } => Some(source),
            SourceError::Rules(e) => Some(e),
            #[cfg(feature = "etcd")]
            SourceError::Etcd(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RulesError> for SourceError {
    fn from(e: RulesError) -> Self {
        SourceError::Rules(e)
    }
}
