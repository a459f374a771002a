//! A borrowed view of the request parts that rules look at.

use std::{borrow::Cow, net::IpAddr};

use http::{HeaderMap, HeaderName, HeaderValue, Uri, header::COOKIE};

use crate::path::hex;

/// What rules see of a request: path, query, headers and the client IP, all borrowed.
///
/// Building one copies nothing; evaluation reads the parts in place.
///
/// ```
/// use gray_rules::RequestView;
/// use http::Request;
///
/// let req = Request::builder()
///     .uri("/v1/users?uid=42")
///     .header("cookie", "a=1; uid=7")
///     .body(())
///     .unwrap();
/// let view = RequestView::from_request(&req).with_client_ip(Some([10, 0, 0, 1].into()));
/// assert_eq!(view.path(), "/v1/users");
/// assert_eq!(view.query_param("uid").as_deref(), Some(&b"42"[..]));
/// assert_eq!(view.cookie("uid"), Some(&b"7"[..]));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a HeaderMap,
    client_ip: Option<IpAddr>,
}

impl<'a> RequestView<'a> {
    /// A view of `uri` and `headers`, without a client IP.
    pub fn new(uri: &'a Uri, headers: &'a HeaderMap) -> Self {
        RequestView {
            path: uri.path(),
            query: uri.query(),
            headers,
            client_ip: None,
        }
    }

    /// A view of `req`, without a client IP.
    pub fn from_request<B>(req: &'a http::Request<B>) -> Self {
        Self::new(req.uri(), req.headers())
    }

    /// A view from raw parts: `path` (without query), `query` (without `?`) and headers.
    #[must_use]
    pub fn from_parts(path: &'a str, query: Option<&'a str>, headers: &'a HeaderMap) -> Self {
        RequestView {
            path,
            query,
            headers,
            client_ip: None,
        }
    }

    /// Sets the client IP that `ip` conditions and `client_ip` keys read.
    #[must_use]
    pub fn with_client_ip(mut self, ip: Option<IpAddr>) -> Self {
        self.client_ip = ip.map(canonical_ip);
        self
    }

    /// The path, as the request URI holds it. Behind gray-tower's edge layer that is the
    /// normalised path ([`crate::path::normalize`]), the one the upstream receives.
    #[must_use]
    pub fn path(&self) -> &'a str {
        self.path
    }

    /// The raw query string, without `?`.
    #[must_use]
    pub fn query(&self) -> Option<&'a str> {
        self.query
    }

    /// The headers.
    #[must_use]
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The client IP, IPv4-mapped IPv6 addresses turned into IPv4.
    #[must_use]
    pub fn client_ip(&self) -> Option<IpAddr> {
        self.client_ip
    }

    /// The first value of header `name`: a header that appears more than once is read as
    /// its first value, as the seeds' `request.getHeader` does.
    pub fn header(&self, name: &HeaderName) -> Option<&'a [u8]> {
        self.headers.get(name).map(HeaderValue::as_bytes)
    }

    /// The first value of cookie `name`, unquoted, across every `cookie` header line.
    #[must_use]
    pub fn cookie(&self, name: &str) -> Option<&'a [u8]> {
        self.cookies(name).next()
    }

    /// Every value of cookie `name`, in order (rules read only the first).
    pub fn cookies<'n>(&self, name: &'n str) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        let name = name.as_bytes();
        self.headers
            .get_all(COOKIE)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
            .filter_map(move |pair| {
                let pair = trim(pair);
                let eq = pair.iter().position(|&b| b == b'=')?;
                (trim(&pair[..eq]) == name).then(|| unquote(trim(&pair[eq + 1..])))
            })
    }

    /// The first value of query parameter `name`, percent-decoded (borrowed when the raw
    /// value needs no decoding). A parameter without `=` has an empty value.
    #[must_use]
    pub fn query_param(&self, name: &str) -> Option<Cow<'a, [u8]>> {
        self.query_params(name)
            .next()
            .map(|raw| percent_decode(raw))
    }

    /// Every raw (still percent-encoded) value of query parameter `name`.
    pub(crate) fn query_params<'n>(
        &self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a [u8]> + use<'a, 'n> {
        self.query
            .unwrap_or("")
            .as_bytes()
            .split(|&b| b == b'&')
            .filter_map(move |pair| {
                if pair.is_empty() {
                    return None;
                }
                let (k, v) = match pair.iter().position(|&b| b == b'=') {
                    Some(eq) => (&pair[..eq], &pair[eq + 1..]),
                    None => (pair, &b""[..]),
                };
                decoded_eq(k, name.as_bytes(), false).then_some(v)
            })
    }
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`) → IPv4, so whitelists need only one form.
#[must_use]
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        IpAddr::V4(v4) => IpAddr::V4(v4),
    }
}

fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

fn unquote(s: &[u8]) -> &[u8] {
    if s.len() >= 2 && s[0] == b'"' && s[s.len() - 1] == b'"' {
        &s[1..s.len() - 1]
    } else {
        s
    }
}

/// Decodes one byte at `raw[i]` (`+` → space, `%XX` → byte, a bad `%` stays literal).
/// Returns the byte and how many raw bytes it took.
fn decode_at(raw: &[u8], i: usize) -> (u8, usize) {
    match raw[i] {
        b'+' => (b' ', 1),
        b'%' => match (
            raw.get(i + 1).and_then(|&b| hex(b)),
            raw.get(i + 2).and_then(|&b| hex(b)),
        ) {
            (Some(h), Some(l)) => ((h << 4) | l, 3),
            _ => (b'%', 1),
        },
        b => (b, 1),
    }
}

/// An iterator over the percent-decoded bytes of `raw`.
pub(crate) fn decoded(raw: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= raw.len() {
            return None;
        }
        let (b, n) = decode_at(raw, i);
        i += n;
        Some(b)
    })
}

/// Percent-decodes `raw` (query form: `+` is a space), borrowing when nothing changes.
#[must_use]
pub fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw);
    }
    Cow::Owned(decoded(raw).collect())
}

/// `decode(raw) == expected` without allocating.
pub(crate) fn decoded_eq(raw: &[u8], expected: &[u8], ignore_case: bool) -> bool {
    let mut it = decoded(raw);
    for &e in expected {
        match it.next() {
            Some(b) if eq_byte(b, e, ignore_case) => {}
            _ => return false,
        }
    }
    it.next().is_none()
}

/// `decode(raw).starts_with(prefix)` without allocating.
pub(crate) fn decoded_starts_with(raw: &[u8], prefix: &[u8], ignore_case: bool) -> bool {
    let mut it = decoded(raw);
    prefix
        .iter()
        .all(|&e| matches!(it.next(), Some(b) if eq_byte(b, e, ignore_case)))
}

fn eq_byte(a: u8, b: u8, ignore_case: bool) -> bool {
    if ignore_case {
        a.eq_ignore_ascii_case(&b)
    } else {
        a == b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(&*percent_decode(b"a%20b+c"), b"a b c");
        assert_eq!(&*percent_decode(b"100%"), b"100%");
        assert_eq!(&*percent_decode(b"%zz%4"), b"%zz%4");
        assert!(decoded_eq(b"al%69ce", b"alice", false));
        assert!(decoded_eq(b"AL%49CE", b"alice", true));
        assert!(!decoded_eq(b"alice2", b"alice", false));
        assert!(!decoded_eq(b"alic", b"alice", false));
        assert!(decoded_starts_with(b"%2Fapi%2Fx", b"/api/", false));
        assert!(!decoded_starts_with(b"/a", b"/api", false));
    }

    #[test]
    fn query_params_and_cookies() {
        let uri: Uri = "/p?a=1&&b&%75id=x%2By&uid=second".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, "x=1; uid=\"q\"".parse().unwrap());
        headers.append(COOKIE, "uid=r;broken; =v".parse().unwrap());
        let view = RequestView::new(&uri, &headers);
        assert_eq!(view.query_param("a").as_deref(), Some(&b"1"[..]));
        assert_eq!(view.query_param("b").as_deref(), Some(&b""[..]));
        assert_eq!(view.query_param("uid").as_deref(), Some(&b"x+y"[..]));
        assert_eq!(view.query_param("zz"), None);
        assert_eq!(view.cookies("uid").collect::<Vec<_>>(), [&b"q"[..], b"r"]);
        assert_eq!(view.cookie("broken"), None);
    }

    #[test]
    fn mapped_addresses_become_v4() {
        let ip: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(canonical_ip(ip), IpAddr::from([10, 1, 2, 3]));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical_ip(v6), v6);
    }
}
