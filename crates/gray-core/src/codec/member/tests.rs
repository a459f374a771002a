//! Tests of the `baggage` carrier.

use super::*;
use crate::{
    Carriers,
    w3c::grammar::{Scan, is_token_byte, is_value_byte, trim_ows},
};

fn carriers() -> Carriers {
    Carriers::new().with(BaggageMember::default())
}

fn headers(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(&BAGGAGE, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn lane(name: &str) -> Lane {
    Lane::new(name).unwrap()
}

#[test]
fn reads_across_lines_and_skips_malformed_members() {
    let h = headers(&["a=1,=x,b", "c=%20;prop, gray.lane = canary-2 ;p=1"]);
    let stain = carriers().extract(&h).unwrap();
    assert_eq!(stain.lane().unwrap(), "canary-2");
    assert_eq!(stain.baggage().unwrap().as_str(), "a=1,c=%20;prop");
    let h = headers(&["gray.lane=c%61nary"]);
    let stain = carriers().extract(&h).unwrap();
    assert_eq!(stain.lane().unwrap(), "canary");
    assert_eq!(stain.baggage(), None);
    // Lanes are case-insensitive on the wire too.
    let h = headers(&["gray.lane=Canary"]);
    assert_eq!(carriers().extract(&h).unwrap().lane().unwrap(), "canary");
}

#[test]
fn a_duplicated_member_is_read_as_its_first_one() {
    let lane_of = |values: &[&str]| {
        let stain = carriers().extract(&headers(values)).unwrap();
        stain.lane().map(ToString::to_string)
    };
    assert_eq!(lane_of(&["gray.lane=a,gray.lane=b"]).as_deref(), Some("a"));
    assert_eq!(
        lane_of(&["gray.lane=a", "gray.lane=b"]).as_deref(),
        Some("a")
    );
    assert_eq!(
        lane_of(&["x=1,gray.lane=a,gray.lane=a"]).as_deref(),
        Some("a")
    );
    // The first one decides even when it is bad and a later one is good.
    assert_eq!(lane_of(&["gray.lane=%%,gray.lane=b"]), None);
    // Members are read after the malformed ones are skipped.
    assert_eq!(lane_of(&["gray.lane,gray.lane=b"]).as_deref(), Some("b"));
}

#[test]
fn a_bad_member_is_unstained() {
    let unstained = |values: &[&str]| {
        let stain = carriers().extract(&headers(values));
        stain.is_some_and(|c| c.is_baseline())
    };
    assert!(unstained(&["gray.lane=a%2"]));
    assert!(unstained(&["gray.lane=%%"]));
    assert!(unstained(&["gray.lane="]));
    assert!(unstained(&["gray.lane=a%20b"]));
    let huge = format!("k={}", "v".repeat(W3C_MIN_BYTES));
    assert!(unstained(&[&huge, "gray.lane=a"]));
    assert_eq!(carriers().extract(&headers(&["other=1"])), None);
}

#[test]
fn inherited_members_are_kept_byte_for_byte() {
    let h = headers(&[
        "userId=42;ttl=5, name=J%C3%BCrgen;p ,gray.lane=gray",
        "bad member,k=v;a=1;b",
    ]);
    let stain = carriers().extract(&h).unwrap();
    let baggage = stain.baggage().unwrap();
    assert_eq!(
        baggage.as_str(),
        "userId=42;ttl=5,name=J%C3%BCrgen;p,k=v;a=1;b"
    );
    assert_eq!(baggage.len(), 3);
    assert_eq!(baggage.get("userId"), Some("42"));
    assert_eq!(baggage.get("gray.lane"), None);
    assert_eq!(
        format!("{baggage:?}"),
        r#"InheritedBaggage(keys: ["userId", "name", "k"])"#
    );

    // Members of the stain's other baggage carriers are not inherited.
    let two = carriers().with(BaggageMember::new("gray.other").unwrap());
    let h = headers(&["a=1,gray.other=x,gray.lane=b"]);
    assert_eq!(two.extract(&h).unwrap().baggage().unwrap().as_str(), "a=1");
}

#[test]
fn a_request_without_members_besides_ours_inherits_nothing() {
    let stain = carriers().extract(&headers(&["gray.lane=gray"])).unwrap();
    assert_eq!(stain.baggage(), None);
    let default = Stain::in_lane(lane("own"));
    assert_eq!(carriers().extract_or(&HeaderMap::new(), &default), default);
    // Without the stain's member, the default decides and the members still travel.
    let stain = carriers().extract_or(&headers(&["userId=42"]), &default);
    assert_eq!(stain.lane().unwrap(), "own");
    assert_eq!(stain.baggage().unwrap().as_str(), "userId=42");
}

#[test]
fn writing_merges_outbound_inherited_and_ours() {
    let c = carriers();
    let inbound = headers(&["userId=42;ttl=5,tenant=acme,gray.lane=gray"]);
    let stain = c.extract(&inbound).unwrap();

    // No baggage on the outbound request: the inherited members, then ours.
    let mut out = HeaderMap::new();
    c.inject(&stain, &mut out);
    assert_eq!(out["baggage"], "userId=42;ttl=5,tenant=acme,gray.lane=gray");

    // Members the outbound request has win; stale, duplicated and malformed copies of
    // ours go.
    let mut out = headers(&["tenant=other,gray.lane=blue", "gray.lane=%%,gray.lane=gray"]);
    c.inject(&stain, &mut out);
    assert_eq!(
        out["baggage"],
        "tenant=other,userId=42;ttl=5,gray.lane=gray"
    );
    assert_eq!(out.get_all("baggage").iter().count(), 1);

    // A baseline decision removes ours and still carries the members.
    let mut out = headers(&["gray.lane=gray"]);
    c.inject(
        &Stain::baseline().with_baggage(stain.baggage().cloned()),
        &mut out,
    );
    assert_eq!(out["baggage"], "userId=42;ttl=5,tenant=acme");

    // Members built by hand may name the stain's key: the decision still wins.
    let by_hand = InheritedBaggage::parse("a=1,gray.lane=blue,b=gray.lane").unwrap();
    let mut out = HeaderMap::new();
    c.inject(
        &Stain::in_lane(lane("gray")).with_baggage(Some(by_hand)),
        &mut out,
    );
    assert_eq!(out["baggage"], "a=1,b=gray.lane,gray.lane=gray");
    let by_hand = InheritedBaggage::parse("a=1,b=gray.lane").unwrap();
    let mut out = HeaderMap::new();
    c.inject(&Stain::baseline().with_baggage(Some(by_hand)), &mut out);
    assert_eq!(out["baggage"], "a=1,b=gray.lane");

    // The opt-in that keeps a pre-set stain still merges the members.
    let mut out = headers(&["gray.lane=blue"]);
    c.merge_baggage(&stain, &mut out);
    assert_eq!(out["baggage"], "gray.lane=blue,userId=42;ttl=5,tenant=acme");
}

#[test]
fn rewrite_keeps_other_members_and_removes_ours_for_baseline() {
    let c = carriers();
    let mut h = headers(&["userId=42;p=1", "gray.lane=old,tenant=acme"]);
    c.inject(&Stain::in_lane(lane("new")), &mut h);
    assert_eq!(h["baggage"], "userId=42;p=1,tenant=acme,gray.lane=new");
    c.inject(&Stain::baseline(), &mut h);
    assert_eq!(h["baggage"], "userId=42;p=1,tenant=acme");
    let mut only = headers(&["gray.lane=x"]);
    c.strip(&mut only);
    assert!(only.get("baggage").is_none());
    let mut untouched = headers(&["a=1, ,=broken"]);
    c.inject(&Stain::baseline(), &mut untouched);
    assert_eq!(untouched["baggage"], "a=1, ,=broken");
}

/// The member grammar, written plainly: the one-pass scanner must agree with it.
fn parse_plainly(raw: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let text = trim_ows(raw);
    let kv_end = text.iter().position(|&b| b == b';').unwrap_or(text.len());
    let kv = &text[..kv_end];
    let eq = kv.iter().position(|&b| b == b'=')?;
    let key = trim_ows(&kv[..eq]);
    let value = trim_ows(&kv[eq + 1..]);
    let props_ok = text[kv_end..]
        .iter()
        .all(|&b| is_value_byte(b) || matches!(b, b';' | b' ' | b'\t'));
    let ok = !key.is_empty()
        && key.iter().copied().all(is_token_byte)
        && value.iter().copied().all(is_value_byte)
        && props_ok;
    ok.then_some((text, key, value))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

    #[test]
    fn the_one_pass_scanner_agrees_with_the_grammar(
        line in proptest::collection::vec(
            proptest::sample::select(&b"ab.=%;, \t\"\\\x80"[..]),
            0..24,
        )
    ) {
        let scanned: Vec<_> = Scan::new(&line)
            .map(|m| m.map(|m| (m.text, m.key, m.value)))
            .collect();
        let split: Vec<_> = line
            .split(|&b| b == b',')
            .filter(|raw| !trim_ows(raw).is_empty())
            .map(|raw| parse_plainly(raw).ok_or(trim_ows(raw)))
            .collect();
        proptest::prop_assert_eq!(scanned, split);
    }
}

#[test]
fn a_lane_member_is_encoded_once() {
    let c = BaggageMember::default();
    let gray = lane("gray");
    let first = c.member_value(&gray).unwrap();
    assert_eq!(first, "gray.lane=gray");
    assert_eq!(c.encoded.0.load().len(), 1);
    assert_eq!(c.member_value(&gray).unwrap(), first);
    assert_eq!(c.encoded.0.load().len(), 1);
}

#[test]
fn propagates_at_least_the_w3c_minimum() {
    let c = carriers();
    let many: Vec<String> = (0..W3C_MIN_MEMBERS).map(|i| format!("k{i}=v{i}")).collect();
    let stain = c.extract_or(&headers(&[&many.join(",")]), &Stain::baseline());
    assert_eq!(stain.baggage().unwrap().len(), W3C_MIN_MEMBERS);
    let mut h = HeaderMap::new();
    c.inject(&stain.clone().with_lane(Some(lane("gray"))), &mut h);
    let out = h["baggage"].to_str().unwrap();
    assert_eq!(out.split(',').count(), W3C_MIN_MEMBERS + 1);
    assert!(out.ends_with(",gray.lane=gray"));

    // 8192 bytes with our member: all of it travels.
    let ours = ",gray.lane=gray".len();
    let filler = W3C_MIN_BYTES - ours - "k=".len();
    let exact = format!("k={}", "x".repeat(filler));
    let stain = c.extract_or(&headers(&[&exact]), &Stain::baseline());
    let mut h = HeaderMap::new();
    c.inject(&stain.with_lane(Some(lane("gray"))), &mut h);
    assert_eq!(h["baggage"].len(), W3C_MIN_BYTES);

    // Members beyond the byte cap are dropped whole; ours always stays.
    let big: Vec<String> = (0..100)
        .map(|i| format!("k{i}={}", "x".repeat(100)))
        .collect();
    let mut h = headers(&[&big.join(",")]);
    c.inject(&Stain::in_lane(lane("gray")), &mut h);
    let out = h["baggage"].to_str().unwrap();
    assert!(out.len() <= W3C_MIN_BYTES, "{}", out.len());
    assert!(out.ends_with(",gray.lane=gray"));
    assert!(
        out.split(',')
            .all(|m| m.starts_with('k') && m.len() > 100 || m == "gray.lane=gray")
    );
}

/// Spellings of `gray.lane` that lenient decoders (OpenTelemetry Python's `unquote_plus`
/// and `strip`, .NET's case-insensitive keys) read as the key itself.
const SPELLINGS: [&str; 10] = [
    "gray%2Elane",
    "gray%2elane",
    "%67ray.lane",
    "Gray.Lane",
    "GRAY.LANE",
    "gray.lane+",
    "+gray.lane",
    "gray.lane%20",
    "%09gray.lane",
    "gray%252Elane",
];

#[test]
fn every_spelling_of_the_key_is_the_stain_member() {
    for key in SPELLINGS {
        // Read as the stain, never inherited.
        let h = headers(&[&format!("userId=42,{key}=gray")]);
        let stain = carriers().extract(&h).unwrap();
        assert_eq!(stain.lane().unwrap(), "gray", "{key}");
        assert_eq!(stain.baggage().unwrap().as_str(), "userId=42", "{key}");
        assert!(carriers().is_present(&h), "{key}");

        // Removed, the other members kept.
        let mut h = headers(&[&format!("{key}=gray,userId=42"), "tenant=acme"]);
        carriers().strip(&mut h);
        assert_eq!(h["baggage"], "userId=42,tenant=acme", "{key}");

        // Replaced by the decision.
        let mut h = headers(&[&format!("{key}=gray,userId=42")]);
        carriers().inject(&Stain::in_lane(lane("blue")), &mut h);
        assert_eq!(h["baggage"], "userId=42,gray.lane=blue", "{key}");
        let mut h = headers(&[&format!("{key}=gray,userId=42")]);
        carriers().inject(&Stain::baseline(), &mut h);
        assert_eq!(h["baggage"], "userId=42", "{key}");
    }
}

#[test]
fn a_malformed_member_under_the_key_is_a_bad_stain_and_is_removed() {
    // Bytes gray's grammar refuses, but a decoder reading Latin-1 and trimming (a WSGI
    // server and an older OpenTelemetry Python) reads as `gray.lane=gray`.
    let mut h = HeaderMap::new();
    h.append(
        &BAGGAGE,
        HeaderValue::from_bytes(b"gray.lane\xa0=gray,userId=42").unwrap(),
    );
    let mut rejected = Vec::new();
    let stain = carriers().extract_with(&h, |r| rejected.push(r.reason().to_string()));
    assert_eq!(stain.unwrap().lane(), None);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(carriers().is_present(&h));
    carriers().strip(&mut h);
    assert_eq!(h["baggage"], "userId=42");

    // Members without `=` are no member to anyone: left alone.
    let h = headers(&["gray.lane,userId=42"]);
    assert!(!carriers().is_present(&h));
}

#[test]
fn inherited_members_never_carry_a_spelling_of_the_key() {
    for key in SPELLINGS {
        let inherited = InheritedBaggage::parse(&format!("userId=42,{key}=gray")).unwrap();
        let stain = Stain::baseline().with_baggage(Some(inherited));
        let mut h = HeaderMap::new();
        carriers().inject(&stain, &mut h);
        assert_eq!(h["baggage"], "userId=42", "{key}");
    }
}
