//! Property tests of the rule model: sticky percentages are monotone; the parsers and
//! header codecs never panic on arbitrary input (a bounded smoke of the fuzz targets), a
//! parse error always says where in the text, consistently, and any rule name reads back
//! exactly and is what errors name.

use gray_core::{
    Carriers, Lane, Pins, Stain, Version,
    codec::{BaggageMember, PlainHeader, RouteHeader},
};
use gray_rules::{Format, RequestView, RuleSet};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use proptest::prelude::*;

fn sticky_rules(basis_points: u32, salt: &str) -> RuleSet {
    let percent = f64::from(basis_points) / 100.0;
    let text = format!(
        r#"{{"rules":[{{"name":"pct","when":{{"sticky":{{"by":{{"header":"x-user-id"}},"percent":{percent},"salt":{salt:?}}}}},"lane":"gray"}}]}}"#
    );
    RuleSet::parse(&text, Format::Json, "prop").expect("valid sticky rule")
}

fn in_gray(rules: &RuleSet, user: &HeaderValue) -> bool {
    let uri = Uri::from_static("/");
    let mut headers = HeaderMap::new();
    headers.insert("x-user-id", user.clone());
    rules.evaluate(&RequestView::new(&uri, &headers)).is_some()
}

/// A valid rule set, one field a line, for the near-valid documents.
const TOML: &str = r#"enabled = true
[[rules]]
name = "testers"
lane = "gray"
[rules.when]
header = { name = "x-tester", exact = "1" }
[[rules]]
name = "canary path"
when = { path = { prefix = "/canary" } }
lane = "canary"
[[rules]]
name = "split"
split = [{ weight = 1, lane = "b" }, { weight = 3 }]
"#;

/// The lines of `text` as `format` counts them: JSON and TOML break at `\n`; YAML also at
/// `\r` (`\r\n` is one break), NEL, and the Unicode line and paragraph separators.
fn lines_of(text: &str, format: Format) -> Vec<&str> {
    if format != Format::Yaml {
        return text.split('\n').collect();
    }
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}') {
            lines.push(&text[start..i]);
            if c == '\r' && chars.peek().is_some_and(|&(_, next)| next == '\n') {
                chars.next();
            }
            start = chars.peek().map_or(text.len(), |&(j, _)| j);
        }
    }
    lines.push(&text[start..]);
    lines
}

/// What an error of `RuleSet::parse(text, format, "prop")` must say about where: its
/// display is `prop[:line[:column]]: [rules[i] ("name"), ][field `f`: ]problem`, built from
/// what its accessors report, and the line and column point into `text`.
fn check_error_location(
    e: &gray_rules::RulesError,
    text: &str,
    format: Format,
) -> Result<(), TestCaseError> {
    let shown = e.to_string();
    let mut expected = e.source_name().to_owned();
    prop_assert_eq!(e.source_name(), "prop");
    if let Some(line) = e.line() {
        // Lines count from 1 (the last one may be the empty one after a final newline). An
        // error at the end of the text may name the position just past it, the start of
        // the next line (YAML does: `{` is "2:1").
        let lines = lines_of(text, format);
        let past_the_end = line == lines.len() + 1;
        prop_assert!(
            line >= 1 && (line <= lines.len() || past_the_end),
            "line {} of {}: {}",
            line,
            lines.len(),
            shown
        );
        expected += &format!(":{line}");
        if let Some(column) = e.column() {
            // Columns count from 1, in characters or bytes: at most one past the line's end.
            let width = lines.get(line - 1).map_or(0, |l| l.len());
            prop_assert!(
                column >= 1 && column <= width + 1,
                "column {} of {}: {}",
                column,
                width,
                shown
            );
            expected += &format!(":{column}");
        }
    } else {
        prop_assert!(e.column().is_none(), "a column without a line: {}", shown);
    }
    expected += ": ";
    if let Some(i) = e.rule_index() {
        expected += &format!("rules[{i}]");
        if let Some(name) = e.rule_name() {
            expected += &format!(" ({name:?})");
        }
        expected += ", ";
    }
    if !e.field().is_empty() {
        expected += &format!("field `{}`: ", e.field());
    }
    prop_assert!(
        shown.starts_with(&expected),
        "{:?} does not start with {:?}",
        shown,
        expected
    );
    prop_assert!(
        shown.len() > expected.len(),
        "no problem stated: {:?}",
        shown
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Growing a sticky percentage never moves a user out of gray.
    #[test]
    fn growing_a_sticky_percentage_keeps_users_in(
        user in "[ -~]{1,40}",
        salt in "[a-z0-9]{0,8}",
        low in 0u32..=10_000,
        grow in 0u32..=10_000,
    ) {
        let high = (low + grow).min(10_000);
        let user = HeaderValue::from_str(&user).expect("printable ASCII");
        let before = in_gray(&sticky_rules(low, &salt), &user);
        let after = in_gray(&sticky_rules(high, &salt), &user);
        prop_assert!(!before || after, "user {user:?} left gray going from {low} to {high} bp");
    }

    /// A population grows with the percentage: the users at 10 % are a subset of those at 20 %.
    #[test]
    fn sticky_sets_are_nested(users in proptest::collection::vec("[a-z0-9]{1,12}", 1..64)) {
        let ten = sticky_rules(1_000, "");
        let twenty = sticky_rules(2_000, "");
        for u in &users {
            let v = HeaderValue::from_str(u).expect("ascii");
            prop_assert!(!in_gray(&ten, &v) || in_gray(&twenty, &v));
        }
    }

    /// The rule parser never panics, whatever the text, in every format; and an error says
    /// where, consistently: the source, then the line and column it reports, which point
    /// into the text, then the rule and the field it names.
    #[test]
    fn rule_parser_never_panics_and_errors_point_into_the_text(text in any::<String>()) {
        for format in [Format::Json, Format::Toml, Format::Yaml] {
            if let Err(e) = RuleSet::parse(&text, format, "prop") {
                check_error_location(&e, &text, format)?;
            }
        }
    }

    /// The same over near-documents: a valid rule set with a line cut or repeated, so that
    /// errors fall inside rules and name them.
    #[test]
    fn errors_in_near_valid_documents_point_into_the_text(
        cut in 0usize..14,
        repeat in any::<bool>(),
    ) {
        let lines: Vec<&str> = TOML.lines().collect();
        let cut = cut % lines.len();
        let mut edited: Vec<&str> = lines.clone();
        if repeat {
            edited.insert(cut, lines[cut]);
        } else {
            edited.remove(cut);
        }
        let text = edited.join("\n");
        if let Err(e) = RuleSet::parse(&text, Format::Toml, "prop") {
            check_error_location(&e, &text, Format::Toml)?;
        }
    }

    /// Any rule name, written as a JSON string, reads back exactly; and an error inside
    /// that rule names it exactly, with its index and its field.
    #[test]
    fn any_rule_name_round_trips_and_is_named_by_errors(name in any::<String>()) {
        let quoted = serde_json::to_string(&name).expect("a JSON string");
        let good = format!(r#"{{"rules":[{{"name":"first","lane":"a"}},{{"name":{quoted},"lane":"gray"}}]}}"#);
        let rules = RuleSet::parse(&good, Format::Json, "prop").expect("valid");
        prop_assert_eq!(rules.rules()[1].name(), Some(name.as_str()));

        let bad = format!("{{\"rules\":[{{\"name\":\"first\",\"lane\":\"a\"}},\n{{\"name\":{quoted},\n\"lane\":3}}]}}");
        let e = RuleSet::parse(&bad, Format::Json, "prop").unwrap_err();
        prop_assert_eq!(e.rule_index(), Some(1));
        prop_assert_eq!(e.rule_name(), Some(name.as_str()));
        prop_assert_eq!(e.field(), "lane");
        prop_assert_eq!(e.line(), Some(3), "{}", e);
        prop_assert!(e.to_string().starts_with("prop:3:"), "{}", e);
        let rule = format!("rules[1] ({name:?}), field `lane`: ");
        prop_assert!(e.to_string().contains(&rule), "{}", e);
    }

    /// Near-valid documents (a valid one with a byte changed) never panic either.
    #[test]
    fn mutated_rule_documents_never_panic(pos in 0usize..400, byte in any::<u8>()) {
        let valid = r#"{"enabled":true,"rules":[{"name":"a","when":{"all":[{"header":{"name":"x","regex":"^a+$"}},{"ip":["10.0.0.0/8"]},{"sticky":{"by":"client_ip","percent":12.5}}]},"lane":"gray","services":{"svc":"v2"}},{"split":[{"weight":1,"lane":"b"},{"weight":2}]},{"version_from":{"path_segment":0,"strip_prefix":"v"}}]}"#;
        let mut bytes = valid.as_bytes().to_vec();
        let at = pos % bytes.len();
        bytes[at] = byte;
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(rules) = RuleSet::parse(&text, Format::Json, "prop") {
            let uri = Uri::from_static("/v1/x?y=1");
            let headers = HeaderMap::new();
            let view = RequestView::new(&uri, &headers).with_client_ip(Some([10, 0, 0, 1].into()));
            let _decided = rules.evaluate(&view);
            prop_assert!(rules.explain(&view).checked.len() <= rules.rules().len());
        }
    }

    /// Every header codec reads arbitrary bytes without panicking, and what it decodes
    /// re-encodes to something it decodes the same way.
    #[test]
    fn header_codecs_never_panic(
        gray in proptest::collection::vec(any::<u8>(), 0..80),
        lane in proptest::collection::vec(any::<u8>(), 0..80),
        info in proptest::collection::vec(any::<u8>(), 0..300),
        baggage in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let carriers = Carriers::new()
            .with(PlainHeader::flag(HeaderName::from_static("gray"), Lane::new("gray").expect("lane")))
            .with(PlainHeader::lane(HeaderName::from_static("x-gray-lane")))
            .with(PlainHeader::version(HeaderName::from_static("version")))
            .with(RouteHeader::new(HeaderName::from_static("x-gray-info")))
            .with(BaggageMember::new("gray.lane").expect("key"));
        let mut headers = HeaderMap::new();
        for (name, value) in [("gray", &gray), ("x-gray-lane", &lane), ("version", &info), ("x-gray-info", &info), ("baggage", &baggage)] {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.append(name, v);
            }
        }
        // No carrier reads as baseline here (a baseline stain writes none).
        let stain = carriers.extract(&headers).unwrap_or_else(Stain::baseline);
        let mut out = headers.clone();
        carriers.strip(&mut out);
        prop_assert!(!carriers.is_present(&out), "stripped headers still carry a stain: {out:?}");
        carriers.inject(&stain, &mut out);
        let again = carriers.extract(&out).unwrap_or_else(Stain::baseline);
        prop_assert_eq!(again, stain);
    }

    /// Valid stains survive a round trip through every carrier.
    #[test]
    fn contexts_round_trip(
        lane in proptest::option::of("[a-z][a-z0-9.-]{0,20}"),
        all in proptest::option::of("v[0-9]{1,3}"),
        svc in proptest::collection::btree_map("[a-z][a-z0-9-]{0,10}", "v[0-9]{1,3}", 0..4),
    ) {
        let pins = Pins::new(
            all.map(|v| Version::new(v).expect("version")),
            svc.iter().map(|(s, v)| (s.as_str(), Version::new(v).expect("version"))),
        ).expect("pins");
        let stain = Stain::baseline()
            .with_lane(lane.map(|l| Lane::new(l).expect("lane")))
            .with_pins(pins);
        let carriers = Carriers::default().with(BaggageMember::new("gray.lane").expect("key"));
        let mut headers = HeaderMap::new();
        carriers.inject(&stain, &mut headers);
        // A baseline stain writes no carrier, which reads as baseline again here.
        prop_assert_eq!(carriers.extract(&headers).unwrap_or_else(Stain::baseline), stain);
    }
}
