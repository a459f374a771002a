//! Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so a proxy removes
//! them, together with every header the `Connection` header names, in both directions.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName, HeaderValue, header, header::Entry};

const HOP_BY_HOP: [HeaderName; 9] = [
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
fn is_hop_by_hop(name: &HeaderName) -> bool {
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

/// Removes the hop-by-hop headers from `headers`. `Upgrade` goes too: this gateway does not
/// tunnel upgraded connections. Most messages carry none, which one pass over the names
/// finds without hashing.
pub fn strip(headers: &mut HeaderMap) {
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The peer's address as an `X-Forwarded-For` value, made once per connection.
pub fn forwarded_for(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_string())
        .unwrap_or_else(|_| unreachable!("an IP address is a valid header value"))
}

/// Appends the peer's address (`peer`, from [`forwarded_for`]) to `X-Forwarded-For`, as a
/// proxy does for the next hop.
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue) {
    match headers.entry(X_FORWARDED_FOR) {
        Entry::Vacant(entry) => {
            entry.insert(peer.clone());
        }
        Entry::Occupied(mut entry) => {
            let mut value = Vec::new();
            for previous in entry.iter() {
                value.extend_from_slice(previous.as_bytes());
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(peer.as_bytes());
            // Replaces every previous value with the joined one.
            if let Ok(value) = HeaderValue::from_bytes(&value) {
                entry.insert(value);
            }
        }
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &forwarded_for("10.0.0.1".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
        append_forwarded_for(&mut h, &forwarded_for("10.0.0.2".parse().unwrap()));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.9, 10.0.0.2");
    }

    #[test]
    fn strips_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
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
}
