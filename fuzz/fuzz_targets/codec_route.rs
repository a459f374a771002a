//! Seed 002's JSON route header: decoding arbitrary values never panics, and re-encoding
//! what was decoded decodes to the same pins.
#![no_main]

use gray_core::{Carriers, codec::RouteHeader};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let carriers = Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-gray-info", value);
    let ctx = carriers.extract(&headers).unwrap_or_default();
    let mut out = HeaderMap::new();
    carriers.inject(&ctx, &mut out);
    assert_eq!(carriers.extract(&out).unwrap_or_default(), ctx);
});
