//! The W3C `baggage` member carrier: decoding, stripping and re-injecting arbitrary header
//! lines never panics; after a strip the stain is gone, after an inject it reads back.
#![no_main]

use gray_core::{Carriers, Stain, codec::BaggageMember};
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
    // `extract_or`: a request whose other members travel without a stain member keeps them.
    let stain = carriers.extract_or(&headers, &Stain::baseline());
    let mut out = headers.clone();
    carriers.strip(&mut out);
    assert!(!carriers.is_present(&out));
    carriers.inject(&stain, &mut out);
    let back = carriers.extract_or(&out, &Stain::baseline());
    assert_eq!(
        back.clone().with_baggage(None),
        stain.clone().with_baggage(None)
    );
    // The other members read back in order; at the member cap, the stain's own member takes
    // the place of the last one (members are dropped whole, from the end, never ours).
    let members = |s: &Stain| -> Vec<String> {
        s.baggage()
            .into_iter()
            .flat_map(|b| b.iter())
            .map(str::to_owned)
            .collect()
    };
    let (sent, read) = (members(&stain), members(&back));
    assert!(
        sent.starts_with(&read),
        "{read:?} is not a prefix of {sent:?}"
    );
    assert!(
        sent.len() - read.len() <= 1,
        "{} of {} members lost",
        sent.len() - read.len(),
        sent.len()
    );
});
