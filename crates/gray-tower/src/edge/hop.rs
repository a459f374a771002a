//! Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so a proxy removes
//! them, together with every header the `Connection` header names, in both directions.
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
/// `keep-alive` and `proxy-connection`).
pub const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
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
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Removes the hop-by-hop headers from `headers`, and every header a `Connection` header
/// names. `Upgrade` goes too: a proxy that tunnels upgraded connections handles them before
/// calling this.
pub fn strip(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
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
