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
    /// A source of your own failed (a registry's HTTP API, say); see
    /// [`SourceError::other`].
    Other {
        /// What was being done: `GET http://127.0.0.1:8500/v1/health/service/orders`.
        action: String,
        /// Why it failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl SourceError {
    /// A failure of a [`Source`](crate::Source) implemented outside this crate: what it
    /// was doing, and why that failed.
    ///
    /// ```
    /// use gray_source::SourceError;
    ///
    /// let e = SourceError::other("GET http://127.0.0.1:8500/v1/catalog", "connection refused");
    /// assert_eq!(e.to_string(), "GET http://127.0.0.1:8500/v1/catalog failed: connection refused");
    /// ```
    pub fn other(
        action: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        SourceError::Other {
            action: action.into(),
            source: source.into(),
        }
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            #[cfg(feature = "etcd")]
            SourceError::Etcd { action, source } => {
                write!(f, "etcd {action} failed: ")?;
                let over = if action.ends_with(crate::etcd::OVER_TLS) {
                    Over::Tls
                } else if action.ends_with(ON_NEW_PLAIN_TEXT) {
                    Over::NewPlainText
                } else {
                    Over::PlainText
                };
                explain(source, over, f)
            }
            SourceError::Timeout { action, after } => {
                write!(f, "{action}: no answer within {after:?}")
            }
            SourceError::Config { field, message } => write!(f, "setting `{field}`: {message}"),
            SourceError::Other { action, source } => write!(f, "{action} failed: {source}"),
        }
    }
}

/// How an action on a new plain-text connection that the member closed at once ends.
#[cfg(feature = "etcd")]
const ON_NEW_PLAIN_TEXT: &str = "on a new plain-text connection";

/// What an etcd request went over, as far as its error can tell.
#[cfg(feature = "etcd")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Over {
    Tls,
    PlainText,
    /// A plain-text connection, closed by the member before it answered anything.
    NewPlainText,
}

#[cfg(feature = "etcd")]
impl SourceError {
    /// Marks the failure of the first request on a new plain-text connection when the
    /// member closed the connection: what a TLS member does to a client that does not speak
    /// TLS (a plain-text member killed at that very moment is the other, rarer, cause), so
    /// the message says so.
    pub(crate) fn first_on_plain_text(self) -> Self {
        match self {
            SourceError::Etcd { action, source }
                if !action.ends_with(crate::etcd::OVER_TLS)
                    && !action.ends_with(ON_NEW_PLAIN_TEXT)
                    && is_closed(&describe(&source).to_ascii_lowercase()) =>
            {
                SourceError::Etcd {
                    action: format!("{action} {ON_NEW_PLAIN_TEXT}"),
                    source,
                }
            }
            other => other,
        }
    }
}

/// Whether an error's text says that the peer closed the connection.
#[cfg(feature = "etcd")]
fn is_closed(lower: &str) -> bool {
    [
        "connection closed",
        "connection reset",
        "broken pipe",
        "early eof",
        "unexpected eof",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

/// etcd-client's error, compact (tonic's `Status` prints its details and metadata), with
/// the causes of a transport failure.
#[cfg(feature = "etcd")]
fn describe(error: &etcd_client::Error) -> String {
    use std::error::Error as _;

    let (mut text, mut cause): (String, Option<&(dyn std::error::Error + 'static)>) = match error {
        etcd_client::Error::GRpcStatus(status) => (
            format!("{:?}: {}", status.code(), status.message()),
            status.source(),
        ),
        etcd_client::Error::TransportError(e) => (e.to_string(), e.source()),
        other => (other.to_string(), None),
    };
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// etcd-client's error, compact, with a hint where the fix is the operator's.
#[cfg(feature = "etcd")]
fn explain(error: &etcd_client::Error, over: Over, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let text = describe(error);
    f.write_str(&text)?;
    let lower = text.to_ascii_lowercase();
    let hint = if lower.contains("authentication failed")
        || lower.contains("invalid auth token")
        || lower.contains("user name is empty")
    {
        Some("check the user and password")
    } else if lower.contains("permission denied") {
        Some("the user lacks a permission on this key")
    } else if lower.contains("certificate")
        || lower.contains("handshake")
        || lower.contains("tls")
        || lower.contains("https")
    {
        Some("check the TLS settings: the CA, the client certificate and key, the server name")
    } else if over == Over::Tls && is_closed(&lower) {
        Some(
            "a member closes the connection when it refuses the client certificate: \
             check the TLS settings: the CA, the client certificate and key",
        )
    } else if over == Over::NewPlainText && is_closed(&lower) {
        Some(
            "the member closed the connection before answering: it may be a TLS member; \
             use https:// with the TLS settings, `[etcd.tls]`",
        )
    } else {
        None
    };
    match hint {
        Some(hint) => write!(f, " ({hint})"),
        None => Ok(()),
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SourceError::Read { source, .. } => Some(source),
            #[cfg(feature = "etcd")]
            SourceError::Etcd { source, .. } => Some(source),
            SourceError::Other { source, .. } => Some(&**source),
            _ => None,
        }
    }
}
