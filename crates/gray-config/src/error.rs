//! [`ConfigError`]: where a configuration document is wrong, and why.

use std::{fmt, sync::Arc};

/// A configuration document that was rejected: the source, the position, the field and
/// what is wrong with it.
///
/// Its `Display` reads `SOURCE:LINE:COLUMN: field `FIELD`: MESSAGE`, the way compilers
/// report errors, so that editors can jump to it; the parts that are unknown are left out:
///
/// ```text
/// gateway.toml:12:1: field `services.orders.falback`: unknown field `falback`, expected one of `pick`, `name`, …
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    source_name: Arc<str>,
    line: Option<usize>,
    column: Option<usize>,
    field: Option<String>,
    message: String,
    /// The cargo feature of gray-config that the format needs, when it is off.
    disabled: Option<&'static str>,
}

impl ConfigError {
    /// An error about the source as a whole, such as a file that cannot be read. Errors
    /// about a field come from [`Document::error`](super::Document::error), which finds its
    /// line.
    ///
    /// ```
    /// use gray_config::ConfigError;
    ///
    /// let err = ConfigError::new("gateway.toml", "cannot read it: permission denied");
    /// assert_eq!(err.to_string(), "gateway.toml: cannot read it: permission denied");
    /// ```
    pub fn new(source_name: &str, message: impl fmt::Display) -> Self {
        ConfigError {
            source_name: Arc::from(source_name),
            line: None,
            column: None,
            field: None,
            message: message.to_string(),
            disabled: None,
        }
    }

    pub(crate) fn located(
        source_name: &str,
        position: Option<super::Position>,
        field: Option<String>,
        message: String,
    ) -> Self {
        ConfigError {
            source_name: Arc::from(source_name),
            line: position.map(|(line, _)| line),
            column: position.and_then(|(_, column)| column),
            // serde_path_to_error writes `.` for the root and `?` for a key it could not read.
            field: field
                .map(|f| f.trim_end_matches('?').trim_end_matches('.').to_owned())
                .filter(|f| !f.is_empty()),
            message,
            disabled: None,
        }
    }

    /// A document in a format whose `feature` is not compiled in.
    pub(crate) fn format_disabled(source_name: &str, feature: &'static str) -> Self {
        ConfigError {
            disabled: Some(feature),
            ..ConfigError::new(
                source_name,
                format_args!(
                    "this format is not compiled in: enable the `{feature}` feature of gray-config"
                ),
            )
        }
    }

    /// The source: a file path, an etcd key, or whatever name the caller gave.
    #[must_use]
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The line of the error, from 1, when the format reports it.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column of the error, from 1, when the format reports it.
    #[must_use]
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// The dotted path of the field at fault, such as `services.orders[1].address`;
    /// `None` for the document as a whole.
    #[must_use]
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// What is wrong, without the position and the field.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The source's name, shared: for an error type of a program's own that keeps it.
    #[must_use]
    pub fn shared_source(&self) -> &Arc<str> {
        &self.source_name
    }

    /// The cargo feature of gray-config that would read this document's format, when the
    /// error is that the format was not compiled in (`"toml"`, `"yaml"`).
    #[must_use]
    pub fn disabled_feature(&self) -> Option<&'static str> {
        self.disabled
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source_name)?;
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

impl std::error::Error for ConfigError {}
