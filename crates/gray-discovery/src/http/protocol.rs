//! [`Protocol`]: which HTTP version an endpoint speaks to its instance.

use std::fmt;

/// The HTTP version an endpoint speaks to its instance; see the
/// [module docs](super#protocols).
///
/// ```
/// use gray_discovery::http::Protocol;
///
/// assert_eq!(Protocol::default(), Protocol::Http1);
/// assert_eq!("h2c".parse::<Protocol>().unwrap(), Protocol::Http2);
/// assert_eq!(Protocol::Auto.to_string(), "auto");
/// assert!("http3".parse::<Protocol>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// HTTP/1.1 (ALPN `http/1.1` over TLS).
    #[default]
    Http1,
    /// HTTP/2: with prior knowledge in cleartext (h2c), ALPN `h2` over TLS.
    Http2,
    /// Over TLS, what the instance chooses by ALPN (`h2` offered first, then `http/1.1`);
    /// in cleartext, HTTP/1.1.
    Auto,
}

// === impl Protocol ===

impl Protocol {
    /// Its name: `http1`, `h2` or `auto`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "h2",
            Protocol::Auto => "auto",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Protocol {
    type Err = crate::Error;

    /// `http1` (or `http/1.1`), `h2` or `h2c` (both [`Protocol::Http2`]: which transport
    /// is the instance's), `auto`.
    fn from_str(s: &str) -> Result<Self, crate::Error> {
        match s {
            "http1" | "http/1.1" => Ok(Protocol::Http1),
            "h2" | "h2c" => Ok(Protocol::Http2),
            "auto" => Ok(Protocol::Auto),
            _ => Err(crate::Error::invalid(
                "protocol",
                s,
                "expected `http1`, `h2`, `h2c` or `auto`",
            )),
        }
    }
}
