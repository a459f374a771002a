//! Seed 002's JSON route header: decoding arbitrary values never panics, and re-encoding
//! what was decoded decodes to the same pins.
#![no_main]

use gray_core::{Carriers, Stain, codec::RouteHeader};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let carriers = Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-gray-info", value);
    // No carrier reads as baseline here (a baseline stain writes none).
    let stain = carriers.extract(&headers).unwrap_or_else(Stain::baseline);
    let mut out = HeaderMap::new();
    carriers.inject(&stain, &mut out);
    assert_eq!(carriers.extract(&out).unwrap_or_else(Stain::baseline), stain);
});
