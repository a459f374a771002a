//! `X-Forwarded-For` and RFC 7239 `Forwarded` through trusted hops or proxy CIDRs: never
//! panics, and a resolved client IP is the peer or an address written in the header.
#![no_main]

use std::net::IpAddr;

use gray_rules::CidrList;
use gray_tower::edge::{ClientIpResolver, ForwardedHeader, TrustedProxies};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let rfc = control & 1 == 1;
    let hops = usize::from(control >> 1);
    let (name, header) = if rfc {
        ("forwarded", ForwardedHeader::Forwarded)
    } else {
        ("x-forwarded-for", ForwardedHeader::XForwardedFor)
    };
    let mut headers = HeaderMap::new();
    for line in rest.split(|&b| b == 0xFF).take(4) {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append(name, v);
        }
    }
    let peer: IpAddr = [10, 0, 0, 1].into();
    let proxies = CidrList::parse(["10.0.0.0/8", "0.0.0.0/2", "2001:db8::/32"]).expect("cidrs");
    for resolver in [
        ClientIpResolver::new(TrustedProxies::hops(hops)).with_header(header),
        ClientIpResolver::new(TrustedProxies::cidrs(proxies)).with_header(header),
    ] {
        if let Some(ip) = resolver.resolve(Some(peer), &headers) {
            if ip != peer {
                // The address came from the header: some line must hold its digits.
                let text = String::from_utf8_lossy(rest).to_ascii_lowercase();
                let from_header = match ip {
                    // Dotted in the header, or IPv4-mapped IPv6 in hex (`::ffff:0102:0304`).
                    IpAddr::V4(v4) => text.contains(&v4.to_string()) || text.contains("ffff"),
                    // Any IPv6 literal (including `::1.2.3.4`) is written with colons.
                    IpAddr::V6(_) => text.contains(':'),
                };
                assert!(from_header, "{ip} not in {text:?}");
            }
        }
    }
});
