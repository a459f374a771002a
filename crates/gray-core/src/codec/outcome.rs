//! What a carrier yields: [`Decoded`] when it reads a stain, a [`Rejection`] (with its
//! [`Reason`]) when it is present but unusable.

use std::{borrow::Cow, fmt, sync::Arc};

use http::HeaderName;

use crate::{
    name::{InvalidName, Lane},
    stain::{InvalidService, Pins},
};

/// What one carrier found on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decoded {
    /// The request is in this lane.
    Lane(Lane),
    /// The request says explicitly that it is baseline (`gray: false`).
    Baseline,
    /// The request pins versions.
    Pins(Arc<Pins>),
}

/// Why a carrier was ignored. The request is treated as if the carrier were absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    header: HeaderName,
    reason: Reason,
}

/// The reason inside a [`Rejection`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The value is longer than the configured cap.
    TooLong {
        /// Length of the value, in bytes.
        len: usize,
        /// The configured cap, in bytes.
        max: usize,
    },
    /// The value is not UTF-8 text.
    NotText,
    /// The value is empty.
    Empty,
    /// A boolean flag holds something other than `true` or `false`.
    NotABoolean,
    /// A lane or version name is not a valid token.
    InvalidName(InvalidName),
    /// A service name in version pins is invalid.
    InvalidService(InvalidService),
    /// The JSON route header does not parse.
    InvalidJson(String),
    /// A [`CustomCarrier`](super::CustomCarrier)'s own reason, displayed as it is: a
    /// sentence fragment such as `its signature does not match`.
    Other(Cow<'static, str>),
}

// === impl Rejection ===

impl Rejection {
    /// `header` was ignored, for `reason` (for a [`CustomCarrier`](super::CustomCarrier)'s
    /// [`decode`](super::CustomCarrier::decode)).
    #[must_use]
    pub fn new(header: &HeaderName, reason: Reason) -> Self {
        Rejection {
            header: header.clone(),
            reason,
        }
    }

    /// The header that was ignored.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Why it was ignored.
    pub fn reason(&self) -> &Reason {
        &self.reason
    }
}

// === impl Reason ===

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::TooLong { len, max } => {
                write!(f, "its value is {len} bytes, more than the cap of {max}")
            }
            Reason::NotText => f.write_str("its value is not UTF-8 text"),
            Reason::Empty => f.write_str("its value is empty"),
            Reason::NotABoolean => f.write_str("its value is neither `true` nor `false`"),
            Reason::InvalidName(e) => fmt::Display::fmt(e, f),
            Reason::InvalidService(e) => fmt::Display::fmt(e, f),
            Reason::InvalidJson(e) => write!(f, "its value is not a valid route rule: {e}"),
            Reason::Other(reason) => f.write_str(reason),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ignored header `{}`: {}", self.header, self.reason)
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.reason {
            Reason::InvalidName(e) => Some(e),
            Reason::InvalidService(e) => Some(e),
            _ => None,
        }
    }
}
