//! The W3C `baggage` member carrier: decoding, stripping and re-injecting arbitrary header
//! lines never panics; after a strip the stain is gone, after an inject it reads back.
#![no_main]

use gray_core::{Carriers, codec::BaggageMember};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let carriers = Carriers::new().with(BaggageMember::new("gray.lane").expect("key"));
    let mut headers = HeaderMap::new();
    // Several `baggage` lines, separated by 0xFF.
    for line in data.split(|&b| b == 0xFF).take(8) {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            headers.append("baggage", v);
        }
    }
    let ctx = carriers.extract(&headers).unwrap_or_default();
    let mut out = headers.clone();
    carriers.strip(&mut out);
    assert!(!carriers.is_present(&out));
    carriers.inject(&ctx, &mut out);
    assert_eq!(carriers.extract(&out).unwrap_or_default(), ctx);
});
