//! The client IP: the peer address, and `X-Forwarded-For` / `Forwarded` through trusted
//! proxies only.
//!
//! The chain of addresses a request went through is the forwarding header's entries, left to
//! right, followed by the TCP peer. Only the proxies you trust wrote entries you can believe,
//! and each of them appends on the right, so the chain is read **from the right**:
//!
//! - [`TrustedProxies::none`] (the default): the peer is the client; headers are ignored.
//! - [`TrustedProxies::hops`]`(n)`: `n` proxies stand in front of this service (the peer is
//!   the first); the client is the entry `n` places left of the peer. If the chain is
//!   shorter, its left-most entry is taken.
//! - [`TrustedProxies::cidrs`]`(list)`: starting at the peer, every address inside `list`
//!   is a trusted proxy and is skipped; the right-most address that is **not** a trusted
//!   proxy is the client. If every address is a trusted proxy, the left-most one is.
//!
//! Whatever a client writes on the left of the header is never reached unless every hop on
//! its right is trusted. An entry that is not an address (`unknown`, an obfuscated
//! `_node`, garbage) where the walk stops means the client is unknown: `None`. Only the
//! right-most [`MAX_HOPS`] entries are looked at. Parsing never panics and never allocates.
//!
//! Read only the header your proxies write ([`ForwardedHeader`]): a proxy that appends to
//! `X-Forwarded-For` passes a client's forged `Forwarded` through untouched.
//!
//! ```
//! use gray_rules::CidrList;
//! use gray_tower::edge::{ClientIpResolver, ForwardedHeader, TrustedProxies};
//! use http::HeaderMap;
//!
//! let proxies = CidrList::parse(["10.0.0.0/8"])?;
//! let resolver = ClientIpResolver::new(TrustedProxies::cidrs(proxies));
//! let mut headers = HeaderMap::new();
//! // The client forged "1.1.1.1"; the trusted proxy 10.0.0.5 appended the real address.
//! headers.insert("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.9".parse()?);
//! let peer = Some("10.0.0.5".parse()?);
//! assert_eq!(resolver.resolve(peer, &headers), Some("203.0.113.7".parse()?));
//!
//! let rfc = ClientIpResolver::new(TrustedProxies::hops(1)).with_header(ForwardedHeader::Forwarded);
//! let mut headers = HeaderMap::new();
//! headers.insert("forwarded", r#"for=1.1.1.1, for="[2001:db8::7]:4711";proto=https"#.parse()?);
//! assert_eq!(rfc.resolve(peer, &headers), Some("2001:db8::7".parse()?));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod chain;
#[cfg(test)]
mod tests;

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use gray_rules::{CidrList, canonical_ip};

use self::chain::{Chain, Hop, for_each_forwarded_element, parse_node};
use http::{
    Extensions, HeaderMap, HeaderName, HeaderValue,
    header::{Entry, FORWARDED},
};

/// How many forwarding entries, from the right, are looked at.
pub const MAX_HOPS: usize = 32;

/// `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The TCP peer address of a request, as an extension.
///
/// Insert it in your accept loop (hyper) or let the `axum` feature read axum's
/// `ConnectInfo<SocketAddr>`; [`PeerAddr`] wins when both are present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The peer address of a request: [`PeerAddr`], else (feature `axum`) `ConnectInfo`.
#[must_use]
pub fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    None
}

/// Which forwarding header the trusted proxies write.
///
/// In a configuration file: `"x-forwarded-for"` or `"forwarded"` (serde, and [`FromStr`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:80";proto=https`.
    Forwarded,
}

impl ForwardedHeader {
    /// The header's name.
    #[must_use]
    pub fn header_name(self) -> HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
            ForwardedHeader::Forwarded => FORWARDED,
        }
    }
}

/// A name that is neither `x-forwarded-for` nor `forwarded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownForwardedHeader(String);

impl fmt::Display for UnknownForwardedHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expected `x-forwarded-for` or `forwarded`, found {:?}",
            self.0
        )
    }
}

impl std::error::Error for UnknownForwardedHeader {}

impl FromStr for ForwardedHeader {
    type Err = UnknownForwardedHeader;

    /// `x-forwarded-for` or `forwarded`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("x-forwarded-for") {
            Ok(ForwardedHeader::XForwardedFor)
        } else if s.eq_ignore_ascii_case("forwarded") {
            Ok(ForwardedHeader::Forwarded)
        } else {
            Err(UnknownForwardedHeader(s.to_owned()))
        }
    }
}

/// Which proxies in front of this service are trusted to report the client address.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Trust);

#[derive(Debug, Clone, Default)]
enum Trust {
    #[default]
    None,
    Hops(usize),
    Cidrs(CidrList),
}

impl TrustedProxies {
    /// No proxy is trusted: the TCP peer is the client.
    #[must_use]
    pub fn none() -> Self {
        TrustedProxies(Trust::None)
    }

    /// Exactly `n` proxies stand in front of this service (the peer being the first).
    /// `0` is the same as [`TrustedProxies::none`].
    #[must_use]
    pub fn hops(n: usize) -> Self {
        TrustedProxies(Trust::Hops(n))
    }

    /// Every address in `proxies` is a trusted proxy.
    #[must_use]
    pub fn cidrs(proxies: CidrList) -> Self {
        TrustedProxies(Trust::Cidrs(proxies))
    }
}

/// Finds the client IP of a request; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct ClientIpResolver {
    trust: TrustedProxies,
    header: ForwardedHeader,
}

// === impl ClientIpResolver ===

impl ClientIpResolver {
    /// A resolver trusting `trust`, reading `X-Forwarded-For`.
    #[must_use]
    pub fn new(trust: TrustedProxies) -> Self {
        ClientIpResolver {
            trust,
            header: ForwardedHeader::XForwardedFor,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    #[must_use]
    pub fn with_header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Trusts `trust` instead (the header read stays as it is).
    #[must_use]
    pub fn with_proxies(mut self, trust: TrustedProxies) -> Self {
        self.trust = trust;
        self
    }

    /// The header this resolver reads.
    #[must_use]
    pub fn header(&self) -> ForwardedHeader {
        self.header
    }

    /// Whether any proxy is trusted (a number of hops above 0, or a CIDR list that is not
    /// empty): then the forwarding header is read.
    #[must_use]
    pub fn trusts_proxies(&self) -> bool {
        match &self.trust.0 {
            Trust::None | Trust::Hops(0) => false,
            Trust::Hops(_) => true,
            Trust::Cidrs(proxies) => !proxies.is_empty(),
        }
    }

    /// The client IP of a request from `peer` with `headers`. `None` when unknown.
    #[must_use]
    pub fn resolve(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = match peer {
            Some(ip) => Hop::Ip(canonical_ip(ip)),
            None => Hop::Unknown,
        };
        let hop = match &self.trust.0 {
            // No proxy to trust: the peer is the client, whatever the headers say.
            Trust::None | Trust::Hops(0) => peer,
            Trust::Cidrs(proxies) if proxies.is_empty() => peer,
            Trust::Hops(n) => {
                let chain = self.chain(headers, peer);
                match chain.nth_from_right(*n) {
                    Some(hop) => hop,
                    // Shorter than the configured hops: the left-most entry, when we have it.
                    None if !chain.truncated() => chain.nth_from_right(chain.kept() - 1)?,
                    None => Hop::Unknown,
                }
            }
            Trust::Cidrs(proxies) => {
                let chain = self.chain(headers, peer);
                let mut found = Hop::Unknown;
                for n in 0..chain.kept() {
                    let hop = chain.nth_from_right(n)?;
                    found = hop;
                    match hop {
                        Hop::Ip(ip) if proxies.contains(ip) => {}
                        _ => break,
                    }
                    if n + 1 == chain.kept() && chain.truncated() {
                        // Every kept entry is a trusted proxy and more were dropped.
                        found = Hop::Unknown;
                    }
                }
                found
            }
        };
        match hop {
            Hop::Ip(ip) => Some(ip),
            Hop::Unknown => None,
        }
    }

    fn chain(&self, headers: &HeaderMap, peer: Hop) -> Chain {
        let mut chain = Chain::new();
        match self.header {
            ForwardedHeader::XForwardedFor => {
                for line in headers.get_all(X_FORWARDED_FOR) {
                    for entry in line.as_bytes().split(|&b| b == b',') {
                        let entry = entry.trim_ascii();
                        if !entry.is_empty() {
                            chain.push(parse_node(entry));
                        }
                    }
                }
            }
            ForwardedHeader::Forwarded => {
                for line in headers.get_all(FORWARDED) {
                    for_each_forwarded_element(line.as_bytes(), |hop| chain.push(hop));
                }
            }
        }
        chain.push(peer);
        chain
    }
}

// === forwarding headers, written ===

/// An address as an `X-Forwarded-For` entry: made once per connection by a proxy, then
/// appended to each request with [`append_forwarded_for`].
#[must_use]
pub fn forwarded_for(ip: IpAddr) -> HeaderValue {
    // An address's text is always a valid header value.
    HeaderValue::try_from(ip.to_string()).unwrap_or(HeaderValue::from_static("unknown"))
}

/// Appends `entry` (from [`forwarded_for`]) to `X-Forwarded-For`, as a proxy does for the
/// next hop: several lines become one, `a, b, entry`.
///
/// ```
/// use gray_tower::edge::client_ip::{append_forwarded_for, forwarded_for};
/// use http::HeaderMap;
///
/// let mut headers = HeaderMap::new();
/// headers.append("x-forwarded-for", "203.0.113.9".parse()?);
/// headers.append("x-forwarded-for", "10.0.0.9".parse()?);
/// append_forwarded_for(&mut headers, &forwarded_for("10.0.0.2".parse()?));
/// assert_eq!(headers["x-forwarded-for"], "203.0.113.9, 10.0.0.9, 10.0.0.2");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn append_forwarded_for(headers: &mut HeaderMap, entry: &HeaderValue) {
    match headers.entry(X_FORWARDED_FOR) {
        Entry::Vacant(vacant) => {
            vacant.insert(entry.clone());
        }
        Entry::Occupied(mut occupied) => {
            let mut value = Vec::new();
            for previous in occupied.iter() {
                value.extend_from_slice(previous.as_bytes());
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(entry.as_bytes());
            // Replaces every previous line with the joined one.
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                occupied.insert(value);
            }
        }
    }
}
