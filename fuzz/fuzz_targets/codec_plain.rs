//! Plain header carriers (flag, lane, version): decoding arbitrary values never panics,
//! and re-encoding what was decoded decodes to the same stain.
#![no_main]

use gray_core::{Carriers, Lane, Stain, codec::PlainHeader};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let carriers = Carriers::new()
        .with(PlainHeader::flag(
            HeaderName::from_static("gray"),
            Lane::new("gray").expect("lane"),
        ))
        .with(PlainHeader::lane(HeaderName::from_static("x-gray-lane")))
        .with(PlainHeader::version(HeaderName::from_static("version")));
    let mut headers = HeaderMap::new();
    // Split the input into up to three values, one per header (0xFF separates).
    for (name, value) in ["gray", "x-gray-lane", "version"]
        .iter()
        .zip(data.split(|&b| b == 0xFF))
    {
        if let Ok(v) = HeaderValue::from_bytes(value) {
            headers.append(*name, v);
        }
    }
    // No carrier reads as baseline here (a baseline stain writes none).
    let stain = carriers.extract(&headers).unwrap_or_else(Stain::baseline);
    let mut out = HeaderMap::new();
    carriers.inject(&stain, &mut out);
    assert_eq!(carriers.extract(&out).unwrap_or_else(Stain::baseline), stain);
});
