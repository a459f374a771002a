use std::net::IpAddr;

use http::{HeaderMap, HeaderValue, Uri};

use super::*;

fn json(text: &str) -> RuleSet {
    RuleSet::parse(text, Format::Json, "test.json").unwrap_or_else(|e| panic!("{e}"))
}

/// A rule set with one rule `{ when: <cond>, lane: "gray" }`.
fn one(cond: &str) -> RuleSet {
    json(&format!(
        r#"{{"rules":[{{"name":"r","when":{cond},"lane":"gray"}}]}}"#
    ))
}

struct Req {
    uri: Uri,
    headers: HeaderMap,
    ip: Option<IpAddr>,
}

fn req(uri: &str, headers: &[(&str, &str)], ip: Option<&str>) -> Req {
    let mut h = HeaderMap::new();
    for (k, v) in headers {
        h.append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    Req {
        uri: uri.parse().unwrap(),
        headers: h,
        ip: ip.map(|s| s.parse().unwrap()),
    }
}

fn fires(rules: &RuleSet, r: &Req) -> bool {
    let view = RequestView::new(&r.uri, &r.headers).with_client_ip(r.ip);
    rules.evaluate(&view).is_some()
}

/// Runs a table: (condition, request, expected).
fn table(cases: &[(&str, Req, bool)]) {
    for (i, (cond, r, expected)) in cases.iter().enumerate() {
        let rules = one(cond);
        assert_eq!(fires(&rules, r), *expected, "case {i}: {cond} on {}", r.uri);
    }
}

#[test]
fn header_conditions() {
    let exact = r#"{"header":{"name":"x-user","exact":"alice"}}"#;
    let ic = r#"{"header":{"name":"gray","exact":"true","ignore_case":true}}"#;
    let prefix = r#"{"header":{"name":"x-user","prefix":"test-"}}"#;
    let regex = r#"{"header":{"name":"x-user","regex":"^u[0-9]+$"}}"#;
    let present = r#"{"header":{"name":"x-debug","present":true}}"#;
    let absent = r#"{"header":{"name":"x-debug","present":false}}"#;
    let one_of = r#"{"header":{"name":"x-user","one_of":["a","b"]}}"#;
    table(&[
        (exact, req("/", &[("x-user", "alice")], None), true),
        (exact, req("/", &[("x-user", "Alice")], None), false),
        (exact, req("/", &[("x-user", "alice2")], None), false),
        (exact, req("/", &[], None), false),
        // A duplicated header is read as its first value.
        (
            exact,
            req("/", &[("x-user", "bob"), ("x-user", "alice")], None),
            false,
        ),
        (ic, req("/", &[("gray", "TRUE")], None), true),
        (ic, req("/", &[("gray", "yes")], None), false),
        (prefix, req("/", &[("x-user", "test-1")], None), true),
        (prefix, req("/", &[("x-user", "prod-1")], None), false),
        (prefix, req("/", &[("x-user", "test")], None), false),
        (regex, req("/", &[("x-user", "u42")], None), true),
        (regex, req("/", &[("x-user", "u42x")], None), false),
        (present, req("/", &[("x-debug", "")], None), true),
        (present, req("/", &[], None), false),
        (absent, req("/", &[], None), true),
        (absent, req("/", &[("x-debug", "1")], None), false),
        (one_of, req("/", &[("x-user", "b")], None), true),
        (one_of, req("/", &[("x-user", "c")], None), false),
    ]);
}

#[test]
fn cookie_conditions() {
    let exact = r#"{"cookie":{"name":"beta","exact":"1"}}"#;
    let regex = r#"{"cookie":{"name":"uid","regex":"^9"}}"#;
    let present = r#"{"cookie":{"name":"beta","present":true}}"#;
    table(&[
        (exact, req("/", &[("cookie", "a=b; beta=1")], None), true),
        (exact, req("/", &[("cookie", "beta=\"1\"")], None), true),
        (
            exact,
            req("/", &[("cookie", "a=1"), ("cookie", "beta=1")], None),
            true,
        ),
        (exact, req("/", &[("cookie", "xbeta=1")], None), false),
        (exact, req("/", &[("cookie", "beta=10")], None), false),
        (exact, req("/", &[], None), false),
        (regex, req("/", &[("cookie", "uid=912")], None), true),
        (regex, req("/", &[("cookie", "uid=129")], None), false),
        (present, req("/", &[("cookie", "beta=")], None), true),
        (present, req("/", &[("cookie", "beta")], None), false),
    ]);
}

#[test]
fn query_conditions() {
    let exact = r#"{"query":{"name":"v","exact":"1"}}"#;
    let spaced = r#"{"query":{"name":"q","exact":"a b"}}"#;
    let prefix = r#"{"query":{"name":"q","prefix":"/x"}}"#;
    let regex = r#"{"query":{"name":"q","regex":"^a b$"}}"#;
    let present = r#"{"query":{"name":"debug","present":true}}"#;
    table(&[
        (exact, req("/a?v=1", &[], None), true),
        (exact, req("/a?x=2&v=1", &[], None), true),
        (exact, req("/a?v=12", &[], None), false),
        (exact, req("/a?vv=1", &[], None), false),
        (exact, req("/a", &[], None), false),
        (exact, req("/a?v=%31", &[], None), true),
        (spaced, req("/?q=a+b", &[], None), true),
        (spaced, req("/?q=a%20b", &[], None), true),
        (spaced, req("/?q=ab", &[], None), false),
        (prefix, req("/?q=%2Fx%2Fy", &[], None), true),
        (regex, req("/?q=a%20b", &[], None), true),
        (regex, req("/?q=a", &[], None), false),
        (present, req("/?debug", &[], None), true),
        (present, req("/?debugx=1", &[], None), false),
    ]);
}

#[test]
fn path_conditions() {
    let prefix = r#"{"path":{"prefix":"/api/"}}"#;
    let segment = r#"{"path":{"segment":"v1"}}"#;
    let exact = r#"{"path":{"exact":"/health"}}"#;
    let regex = r#"{"path":{"regex":"^/v[0-9]+/"}}"#;
    table(&[
        (prefix, req("/api/users", &[], None), true),
        (prefix, req("/apix", &[], None), false),
        (segment, req("/v1/users", &[], None), true),
        (segment, req("/api/v1", &[], None), true),
        (segment, req("/v10/users", &[], None), false),
        (segment, req("/xv1/users", &[], None), false),
        (exact, req("/health", &[], None), true),
        (exact, req("/health/", &[], None), false),
        (regex, req("/v2/a", &[], None), true),
        (regex, req("/va/a", &[], None), false),
    ]);
}

#[test]
fn ip_conditions() {
    let wl = r#"{"ip":["127.0.0.1","192.168.1.0/24","2001:db8::/32"]}"#;
    table(&[
        (wl, req("/", &[], Some("127.0.0.1")), true),
        (wl, req("/", &[], Some("127.0.0.2")), false),
        (wl, req("/", &[], Some("192.168.1.77")), true),
        (wl, req("/", &[], Some("::ffff:192.168.1.77")), true),
        (wl, req("/", &[], Some("2001:db8::9")), true),
        (wl, req("/", &[], Some("2001:db9::9")), false),
        (wl, req("/", &[], None), false),
    ]);
}

#[test]
fn sticky_conditions() {
    let zero = r#"{"sticky":{"by":{"header":"x-user"},"percent":0}}"#;
    let all = r#"{"sticky":{"by":{"header":"x-user"},"percent":100}}"#;
    let by_ip = r#"{"sticky":{"by":"client_ip","percent":100}}"#;
    let by_cookie = r#"{"sticky":{"by":{"cookie":"uid"},"percent":100}}"#;
    let by_query = r#"{"sticky":{"by":{"query":"uid"},"percent":100}}"#;
    table(&[
        (zero, req("/", &[("x-user", "a")], None), false),
        (all, req("/", &[("x-user", "a")], None), true),
        (all, req("/", &[], None), false),
        (by_ip, req("/", &[], Some("10.0.0.1")), true),
        (by_ip, req("/", &[], None), false),
        (by_cookie, req("/", &[("cookie", "uid=5")], None), true),
        (by_cookie, req("/", &[], None), false),
        (by_query, req("/?uid=5", &[], None), true),
        (by_query, req("/", &[], None), false),
    ]);
    // The threshold is the user's bucket: exactly at it the user is out, one above it in.
    let bucket = sticky_bucket(b"s", b"user-7");
    let at = |p: f64| {
        json(&format!(
            r#"{{"rules":[{{"when":{{"sticky":{{"by":{{"header":"x-user"}},"percent":{p},"salt":"s"}}}},"lane":"gray"}}]}}"#
        ))
    };
    let r = req("/", &[("x-user", "user-7")], None);
    assert!(!fires(&at(f64::from(bucket) / 100.0), &r));
    assert!(fires(&at(f64::from(bucket + 1) / 100.0), &r));
}

#[test]
fn random_and_split_follow_their_weights() {
    let rules = json(
        r#"{"rules":[
            {"name":"coin","when":{"random":{"percent":25}},"lane":"a"},
            {"name":"split","split":[{"weight":3,"lane":"b"},{"weight":1}]}
        ]}"#,
    );
    let r = req("/", &[], None);
    let view = RequestView::new(&r.uri, &r.headers);
    let mut dice = Dice::seeded(1);
    let (mut a, mut b, mut base) = (0, 0, 0);
    for _ in 0..8_000 {
        let d = rules.evaluate_with(&view, &mut dice).unwrap();
        match d.stain().lane().map(|l| l.as_str()) {
            Some("a") => a += 1,
            Some("b") => b += 1,
            _ => base += 1,
        }
    }
    // Expected 25 % / 56.25 % (3/4 of the other 75 %) / 18.75 % of 8,000, each within 4
    // standard deviations of its binomial count (± 155, ± 178, ± 140); the dice are seeded.
    let within = |count: u32, p: f64| {
        let mean = 8_000.0 * p;
        (f64::from(count) - mean).abs() <= 4.0 * (mean * (1.0 - p)).sqrt()
    };
    assert!(within(a, 0.25), "{a}");
    assert!(within(b, 0.5625), "{b}");
    assert!(within(base, 0.1875), "{base}");
    // The random rule never fires at 0 % and always at 100 %.
    let never = one(r#"{"random":{"percent":0}}"#);
    let always = one(r#"{"random":{"percent":100}}"#);
    for _ in 0..200 {
        assert!(!fires(&never, &r));
        assert!(fires(&always, &r));
    }
}

#[test]
fn combinators() {
    let all = r#"{"all":[{"header":{"name":"a","present":true}},{"header":{"name":"b","present":true}}]}"#;
    let any = r#"{"any":[{"header":{"name":"a","present":true}},{"header":{"name":"b","present":true}}]}"#;
    let not = r#"{"not":{"header":{"name":"a","present":true}}}"#;
    let implicit = r#"{"header":{"name":"a","present":true},"path":{"prefix":"/x"}}"#;
    table(&[
        (all, req("/", &[("a", "1"), ("b", "1")], None), true),
        (all, req("/", &[("a", "1")], None), false),
        (any, req("/", &[("b", "1")], None), true),
        (any, req("/", &[], None), false),
        (not, req("/", &[], None), true),
        (not, req("/", &[("a", "1")], None), false),
        (implicit, req("/x", &[("a", "1")], None), true),
        (implicit, req("/y", &[("a", "1")], None), false),
    ]);
}

#[test]
fn first_match_wins_and_switches() {
    let text = r#"{"rules":[
        {"name":"off","enabled":false,"lane":"never"},
        {"name":"bots","when":{"header":{"name":"user-agent","prefix":"bot"}},"baseline":true},
        {"name":"pinned","when":{"header":{"name":"x-v","present":true}},"version":"v2","services":{"svc-b":"v3"}},
        {"name":"default","lane":"gray"}
    ]}"#;
    let rules = json(text);
    let r = req("/", &[("user-agent", "bot/1"), ("x-v", "1")], None);
    let view = RequestView::new(&r.uri, &r.headers);
    let d = rules.evaluate(&view).unwrap();
    assert_eq!(d.rule().name(), Some("bots"));
    assert!(d.stain().is_baseline());

    let r = req("/", &[("x-v", "1")], None);
    let view = RequestView::new(&r.uri, &r.headers);
    let d = rules.evaluate(&view).unwrap();
    assert_eq!(d.rule().index(), 2);
    assert_eq!(d.stain().version_for("svc-a").unwrap(), "v2");
    assert_eq!(d.stain().version_for("svc-b").unwrap(), "v3");
    let e = rules.explain(&view);
    assert_eq!(e.fired, Some(2));
    assert_eq!(e.checked.len(), 3);
    assert!(!e.checked[0].enabled);
    assert_eq!(e.version.as_deref(), Some("v2"));
    assert_eq!(e.services["svc-b"], "v3");

    let r = req("/", &[], None);
    let view = RequestView::new(&r.uri, &r.headers);
    assert_eq!(
        rules.evaluate(&view).unwrap().rule().name(),
        Some("default")
    );

    let off = json(&text.replacen("{\"rules\"", "{\"enabled\":false,\"rules\"", 1));
    assert!(off.evaluate(&view).is_none());
    let e = off.explain(&view);
    assert!(!e.enabled && e.fired.is_none() && e.checked.is_empty());
}

#[test]
fn matches_share_the_prebuilt_context() {
    let rules = one(r#"{"path":{"prefix":"/"}}"#);
    let r = req("/", &[], None);
    let view = RequestView::new(&r.uri, &r.headers);
    let a = rules.evaluate(&view).unwrap().into_stain();
    let b = rules.evaluate(&view).unwrap().into_stain();
    assert_eq!(a, b);
    // Interned: the set's names know the lane.
    assert_eq!(rules.names().lane(b"gray").unwrap(), *a.lane().unwrap());
}

#[test]
fn version_from_the_request() {
    let rules = json(
        r#"{"rules":[
            {"name":"path","when":{"path":{"prefix":"/v"}},
             "version_from":{"path_segment":0,"strip_prefix":"v","known":["1","2"]}},
            {"name":"query","version_from":{"query":"v"}},
            {"name":"header","version_from":{"header":"x-api-version","lane":"gray"}}
        ]}"#,
    );
    let check = |r: Req, rule: Option<usize>, version: Option<&str>| {
        let view = RequestView::new(&r.uri, &r.headers);
        let d = rules.evaluate(&view);
        assert_eq!(d.as_ref().map(|d| d.rule().index()), rule, "{}", r.uri);
        assert_eq!(
            d.as_ref()
                .and_then(|d| d.stain().version_for("any"))
                .map(|v| v.as_str()),
            version
        );
    };
    check(req("/v1/users", &[], None), Some(0), Some("1"));
    check(req("/v2", &[], None), Some(0), Some("2"));
    // v3 is not known: the path rule does not match, the next ones are tried.
    check(req("/v3/users", &[], None), None, None);
    check(req("/v3/users?v=3", &[], None), Some(1), Some("3"));
    check(req("/x?v=bad%20name", &[], None), None, None);
    check(
        req("/x", &[("x-api-version", "2.0")], None),
        Some(2),
        Some("2.0"),
    );
    let r = req("/x", &[("x-api-version", "2.0")], None);
    let view = RequestView::new(&r.uri, &r.headers);
    assert_eq!(
        rules.evaluate(&view).unwrap().stain().lane().unwrap(),
        "gray"
    );
}

fn error(text: &str) -> RulesError {
    RuleSet::parse(text, Format::Json, "rules.json").unwrap_err()
}

#[test]
fn errors_name_source_rule_field_and_expectation() {
    let e = error(
        "{\"rules\":[{\"lane\":\"a\"},\n{\"name\":\"testers\",\"when\":{\"header\":{\"name\":\"x\",\"regex\":\"(\"}},\"lane\":\"gray\"}]}",
    );
    assert_eq!(e.source_name(), "rules.json");
    assert_eq!(e.rule_index(), Some(1));
    assert_eq!(e.rule_name(), Some("testers"));
    assert_eq!(e.field(), "when.header.regex");
    assert_eq!(e.line(), Some(2));
    let text = e.to_string();
    assert!(
        text.starts_with(r#"rules.json:2:58: rules[1] ("testers"), field `when.header.regex`: expected a valid regular expression"#),
        "{text}"
    );

    for (input, field, expected) in [
        (
            r#"{"rules":[{"when":{"ip":["10.0.0.0/33"]},"lane":"g"}]}"#,
            "when.ip[0]",
            "a CIDR block",
        ),
        (
            r#"{"rules":[{"when":{"sticky":{"by":"client_ip","percent":120}},"lane":"g"}]}"#,
            "when.sticky.percent",
            "a percentage",
        ),
        (
            r#"{"rules":[{"when":{"header":{"name":"x"}},"lane":"g"}]}"#,
            "when.header",
            "exactly one of",
        ),
        (
            r#"{"rules":[{"when":{"header":{"name":"bad name","present":true}},"lane":"g"}]}"#,
            "when.header.name",
            "a valid HTTP header name",
        ),
        (
            r#"{"rules":[{"when":{},"lane":"g"}]}"#,
            "when",
            "at least one of",
        ),
        (
            r#"{"rules":[{"when":{"any":[]},"lane":"g"}]}"#,
            "when.any",
            "at least one condition",
        ),
        (
            r#"{"rules":[{"lane":"not a lane"}]}"#,
            "lane",
            "a lane name",
        ),
        (
            r#"{"rules":[{"services":{"svc":"v 1"}}]}"#,
            "services.svc",
            "a version name",
        ),
        (
            r#"{"rules":[{"when":{"path":{"prefix":"/"}}}]}"#,
            "",
            "exactly one outcome",
        ),
        (
            r#"{"rules":[{"lane":"g","baseline":true}]}"#,
            "",
            "exactly one outcome",
        ),
        (
            r#"{"rules":[{"split":[{"weight":0,"lane":"g"}]}]}"#,
            "split",
            "at least one arm",
        ),
        (
            r#"{"rules":[{"version_from":{"query":"v","header":"x"}}]}"#,
            "version_from",
            "exactly one of",
        ),
        (
            r#"{"rules":[{"when":{"path":{"segment":"a/b"}},"lane":"g"}]}"#,
            "when.path.segment",
            "one non-empty path segment",
        ),
    ] {
        let e = error(input);
        assert_eq!(e.rule_index(), Some(0), "{input}");
        assert_eq!(e.field(), field, "{input}");
        assert!(e.to_string().contains(expected), "{input}: {e}");
    }

    // Shape errors come from the parser, with the path of the field inside its rule.
    let e = error(r#"{"rules":[{"lane":"g"},{"when":{"hedaer":{}},"lane":"g"}]}"#);
    assert_eq!(e.rule_index(), Some(1));
    assert_eq!(e.field(), "when.hedaer");
    assert!(e.to_string().contains("unknown field `hedaer`"), "{e}");
    let e = error("{not json");
    assert!(
        e.to_string()
            .starts_with("rules.json:1:2: key must be a string"),
        "{e}"
    );
    let e = error(r#"{"rules":[]} trailing"#);
    assert!(matches!(e.problem(), Problem::Syntax(_)));
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let mut cond = String::from(r#"{"header":{"name":"a","present":true}}"#);
    for _ in 0..40 {
        cond = format!(r#"{{"not":{cond}}}"#);
    }
    let e = error(&format!(r#"{{"rules":[{{"when":{cond},"lane":"g"}}]}}"#));
    assert!(e.to_string().contains("nested at most 32 deep"), "{e}");
}

#[cfg(all(feature = "toml", feature = "yaml"))]
#[test]
fn the_three_formats_agree() {
    let toml = r#"
enabled = true
[[rules]]
name = "testers"
when = { ip = ["127.0.0.1"], sticky = { by = "client_ip", percent = 100 } }
lane = "gray"
[[rules]]
name = "api"
version_from = { path_segment = 0, strip_prefix = "v" }
"#;
    let yaml = r#"
enabled: true
rules:
  - name: testers
    when: { ip: ["127.0.0.1"], sticky: { by: client_ip, percent: 100 } }
    lane: gray
  - name: api
    version_from: { path_segment: 0, strip_prefix: v }
"#;
    let json_text = r#"{"enabled":true,"rules":[
        {"name":"testers","when":{"ip":["127.0.0.1"],"sticky":{"by":"client_ip","percent":100}},"lane":"gray"},
        {"name":"api","version_from":{"path_segment":0,"strip_prefix":"v"}}]}"#;
    let a = RulesConfig::parse(toml, Format::Toml, "a.toml").unwrap();
    let b = RulesConfig::parse(yaml, Format::Yaml, "a.yaml").unwrap();
    let c = RulesConfig::parse(json_text, Format::Json, "a.json").unwrap();
    assert_eq!(a, b);
    assert_eq!(b, c);

    let e = RuleSet::parse(
        "[[rules]]\nname = \"x\"\nlane = \"gray\"\nwhen = { ip = [\"nope\"] }\n",
        Format::Toml,
        "rules.toml",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "rules.toml:4:16: rules[0] (\"x\"), field `when.ip[0]`: expected a CIDR block (`10.0.0.0/8`) or an IP address, found \"nope\""
    );
    let e = RuleSet::parse("rules:\n  - lane: [1]\n", Format::Yaml, "r.yaml").unwrap_err();
    assert_eq!(e.rule_index(), Some(0));
    assert_eq!((e.field(), e.line()), ("lane", Some(2)), "{e}");
    let e = RuleSet::parse("[[rules]\n", Format::Toml, "r.toml").unwrap_err();
    assert!(e.to_string().starts_with("r.toml:1:9: "), "{e}");
}

/// Runs in every build: a format is read with its feature, and without it the error names
/// gray-rules' feature (the one a user of gray-rules turns on), not gray-config's. What the
/// disabled branch says is also tested with CI's every-feature build, in `error::tests`.
#[test]
fn formats_are_read_with_their_feature_and_name_it_without() {
    for (format, feature, text) in [
        (Format::Toml, "toml", "[[rules]]\nlane = \"gray\"\n"),
        (Format::Yaml, "yaml", "rules:\n  - lane: gray\n"),
    ] {
        let compiled = match feature {
            "toml" => cfg!(feature = "toml"),
            _ => cfg!(feature = "yaml"),
        };
        match RuleSet::parse(text, format, "r") {
            Ok(rules) => {
                assert!(compiled, "{feature}");
                assert_eq!(rules.rules().len(), 1);
            }
            Err(e) => {
                assert!(!compiled, "{feature}: {e}");
                assert_eq!(
                    e.to_string(),
                    format!(
                        "r: this format is not compiled in: enable the `{feature}` feature of gray-rules"
                    )
                );
            }
        }
    }
}
