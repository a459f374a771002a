//! Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so a proxy removes
//! them, together with every header the `Connection` header names, in both directions.
//!
//! Two exceptions keep trailers working end to end through an HTTP/1.1 hop: `Trailer`
//! (which fields the trailers will hold) is end-to-end and kept, and a `TE` that asks for
//! trailers is replaced by a bare `TE: trailers`, what a proxy that relays trailers (as
//! every hyper-based one does) says on the next hop. hyper's HTTP/1.1 server sends a
//! response's trailers only to a client that sent `TE: trailers`, and its client encodes
//! a request's trailers only when `Trailer` names them.
//!
//! [`EdgeLayer`](super::EdgeLayer) calls [`strip`] on every request **before** it reads,
//! decides and writes the stain (see [`EdgeLayer::with_hop_by_hop`](super::EdgeLayer::with_hop_by_hop)),
//! so a client's `Connection: x-gray-lane` removes the client's own `x-gray-lane`, never
//! the one the edge writes. A proxy calls it on the responses it relays.
//!
//! Most messages carry no hop-by-hop header, which one pass over the names finds without
//! hashing; only then is anything removed.
//!
//! ```
//! use gray_tower::edge::hop;
//! use http::{HeaderMap, HeaderValue};
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("connection", HeaderValue::from_static("keep-alive, x-gray-lane"));
//! headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
//! headers.insert("x-gray-lane", HeaderValue::from_static("forged"));
//! headers.insert("content-type", HeaderValue::from_static("text/plain"));
//! hop::strip(&mut headers);
//! assert_eq!(headers.len(), 1);
//! assert_eq!(headers["content-type"], "text/plain");
//! ```

use http::{HeaderMap, HeaderName, header};

/// The headers that are hop-by-hop by themselves (RFC 9110 §7.6.1, plus the non-standard
/// `keep-alive` and `proxy-connection`, and `proxy-authenticate` and
/// `proxy-authorization`, which address the proxy). `Trailer` is not one of them: it is
/// end-to-end.
pub const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is hop-by-hop by itself (not counting the names `Connection` lists).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    // The same names as `HOP_BY_HOP`, matched by length and bytes, without hashing.
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Removes the hop-by-hop headers from `headers`, and every header a `Connection` header
/// names. `Upgrade` goes too: a proxy that tunnels upgraded connections handles them before
/// calling this.
///
/// A `TE` that lists `trailers` leaves a `TE: trailers` behind (see the [module
/// docs](self)); `Connection` naming `TE` removes it as usual first.
pub fn strip(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let trailers = headers
        .get_all(header::TE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|t| {
            t.trim_ascii()
                .split(|&b| b == b';')
                .next()
                .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
        });
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .filter_map(|name| HeaderName::from_bytes(name.trim_ascii()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, http::HeaderValue::from_static("trailers"));
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, X-Secret ,,"),
        );
        h.append("connection", HeaderValue::from_static("x-other"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-gray-lane", HeaderValue::from_static("gray"));
        strip(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-gray-lane"], "gray");
    }

    #[test]
    fn every_listed_name_is_recognised_alone() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name), "{name}");
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            h.insert("x-kept", HeaderValue::from_static("1"));
            strip(&mut h);
            assert_eq!(h.len(), 1, "{name} was not stripped");
        }
        let mut h = HeaderMap::new();
        h.insert("content-length", HeaderValue::from_static("3"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip(&mut h);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn trailers_survive_the_hop() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("TE, keep-alive"));
        h.insert("te", HeaderValue::from_static("gzip;q=0.5, Trailers"));
        h.insert("trailer", HeaderValue::from_static("x-checksum"));
        strip(&mut h);
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["trailer"], "x-checksum");
        let mut h = HeaderMap::new();
        h.insert("te", HeaderValue::from_static("gzip"));
        strip(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn garbage_in_connection_is_skipped() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_bytes(b"\xff\xfe, a b, x-gone").unwrap(),
        );
        h.insert("x-gone", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }
}
