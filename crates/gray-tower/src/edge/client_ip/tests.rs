//! Tests of the client IP resolution.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn cidrs(list: &[&str]) -> CidrList {
    list.iter()
        .map(|s| s.parse::<gray_rules::Cidr>().unwrap())
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
    let r = ClientIpResolver::new(TrustedProxies::hops(1)).with_header(ForwardedHeader::Forwarded);
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
    let r = ClientIpResolver::new(TrustedProxies::hops(3)).with_header(ForwardedHeader::Forwarded);
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
