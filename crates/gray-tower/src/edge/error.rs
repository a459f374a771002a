//! Why a source could not give a rule set.

use std::fmt;

use gray_rules::{Format, RulesError};
use gray_source::SourceError;

/// Why rules could not be read from a [`Source`](gray_source::Source).
#[derive(Debug)]
#[non_exhaustive]
pub enum RuleSourceError {
    /// The source could not be read (a missing file, etcd unreachable, wrong credentials).
    Source(SourceError),
    /// The source holds nothing: the etcd key does not exist.
    Missing(String),
    /// The source holds more than one key (a rule set is one key, or one file).
    NotOneKey {
        /// The source.
        source: String,
        /// Its keys.
        keys: Vec<String>,
    },
    /// The key's name has no known extension and no format was given.
    UnknownFormat(String),
    /// The value is not UTF-8 text.
    NotText(String),
    /// The document is empty: 0 bytes, or blanks and comments only (a file caught while it
    /// was written in place, a config tool that truncated it). "No rules" is written
    /// explicitly (`rules = []`).
    Empty {
        /// The source: a file's path, an etcd key.
        source: String,
        /// Its format, to say what to write instead.
        format: Format,
    },
    /// The rule set is invalid.
    Rules(RulesError),
}

impl fmt::Display for RuleSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleSourceError::Source(e) => fmt::Display::fmt(e, f),
            RuleSourceError::Missing(source) => {
                write!(f, "{source} holds no rule set (the key does not exist)")
            }
            RuleSourceError::NotOneKey { source, keys } => write!(
                f,
                "{source} holds {} keys ({}), where a rule set is one key",
                keys.len(),
                keys.join(", ")
            ),
            RuleSourceError::UnknownFormat(key) => write!(
                f,
                "cannot tell the format of {key}: expected a .toml, .yaml, .yml or .json \
                 extension, or a format given with the source"
            ),
            RuleSourceError::NotText(key) => write!(f, "{key} does not hold UTF-8 text"),
            RuleSourceError::Empty { source, format } => {
                let example = match format {
                    Format::Yaml => "rules: []",
                    Format::Json => r#"{"rules": []}"#,
                    _ => "rules = []",
                };
                write!(
                    f,
                    "{source}: empty: a rule set must say what it holds; write `{example}` to turn every rule off"
                )
            }
            RuleSourceError::Rules(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for RuleSourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuleSourceError::Source(e) => Some(e),
            RuleSourceError::Rules(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RulesError> for RuleSourceError {
    fn from(e: RulesError) -> Self {
        RuleSourceError::Rules(e)
    }
}

impl From<SourceError> for RuleSourceError {
    fn from(e: SourceError) -> Self {
        RuleSourceError::Source(e)
    }
}
