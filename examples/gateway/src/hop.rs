//! Hop-by-hop headers (RFC 9110 §7.6.1): they describe one connection, so a proxy removes
//! them, together with every header the `Connection` header names, in both directions.

use http::{HeaderMap, HeaderName, header};

const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes the hop-by-hop headers from `headers`. `Upgrade` goes too: this gateway does not
/// tunnel upgraded connections.
pub fn strip(headers: &mut HeaderMap) {
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
    headers.remove(header::UPGRADE);
}

/// Appends the peer's address to `X-Forwarded-For`, as a proxy does for the next hop.
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: std::net::IpAddr) {
    let previous: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let value = if previous.is_empty() {
        peer.to_string()
    } else {
        format!("{}, {peer}", previous.join(", "))
    };
    if let Ok(value) = http::HeaderValue::from_str(&value) {
        headers.insert("x-forwarded-for", value);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, "10.0.0.1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
        append_forwarded_for(&mut h, "10.0.0.2".parse().unwrap());
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
}
