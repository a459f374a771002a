//! Sticky weighted splits (`split = { by, salt?, arms }`): a user's arm never changes
//! between requests, the arms take their shares of users, growing one arm moves users only
//! into it, and configuration mistakes name their file, line and field.

use gray_core::Stain;
use gray_rules::{
    Format, RequestView, RuleConfig, RuleSet, RulesConfig, SplitArmConfig, SplitConfig,
    sticky_split_arm,
};
use http::{HeaderMap, HeaderValue, Uri};
use proptest::prelude::*;

/// A sticky split by `x-user-id` between arms of these weights (arm 0 baseline, arm i the
/// lane `lane-i`), then a default rule that puts requests without the key in `nokey`.
fn split_rules(weights: &[u32], salt: &str) -> RuleSet {
    let arms: Vec<String> = weights
        .iter()
        .enumerate()
        .map(|(i, w)| match i {
            0 => format!(r#"{{"weight":{w}}}"#),
            i => format!(r#"{{"weight":{w},"lane":"lane-{i}"}}"#),
        })
        .collect();
    let text = format!(
        r#"{{"rules":[
            {{"name":"split","split":{{"by":{{"header":"x-user-id"}},"salt":{salt:?},"arms":[{}]}}}},
            {{"name":"default","lane":"nokey"}}
        ]}}"#,
        arms.join(",")
    );
    RuleSet::parse(&text, Format::Json, "split.json").expect("a valid sticky split")
}

/// The lane `rules` decides for a request with these headers (`""` for baseline).
fn lane(rules: &RuleSet, headers: &HeaderMap) -> String {
    let uri = Uri::from_static("/checkout?uid=x");
    let view = RequestView::new(&uri, headers).with_client_ip(Some([10, 0, 0, 1].into()));
    let decided = rules.evaluate(&view).expect("a rule decides");
    decided
        .stain()
        .lane()
        .map_or(String::new(), ToString::to_string)
}

fn user(key: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-user-id",
        HeaderValue::from_str(key).expect("a header value"),
    );
    headers
}

/// The arm index of a lane of [`split_rules`].
fn arm_of(lane: &str) -> usize {
    match lane {
        "" => 0,
        l => l
            .strip_prefix("lane-")
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("not an arm's lane: {l}")),
    }
}

#[test]
fn a_users_arm_sticks_and_is_the_documented_one() {
    let weights = [80, 15, 5];
    let rules = split_rules(&weights, "checkout");
    let again = split_rules(&weights, "checkout");
    let arms: Vec<(&[u8], u32)> = vec![(b"0", 80), (b"1", 15), (b"2", 5)];
    for i in 0..5_000 {
        let key = format!("user-{i}");
        let first = lane(&rules, &user(&key));
        // Every request, and every gateway that loads the same rules, decides alike.
        assert_eq!(lane(&rules, &user(&key)), first, "{key}");
        assert_eq!(lane(&again, &user(&key)), first, "{key}");
        // What the configuration contract says.
        let documented = sticky_split_arm(b"checkout", key.as_bytes(), arms.iter().copied());
        assert_eq!(Some(arm_of(&first)), documented, "{key}");
    }
    // The baseline arm decides an explicit baseline stain.
    let baseline_user = (0..)
        .map(|i| format!("user-{i}"))
        .find(|k| lane(&rules, &user(k)).is_empty())
        .expect("a baseline user");
    let uri = Uri::from_static("/");
    let headers = user(&baseline_user);
    let decided = rules.evaluate(&RequestView::new(&uri, &headers)).unwrap();
    assert_eq!(decided.rule().name(), Some("split"));
    assert_eq!(decided.stain(), &Stain::baseline());
}

#[test]
fn arms_take_their_shares_of_users() {
    const USERS: u32 = 100_000;
    let weights = [80u32, 15, 5];
    let rules = split_rules(&weights, "");
    let mut counts = [0u32; 3];
    for i in 0..USERS {
        counts[arm_of(&lane(&rules, &user(&format!("user-{i}"))))] += 1;
    }
    // Each count is binomial(n, w / Σw): within 4 standard deviations (±0.50, ±0.45 and
    // ±0.28 percentage points), for these fixed keys.
    let n = f64::from(USERS);
    for (arm, (&w, &count)) in weights.iter().zip(&counts).enumerate() {
        let p = f64::from(w) / 100.0;
        let bound = 4.0 * (n * p * (1.0 - p)).sqrt();
        let off = n.mul_add(-p, f64::from(count)).abs();
        assert!(
            off <= bound,
            "arm {arm}: {count} of {USERS}, expected {} ± {bound:.0}",
            n * p
        );
    }
}

#[test]
fn a_request_without_the_key_falls_through_to_the_next_rule() {
    let rules = split_rules(&[1, 1], "");
    assert_eq!(lane(&rules, &HeaderMap::new()), "nokey");
}

#[test]
fn every_kind_of_key_reads_the_same_bytes() {
    let rules = |by: &str| {
        let text = format!(
            r#"{{"rules":[{{"split":{{"by":{by},"arms":[{{"weight":1}},{{"weight":1,"lane":"lane-1"}},{{"weight":1,"lane":"lane-2"}}]}}}}]}}"#
        );
        RuleSet::parse(&text, Format::Json, "by.json").expect("a valid split")
    };
    let (by_header, by_cookie, by_query) = (
        rules(r#"{"header":"x-user-id"}"#),
        rules(r#"{"cookie":"uid"}"#),
        rules(r#"{"query":"uid"}"#),
    );
    for i in 0..200 {
        let key = format!("u{i}");
        let mut headers = user(&key);
        headers.insert(
            "cookie",
            HeaderValue::from_str(&format!("a=b; uid={key}")).unwrap(),
        );
        let uri: Uri = format!("/?uid={key}").parse().unwrap();
        let view = RequestView::new(&uri, &headers);
        let arm = |rules: &RuleSet| rules.evaluate(&view).map(|d| d.into_stain());
        assert_eq!(arm(&by_header), arm(&by_cookie), "{key}");
        assert_eq!(arm(&by_header), arm(&by_query), "{key}");
    }
    // The client IP: its octets.
    let by_ip = rules(r#""client_ip""#);
    let arms: [(&[u8], u32); 3] = [(b"0", 1), (b"1", 1), (b"2", 1)];
    for last in 0..=255u8 {
        let uri = Uri::from_static("/");
        let headers = HeaderMap::new();
        let view = RequestView::new(&uri, &headers).with_client_ip(Some([10, 0, 0, last].into()));
        let lane = by_ip.evaluate(&view).map(|d| d.into_stain()).unwrap();
        let expected = sticky_split_arm(b"", &[10, 0, 0, last], arms).unwrap();
        assert_eq!(arm_of(lane.lane().map_or("", |l| l.as_str())), expected);
    }
}

#[test]
fn named_arms_can_be_reordered_and_salts_are_independent() {
    let named = |order: &[usize]| {
        let all = [
            r#"{"name":"stable","weight":70}"#,
            r#"{"name":"canary","weight":20,"lane":"lane-1"}"#,
            r#"{"name":"next","weight":10,"lane":"lane-2"}"#,
        ];
        let arms: Vec<&str> = order.iter().map(|&i| all[i]).collect();
        let text = format!(
            r#"{{"rules":[{{"split":{{"by":{{"header":"x-user-id"}},"arms":[{}]}}}}]}}"#,
            arms.join(",")
        );
        RuleSet::parse(&text, Format::Json, "named.json").expect("a valid split")
    };
    let (written, reordered) = (named(&[0, 1, 2]), named(&[2, 0, 1]));
    let (one, other) = (
        split_rules(&[70, 20, 10], "one"),
        split_rules(&[70, 20, 10], "other"),
    );
    let mut differ = 0;
    for i in 0..2_000 {
        let headers = user(&format!("user-{i}"));
        assert_eq!(lane(&written, &headers), lane(&reordered, &headers));
        differ += usize::from(lane(&one, &headers) != lane(&other, &headers));
    }
    // Independent placements agree for 0.7² + 0.2² + 0.1² = 54 % of users.
    assert!(
        (800..=1_040).contains(&differ),
        "{differ} of 2,000 placed differently"
    );
}

/// Applies `grow` to arm `j` of `weights` (saturating at 0).
fn resized(weights: &[u32], j: usize, grow: i64) -> Vec<u32> {
    let mut w = weights.to_vec();
    w[j] = u32::try_from((i64::from(w[j]) + grow).max(0)).unwrap_or(u32::MAX);
    w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Growing one arm moves users only into it; shrinking it moves only its own users
    /// out. No user moves between two arms whose weights did not change.
    #[test]
    fn resizing_one_arm_moves_users_only_into_or_out_of_it(
        weights in proptest::collection::vec(0u32..=1_000, 2..=5),
        pick in any::<prop::sample::Index>(),
        grow in 1i64..=1_000,
        salt in "[a-z]{0,4}",
    ) {
        prop_assume!(weights.iter().any(|&w| w > 0));
        let j = pick.index(weights.len());
        let before = split_rules(&weights, &salt);
        let grown = split_rules(&resized(&weights, j, grow), &salt);
        let shrunk_weights = resized(&weights, j, -grow);
        let shrunk = shrunk_weights.iter().any(|&w| w > 0).then(|| split_rules(&shrunk_weights, &salt));
        let mut moved = 0;
        for i in 0..300 {
            let headers = user(&format!("user-{i}"));
            let was = lane(&before, &headers);
            let now = lane(&grown, &headers);
            if now != was {
                moved += 1;
                prop_assert_eq!(arm_of(&now), j, "grew arm {}: a user moved from {:?} to {:?}", j, was, now);
            }
            if let Some(shrunk) = &shrunk {
                let now = lane(shrunk, &headers);
                if now != was {
                    prop_assert_eq!(arm_of(&was), j, "shrank arm {}: a user moved from {:?} to {:?}", j, was, now);
                }
            }
        }
        // Growing an arm that had every weight already moves nobody; else someone may move.
        if weights.iter().enumerate().all(|(i, &w)| i == j || w == 0) {
            prop_assert_eq!(moved, 0);
        }
    }
}

/// Mistakes in a sticky split, each in TOML, YAML and JSON: the field, the line, and what
/// was expected.
#[test]
fn mistakes_name_their_file_line_and_field() {
    struct Case {
        what: &'static str,
        toml: &'static str,
        yaml: &'static str,
        json: &'static str,
        field: &'static str,
        lines: [usize; 3],
        message: &'static str,
    }
    let cases = [
        Case {
            what: "a `by` with no arms",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\nby = { header = \"x-user-id\" }\n",
            yaml: "rules:\n  - name: s\n    split:\n      by: { header: x-user-id }\n",
            json: "{\"rules\": [\n  {\"name\": \"s\",\n   \"split\": {\"by\": {\"header\": \"x-user-id\"}}}\n]}",
            field: "split.arms",
            lines: [3, 4, 3],
            message: "expected at least one arm",
        },
        Case {
            what: "zero total weight",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\nby = \"client_ip\"\narms = [{ weight = 0 }, { weight = 0, lane = \"g\" }]\n",
            yaml: "rules:\n  - name: s\n    split:\n      by: client_ip\n      arms: [{ weight: 0 }, { weight: 0, lane: g }]\n",
            json: "{\"rules\": [\n  {\"name\": \"s\", \"split\": {\"by\": \"client_ip\",\n   \"arms\": [{\"weight\": 0}, {\"weight\": 0, \"lane\": \"g\"}]}}\n]}",
            field: "split.arms",
            lines: [5, 5, 3],
            message: "expected at least one arm with a weight above 0, found all weights 0",
        },
        Case {
            what: "a table without `by`",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\narms = [{ weight = 1 }]\n",
            yaml: "rules:\n  - name: s\n    split:\n      arms: [{ weight: 1 }]\n",
            json: "{\"rules\": [\n  {\"name\": \"s\",\n   \"split\": {\"arms\": [{\"weight\": 1}]}}\n]}",
            field: "split",
            lines: [3, 4, 3],
            message: "missing field `by`",
        },
        Case {
            what: "two arms of one name",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\nby = { cookie = \"uid\" }\narms = [\n  { weight = 1, name = \"a\" },\n  { weight = 1, name = \"a\", lane = \"g\" },\n]\n",
            yaml: "rules:\n  - name: s\n    split:\n      by: { cookie: uid }\n      arms:\n        - { weight: 1, name: a }\n        - { weight: 1, name: a, lane: g }\n",
            json: "{\"rules\": [{\"name\": \"s\", \"split\": {\"by\": {\"cookie\": \"uid\"}, \"arms\": [\n  {\"weight\": 1, \"name\": \"a\"},\n  {\"weight\": 1, \"name\": \"a\", \"lane\": \"g\"}\n]}}]}",
            field: "split.arms[1].name",
            lines: [7, 7, 3],
            message: "a name that no other arm has",
        },
        Case {
            what: "a misspelt key in the table",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\nby = { query = \"uid\" }\nslat = \"x\"\narms = [{ weight = 1 }]\n",
            yaml: "rules:\n  - name: s\n    split:\n      by: { query: uid }\n      slat: x\n      arms: [{ weight: 1 }]\n",
            json: "{\"rules\": [{\"name\": \"s\", \"split\": {\"by\": {\"query\": \"uid\"},\n  \"slat\": \"x\", \"arms\": [{\"weight\": 1}]}}]}",
            field: "split.slat",
            lines: [5, 5, 2],
            message: "unknown field `slat`, expected one of `by`, `salt`, `arms`",
        },
        Case {
            what: "a bad key",
            toml: "[[rules]]\nname = \"s\"\n[rules.split]\nby = { header = \"x user\" }\narms = [{ weight = 1 }]\n",
            yaml: "rules:\n  - name: s\n    split:\n      by: { header: x user }\n      arms: [{ weight: 1 }]\n",
            json: "{\"rules\": [{\"name\": \"s\",\n  \"split\": {\"by\": {\"header\": \"x user\"}, \"arms\": [{\"weight\": 1}]}}]}",
            field: "split.by.header",
            lines: [4, 4, 2],
            message: "expected a valid HTTP header name",
        },
    ];
    for case in &cases {
        for (format, text, file, line) in [
            (Format::Toml, case.toml, "rules.toml", case.lines[0]),
            (Format::Yaml, case.yaml, "rules.yaml", case.lines[1]),
            (Format::Json, case.json, "rules.json", case.lines[2]),
        ] {
            let e = RuleSet::parse(text, format, file).expect_err(case.what);
            let what = format!("{} in {file}: {e}", case.what);
            assert_eq!(e.source_name(), file, "{what}");
            assert_eq!((e.rule_index(), e.field()), (Some(0), case.field), "{what}");
            assert_eq!(e.line(), Some(line), "{what}");
            assert!(
                e.to_string().starts_with(&format!("{file}:{line}:")),
                "{what}"
            );
            assert!(e.to_string().contains(case.message), "{what}");
        }
    }

    // A salt on a split without a key (built in code: a list of arms has no salt).
    let mut rule = RuleConfig::default();
    rule.split = SplitConfig::random(vec![SplitArmConfig::default()]);
    rule.split.salt = "s".into();
    let mut config = RulesConfig::default();
    config.rules.push(rule);
    let e = RuleSet::compile(&config, "code").expect_err("a salt needs a key");
    assert_eq!(e.field(), "split.by", "{e}");
}
