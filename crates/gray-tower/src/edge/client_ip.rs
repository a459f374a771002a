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
//! use gray_core::rules::CidrList;
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

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    str::FromStr,
};

use gray_core::rules::{CidrList, canonical_ip};
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
    pub fn none() -> Self {
        TrustedProxies(Trust::None)
    }

    /// Exactly `n` proxies stand in front of this service (the peer being the first).
    /// `0` is the same as [`TrustedProxies::none`].
    pub fn hops(n: usize) -> Self {
        TrustedProxies(Trust::Hops(n))
    }

    /// Every address in `proxies` is a trusted proxy.
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

/// One entry of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    Ip(IpAddr),
    Unknown,
}

/// The right-most [`MAX_HOPS`] entries, kept on the stack.
struct Chain {
    ring: [Hop; MAX_HOPS],
    len: usize,
}

impl Chain {
    fn new() -> Self {
        Chain {
            ring: [Hop::Unknown; MAX_HOPS],
            len: 0,
        }
    }

    fn push(&mut self, hop: Hop) {
        self.ring[self.len % MAX_HOPS] = hop;
        self.len += 1;
    }

    /// The entry `n` places left of the right-most one, if it is still kept.
    fn nth_from_right(&self, n: usize) -> Option<Hop> {
        (n < self.len.min(MAX_HOPS)).then(|| self.ring[(self.len - 1 - n) % MAX_HOPS])
    }

    fn kept(&self) -> usize {
        self.len.min(MAX_HOPS)
    }

    /// `true` when entries were dropped on the left.
    fn truncated(&self) -> bool {
        self.len > MAX_HOPS
    }
}

impl ClientIpResolver {
    /// A resolver trusting `trust`, reading `X-Forwarded-For`.
    pub fn new(trust: TrustedProxies) -> Self {
        ClientIpResolver {
            trust,
            header: ForwardedHeader::XForwardedFor,
        }
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    pub fn with_header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Trusts `trust` instead (the header read stays as it is).
    pub fn with_proxies(mut self, trust: TrustedProxies) -> Self {
        self.trust = trust;
        self
    }

    /// The header this resolver reads.
    pub fn header(&self) -> ForwardedHeader {
        self.header
    }

    /// The client IP of a request from `peer` with `headers`. `None` when unknown.
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

/// An address as an `X-Forwarded-For` entry: made once per connection by a proxy, then
/// appended to each request with [`append_forwarded_for`].
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

/// Parses a node: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`. Anything else is unknown.
fn parse_node(raw: &[u8]) -> Hop {
    let Ok(s) = std::str::from_utf8(raw) else {
        return Hop::Unknown;
    };
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Hop::Ip(canonical_ip(ip));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Hop::Ip(canonical_ip(addr.ip()));
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if let Ok(ip) = inner.parse::<std::net::Ipv6Addr>() {
            return Hop::Ip(canonical_ip(IpAddr::V6(ip)));
        }
    }
    Hop::Unknown
}

/// Walks the elements of one `Forwarded` line (RFC 7239), calling `f` with each element's
/// `for` node (unknown when absent or not an address). Quoted strings may hold `,` and `;`.
fn for_each_forwarded_element(line: &[u8], mut f: impl FnMut(Hop)) {
    let mut i = 0;
    let mut element_for: Option<Hop> = None;
    let mut element_has_content = false;
    while i <= line.len() {
        // One pair: token '=' (token | quoted-string), up to ';' or ',' or the end.
        let start = i;
        let mut in_quotes = false;
        let mut escaped = false;
        while i < line.len() {
            let b = line[i];
            if in_quotes {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_quotes = false;
                }
            } else if b == b'"' {
                in_quotes = true;
            } else if b == b';' || b == b',' {
                break;
            }
            i += 1;
        }
        let pair = line[start..i].trim_ascii();
        if !pair.is_empty() {
            element_has_content = true;
            if let Some(eq) = pair.iter().position(|&b| b == b'=') {
                let key = pair[..eq].trim_ascii();
                if key.eq_ignore_ascii_case(b"for") {
                    let value = pair[eq + 1..].trim_ascii();
                    let hop = match unquote(value) {
                        Some(v) => parse_node(v),
                        None => Hop::Unknown,
                    };
                    // A second `for` in one element is malformed: the element is unknown.
                    element_for = Some(if element_for.is_some() {
                        Hop::Unknown
                    } else {
                        hop
                    });
                }
            }
        }
        let end_of_element = i >= line.len() || line[i] == b',';
        if end_of_element {
            if element_has_content {
                f(element_for.unwrap_or(Hop::Unknown));
            }
            element_for = None;
            element_has_content = false;
        }
        i += 1;
    }
}

/// A token as is, or a quoted string without its quotes; escapes make it unusable as a
/// node (no address contains them). `None` for an unterminated quote.
fn unquote(v: &[u8]) -> Option<&[u8]> {
    match v.first() {
        Some(b'"') => {
            let inner = v.get(1..v.len().checked_sub(1)?)?;
            (v.len() >= 2 && v[v.len() - 1] == b'"' && !inner.contains(&b'\\')).then_some(inner)
        }
        _ => Some(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cidrs(list: &[&str]) -> CidrList {
        list.iter()
            .map(|s| s.parse::<gray_core::rules::Cidr>().unwrap())
            .collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR, v.parse().unwrap());
        }
        h
    }

    fn fwd(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(FORWARDED, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn no_trust_uses_the_peer() {
        let r = ClientIpResolver::default();
        assert_eq!(
            r.resolve(Some(ip("9.9.9.9")), &xff(&["1.1.1.1"])),
            Some(ip("9.9.9.9"))
        );
        assert_eq!(r.resolve(None, &xff(&["1.1.1.1"])), None);
    }

    #[test]
    fn hops_count_from_the_right() {
        let peer = Some(ip("10.0.0.1"));
        let one = ClientIpResolver::new(TrustedProxies::hops(1));
        let two = ClientIpResolver::new(TrustedProxies::hops(2));
        let h = xff(&["6.6.6.6, 5.5.5.5", "4.4.4.4"]);
        assert_eq!(one.resolve(peer, &h), Some(ip("4.4.4.4")));
        assert_eq!(two.resolve(peer, &h), Some(ip("5.5.5.5")));
        // Shorter chain: the left-most entry.
        let three = ClientIpResolver::new(TrustedProxies::hops(9));
        assert_eq!(three.resolve(peer, &h), Some(ip("6.6.6.6")));
        assert_eq!(one.resolve(peer, &HeaderMap::new()), peer);
        // The entry a trusted hop reported is garbage: unknown.
        assert_eq!(one.resolve(peer, &xff(&["1.1.1.1, garbage"])), None);
        assert_eq!(
            one.resolve(peer, &xff(&["1.2.3.4:8080"])),
            Some(ip("1.2.3.4"))
        );
        assert_eq!(
            one.resolve(peer, &xff(&["[2001:db8::1]:80"])),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            one.resolve(peer, &xff(&["[2001:db8::1]"])),
            Some(ip("2001:db8::1"))
        );
        assert_eq!(
            one.resolve(peer, &xff(&["::ffff:1.2.3.4"])),
            Some(ip("1.2.3.4"))
        );
    }

    #[test]
    fn cidrs_walk_past_trusted_proxies_only() {
        let r = ClientIpResolver::new(TrustedProxies::cidrs(cidrs(&["10.0.0.0/8"])));
        let peer = Some(ip("10.0.0.1"));
        // Forged left-most values are never reached.
        let h = xff(&["127.0.0.1, 203.0.113.9, 10.1.1.1"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.9")));
        // An untrusted peer is the client, whatever the header says.
        assert_eq!(r.resolve(Some(ip("8.8.8.8")), &h), Some(ip("8.8.8.8")));
        // Everything trusted: the left-most.
        assert_eq!(r.resolve(peer, &xff(&["10.2.2.2"])), Some(ip("10.2.2.2")));
        // A trusted proxy said "unknown".
        assert_eq!(r.resolve(peer, &xff(&["1.1.1.1, unknown"])), None);
        // Many trusted entries beyond the window: unknown rather than guessed.
        let many = vec!["10.0.0.7"; 40].join(",");
        assert_eq!(r.resolve(peer, &xff(&[&format!("1.1.1.1,{many}")])), None);
        // A long forged prefix does not matter.
        let junk = vec!["1.1.1.1"; 100].join(",");
        assert_eq!(
            r.resolve(peer, &xff(&[&format!("{junk},203.0.113.1")])),
            Some(ip("203.0.113.1"))
        );
    }

    #[test]
    fn forwarded_rfc7239() {
        let r =
            ClientIpResolver::new(TrustedProxies::hops(1)).with_header(ForwardedHeader::Forwarded);
        let peer = Some(ip("10.0.0.1"));
        for (line, expected) in [
            (
                "for=192.0.2.60;proto=http;by=203.0.113.43",
                Some("192.0.2.60"),
            ),
            (
                "For=\"[2001:db8:cafe::17]:4711\"",
                Some("2001:db8:cafe::17"),
            ),
            ("for=\"192.0.2.43:47011\"", Some("192.0.2.43")),
            ("for=1.1.1.1, for=198.51.100.17", Some("198.51.100.17")),
            ("for=unknown", None),
            ("for=_hidden", None),
            ("proto=https", None),
            ("for=\"a,b;c\";proto=x, for=7.7.7.7", Some("7.7.7.7")),
            ("for=7.7.7.7, for=\"unterminated", None),
            ("for=1.1.1.1;for=2.2.2.2", None),
            ("for=\"1.1.1.1\\\"\"", None),
        ] {
            assert_eq!(r.resolve(peer, &fwd(&[line])), expected.map(ip), "{line}");
        }
        // X-Forwarded-For is not read when Forwarded is configured.
        assert_eq!(r.resolve(peer, &xff(&["1.1.1.1"])), peer);
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &forwarded_for(ip("10.0.0.1")));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.9"));
        append_forwarded_for(&mut h, &forwarded_for(ip("2001:db8::1")));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.9, 2001:db8::1");
        assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
        let longest = ip("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255");
        assert_eq!(forwarded_for(longest), longest.to_string().as_str());
    }

    #[test]
    fn forwarded_header_names() {
        assert_eq!(
            "X-Forwarded-For".parse::<ForwardedHeader>(),
            Ok(ForwardedHeader::XForwardedFor)
        );
        assert_eq!(
            "forwarded".parse::<ForwardedHeader>(),
            Ok(ForwardedHeader::Forwarded)
        );
        let e = "x-real-ip".parse::<ForwardedHeader>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "expected `x-forwarded-for` or `forwarded`, found \"x-real-ip\""
        );
        assert_eq!(ForwardedHeader::Forwarded.header_name(), FORWARDED);
    }

    #[test]
    fn garbage_never_panics() {
        let r =
            ClientIpResolver::new(TrustedProxies::hops(3)).with_header(ForwardedHeader::Forwarded);
        for line in [
            &b"\"\"\"\"\""[..],
            b",,,;;;===",
            b"for=",
            b"for=\"",
            b"\"",
            b"for=[",
            b"for=\"[::1]:\"",
        ] {
            let mut h = HeaderMap::new();
            h.insert(FORWARDED, http::HeaderValue::from_bytes(line).unwrap());
            assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), None, "{line:?}");
        }
    }
}
