//! The matching tests: one per seed row, the walk, the errors, and the configuration.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::*;
use crate::route::Subset;
use gray_config::{self as config, Format};
use gray_core::{
    Carriers, Labels, Lane, Pins, Stain, Version,
    codec::{PlainHeader, RouteHeader},
};

fn lane(s: &str) -> Lane {
    Lane::new(s).unwrap()
}

fn v(s: &str) -> Version {
    Version::new(s).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_iter(pairs.iter().copied())
}

/// Decides over `(id, labels)` instances, all ready, and returns the candidates.
fn route<'a>(
    policy: &Policy,
    stain: Option<&Stain>,
    instances: &'a [(&'a str, Labels)],
) -> Option<Vec<&'a str>> {
    let cands = instances
        .iter()
        .map(|(id, l)| Candidate::new(*id, l, Availability::Ready));
    policy
        .decide("svc-b", stain, cands)
        .candidates()
        .map(<[_]>::to_vec)
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, val) in pairs {
        h.append(*k, HeaderValue::from_static(val));
    }
    h
}

#[test]
fn classify_reads_lane_flag_and_versions() {
    let p = Policy::new();
    let c = p.classify(&labels(&[("gray", "True"), ("versions", " 1.0, 2.0,,1.0")]));
    assert_eq!(c.lane().unwrap(), "gray");
    assert_eq!(c.versions(), &[v("1.0"), v("2.0")]);
    let c = p.classify(&labels(&[("gray", "true"), ("lane", "canary")]));
    assert_eq!(c.lane().unwrap(), "canary", "the lane label wins");
    let c = p.classify(&labels(&[("gray", "yes"), ("lane", "bad name")]));
    assert_eq!(c.lane(), None, "invalid values count as absent");
    let c = p.classify(&labels(&[("version", "3"), ("versions", "3,4")]));
    assert_eq!(c.versions(), &[v("3"), v("4")]);
    let exact = Policy::seed_003();
    assert_eq!(exact.classify(&labels(&[("gray", "TRUE")])).lane(), None);
    assert_eq!(
        exact.classify(&labels(&[("gray", "true")])).lane().unwrap(),
        "gray"
    );
}

#[test]
fn pin_decides_first_and_lane_is_the_next_fallback() {
    let p = Policy::new().with_fallback(Fallback::Baseline);
    let pins = Pins::new(None, [("svc-b", v("2"))]).unwrap();
    let stain = Stain::in_lane(lane("gray")).with_pins(pins);
    let key = p.key("svc-b", Some(&stain));
    let chain: Vec<_> = p.chain(&key).iter().collect();
    let (g, two) = (lane("gray"), v("2"));
    assert_eq!(
        chain,
        [Subset::Version(&two), Subset::Lane(&g), Subset::Baseline]
    );
    // The pin is for svc-b only: svc-c sees the lane.
    let key_c = p.key("svc-c", Some(&stain));
    assert_eq!(key_c.pin(), None);
    let inst = [
        ("gray-v1", labels(&[("gray", "true"), ("version", "1")])),
        ("base-v2", labels(&[("version", "2")])),
        ("base-v1", labels(&[("version", "1")])),
    ];
    assert_eq!(route(&p, Some(&stain), &inst).unwrap(), ["base-v2"]);
    assert_eq!(route(&p, Some(&stain), &inst[..1]).unwrap(), ["gray-v1"]);
    assert_eq!(
        route(&p, Some(&stain), &[inst[0].clone(), inst[2].clone()]).unwrap(),
        ["gray-v1"]
    );
    assert_eq!(route(&p, Some(&stain), &inst[2..]).unwrap(), ["base-v1"]);
}

#[test]
fn own_lane_applies_only_without_a_decided_stain() {
    let p = Policy::seed_000().with_own_lane(Some(lane("gray")));
    let inst = [("b", labels(&[])), ("g", labels(&[("gray", "true")]))];
    assert_eq!(route(&p, None, &inst).unwrap(), ["g"]);
    assert_eq!(route(&p, Some(&Stain::unstained()), &inst).unwrap(), ["g"]);
    assert_eq!(route(&p, Some(&Stain::baseline()), &inst).unwrap(), ["b"]);
    for stain in [None, Some(&Stain::unstained())] {
        let d = p.decide(
            "svc-b",
            stain,
            inst.iter()
                .map(|(i, l)| Candidate::new(*i, l, Availability::Ready)),
        );
        assert!(d.own_lane);
    }
    let baseline = Stain::baseline();
    let key = p.key("svc-b", Some(&baseline));
    assert!(!key.is_own_lane() && key.lane().is_none());
}

#[test]
fn unready_subset_fails_or_falls_back() {
    let inst_labels = [labels(&[("gray", "true")]), labels(&[])];
    let cands = |a: Availability| {
        vec![
            Candidate::new("g", &inst_labels[0], a),
            Candidate::new("b", &inst_labels[1], Availability::Ready),
        ]
    };
    let stain = Stain::in_lane(lane("gray"));
    let p = Policy::seed_000();
    let d = p.decide("svc-b", Some(&stain), cands(Availability::Unready));
    let err = d.error().unwrap();
    assert!(matches!(
        err.reason(),
        UnroutableReason::Unready { present: 1, .. }
    ));
    assert_eq!(
        err.to_string(),
        "no instance of `svc-b` is ready for the request: lane `gray` has 1, none ready, \
         lane `gray` (policy `seed-000`, fallback `baseline`)"
    );
    let p = p.with_on_unready(OnUnready::Fallback);
    let d = p.decide("svc-b", Some(&stain), cands(Availability::Unready));
    assert_eq!(d.candidates().unwrap(), ["b"]);
    // Ejected instances are absent: the fallback applies whatever `on_unready` says.
    let d = Policy::seed_000().decide("svc-b", Some(&stain), cands(Availability::Ejected));
    assert_eq!(d.candidates().unwrap(), ["b"]);
}

#[test]
fn no_match_error_names_service_lane_and_policy() {
    let p = Policy::new();
    let stain = Stain::in_lane(lane("canary"));
    let l = labels(&[]);
    let d = p.decide(
        "svc-b",
        Some(&stain),
        [Candidate::new(1, &l, Availability::Ready)],
    );
    let err = d.error().unwrap();
    assert_eq!(
        err.to_string(),
        "no instance of `svc-b` fits lane `canary` (policy `default`, fallback `none`)"
    );
    assert_eq!(err.service(), "svc-b");
    assert_eq!(err.lane().unwrap(), "canary");
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["outcome"]["unroutable"]["reason"], "nomatch");
}

#[test]
fn seed_000_table_row() {
    let p = Policy::seed_000().with_own_lane(Some(lane("gray")));
    let carriers = Carriers::new().with(PlainHeader::flag(
        HeaderName::from_static("gray"),
        lane("gray"),
    ));
    let both = [
        ("base", labels(&[("gray", "false")])),
        ("bad", labels(&[("gray", "maybe")])),
        ("none", labels(&[])),
        ("gray", labels(&[("gray", "TRUE")])),
    ];
    let stain = |h: &[(&'static str, &'static str)]| carriers.extract(&headers(h));
    // gray → gray
    let gray = stain(&[("gray", "True")]);
    assert_eq!(route(&p, gray.as_ref(), &both).unwrap(), ["gray"]);
    // gray, no gray instance → baseline
    assert_eq!(
        route(&p, gray.as_ref(), &both[..3]).unwrap(),
        ["base", "bad", "none"]
    );
    // false / garbage → baseline only
    for h in [[("gray", "false")], [("gray", "FALSE")], [("gray", "yes")]] {
        let c = stain(&h).unwrap_or_default();
        assert_eq!(route(&p, Some(&c), &both).unwrap(), ["base", "bad", "none"]);
    }
    // baseline with only gray instances → error
    assert!(route(&p, Some(&Stain::baseline()), &both[3..]).is_none());
    // absent → the caller's own flag: no stain at all, or the unstained one a server
    // layer gives a request without the header
    let absent = carriers.extract_or(&headers(&[]), &Stain::default());
    assert!(absent.is_unstained());
    for absent in [None, Some(&absent)] {
        assert_eq!(route(&p, absent, &both).unwrap(), ["gray"]);
        let base_caller = Policy::seed_000();
        assert_eq!(
            route(&base_caller, absent, &both).unwrap(),
            ["base", "bad", "none"]
        );
    }
}

#[test]
fn seed_001_table_row() {
    let p = Policy::seed_001();
    let carriers = Carriers::new().with(PlainHeader::version(HeaderName::from_static("version")));
    let inst = [
        ("v1", labels(&[("version", "1.0")])),
        ("v2", labels(&[("version", "2.0")])),
        ("any", labels(&[])),
    ];
    let c = carriers.extract(&headers(&[("version", "2.0")]));
    assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v2", "any"]);
    let c = carriers.extract(&headers(&[]));
    assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v1", "v2", "any"]);
    let c = carriers.extract(&headers(&[("version", "3.0")]));
    assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["any"]);
    assert!(route(&p, c.as_ref(), &inst[..2]).is_none());
    // The global switch.
    let off = Policy::seed_001().with_enabled(false);
    let c = carriers.extract(&headers(&[("version", "2.0")]));
    assert_eq!(route(&off, c.as_ref(), &inst).unwrap(), ["v1", "v2", "any"]);
}

#[test]
fn seed_002_table_row() {
    let p = Policy::seed_002();
    let carriers = Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
    let inst = [
        ("v2", labels(&[("version", "v2")])),
        ("v3", labels(&[("version", "v3")])),
        ("plain", labels(&[])),
    ];
    let h = headers(&[("x-gray-info", r#"{"all":"v2","custom":{"svc-b":"v3"}}"#)]);
    let c = carriers.extract(&h);
    assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v3"], "custom wins");
    let h = headers(&[("x-gray-info", r#"{"all":"v2"}"#)]);
    let c = carriers.extract(&h);
    assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v2"]);
    let h = headers(&[("x-gray-info", r#"{"all":"v9"}"#)]);
    let c = carriers.extract(&h);
    assert_eq!(
        route(&p, c.as_ref(), &inst).unwrap(),
        ["v2", "v3", "plain"],
        "no match → all"
    );
    // Absent header: the default rule from config is a stain the caller supplies.
    let default_rule = Stain::pinned(Pins::all(v("v2")));
    assert_eq!(route(&p, Some(&default_rule), &inst).unwrap(), ["v2"]);
    assert_eq!(route(&p, None, &inst).unwrap(), ["v2", "v3", "plain"]);
}

#[test]
fn seed_003_table_row() {
    let p = Policy::seed_003();
    let carriers = Carriers::new().with(PlainHeader::flag(
        HeaderName::from_static("x-gray-flag"),
        lane("gray"),
    ));
    let inst = [
        ("g", labels(&[("gray", "true")])),
        ("b", labels(&[("gray", "false")])),
        ("n", labels(&[])),
    ];
    let gray = carriers.extract(&headers(&[("x-gray-flag", "true")]));
    let base = carriers.extract(&headers(&[("x-gray-flag", "false")]));
    assert_eq!(route(&p, gray.as_ref(), &inst).unwrap(), ["g"]);
    assert_eq!(route(&p, base.as_ref(), &inst).unwrap(), ["b", "n"]);
    assert_eq!(route(&p, gray.as_ref(), &inst[1..]).unwrap(), ["b", "n"]);
    assert_eq!(
        route(&p, base.as_ref(), &inst[..1]).unwrap(),
        ["g"],
        "→ all"
    );
}

#[test]
fn seed_004_table_row() {
    let p = Policy::seed_004();
    let inst = [
        ("a", labels(&[("versions", "1.0,2.0")])),
        ("b", labels(&[("versions", "2.0")])),
        ("c", labels(&[])),
    ];
    let pinned = |s| Stain::pinned(Pins::all(v(s)));
    assert_eq!(route(&p, Some(&pinned("1.0")), &inst).unwrap(), ["a"]);
    assert_eq!(route(&p, Some(&pinned("2.0")), &inst).unwrap(), ["a", "b"]);
    assert!(route(&p, Some(&pinned("3.0")), &inst).is_none());
    assert_eq!(
        route(&p, Some(&Stain::baseline()), &inst).unwrap(),
        ["a", "b", "c"]
    );
}

#[test]
fn wildcard_instances_serve_every_lane() {
    let p = Policy::new().with_unlabelled(Unlabelled::Wildcard);
    let inst = [
        ("blue", labels(&[("lane", "blue")])),
        ("plain", labels(&[])),
    ];
    let stain = Stain::in_lane(lane("green"));
    assert_eq!(route(&p, Some(&stain), &inst).unwrap(), ["plain"]);
    let stain = Stain::in_lane(lane("blue"));
    assert_eq!(route(&p, Some(&stain), &inst).unwrap(), ["blue", "plain"]);
    assert_eq!(
        route(&p, Some(&Stain::baseline()), &inst).unwrap(),
        ["plain"]
    );
}

// === configuration ===

/// The error of reading `text` as a policy, through the loader.
fn config_error(text: &str) -> config::ConfigError {
    config::from_str::<Policy>(text, Format::Json, "policy.json").unwrap_err()
}

#[test]
fn config_values_are_checked_at_their_field_and_line() {
    for (text, field, message) in [
        (
            "{\n\"preset\": \"seed-9\"}",
            "preset",
            "expected one of `seed-000`, `seed-001`, `seed-002`, `seed-003`, `seed-004`, found \"seed-9\"",
        ),
        ("{\n\"lane_key\": \"\"}", "lane_key", "expected a label key"),
        (
            "{\n\"lane_key\": true}",
            "lane_key",
            "invalid type: boolean `true`",
        ),
        ("{\n\"name\": \"\"}", "name", "expected a name of 1 to 128"),
        (
            "{\n\"flag_lane\": \"a b\"}",
            "flag_lane",
            "expected a lane name",
        ),
        (
            "{\n\"own_lane\": \"a/b\"}",
            "own_lane",
            "expected a lane name",
        ),
        (
            "{\n\"unlabelled\": \"x\"}",
            "unlabelled",
            "unknown variant `x`, expected `baseline` or `wildcard`",
        ),
        (
            "{\n\"on_unready\": \"x\"}",
            "on_unready",
            "unknown variant `x`, expected `fail` or `fallback`",
        ),
        (
            "{\n\"flag_values\": \"strict\"}",
            "flag_values",
            "unknown variant `strict`, expected `lenient` or `exact`",
        ),
        (
            "{\n\"fallback\": \"sometimes\"}",
            "fallback",
            "unknown variant `sometimes`, expected one of `none`, `baseline`, `any`",
        ),
        (
            "{\n\"enabled\": \"yes\"}",
            "enabled",
            "invalid type: string \"yes\", expected a boolean",
        ),
        (
            "{\n\"fallbak\": \"any\"}",
            "fallbak",
            "unknown field `fallbak`, expected one of `name`, `preset`",
        ),
        (
            "{\"fallback\": \"any\",\n\"fallback\": \"none\"}",
            "fallback",
            "duplicate field `fallback`",
        ),
    ] {
        let err = config_error(text);
        assert_eq!(err.field(), Some(field), "{text}: {err}");
        assert_eq!(err.line(), Some(2), "{text}: {err}");
        assert!(err.message().starts_with(message), "{text}: {err}");
        assert!(err.to_string().starts_with("policy.json:2:"), "{err}");
    }
}

#[test]
fn config_cross_field_checks_name_the_field() {
    let err = |json: &str| {
        serde_json::from_str::<Policy>(json)
            .unwrap_err()
            .to_string()
    };
    assert!(err(r#"{"lane_key":"k","flag_key":"k"}"#).contains("field `flag_key`"));
    assert!(err(r#"{"version_key":"k","versions_key":"k"}"#).contains("field `versions_key`"));
    // The same checks on a config built in code.
    let c = PolicyConfig {
        preset: Some("seed-9".into()),
        ..PolicyConfig::default()
    };
    let e = Policy::try_from(c).unwrap_err();
    assert_eq!(e.field(), "preset");
    assert_eq!(
        e.to_string(),
        "invalid matching policy: field `preset`: expected one of `seed-000`, `seed-001`, \
         `seed-002`, `seed-003`, `seed-004`, found \"seed-9\""
    );
    let c = PolicyConfig {
        own_lane: Some(Some("a b".into())),
        ..PolicyConfig::default()
    };
    assert_eq!(Policy::try_from(c).unwrap_err().field(), "own_lane");
    let c = PolicyConfig {
        versions_key: Some(Some(String::new())),
        ..PolicyConfig::default()
    };
    assert_eq!(Policy::try_from(c).unwrap_err().field(), "versions_key");
}

#[test]
fn config_overrides_the_preset() {
    let p: Policy = serde_json::from_str(
        r#"{"preset":"seed-003","name":"edge","lane_key":"lane","version_key":null,"unlabelled":"wildcard","on_unready":"fallback","enabled":false}"#,
    )
    .unwrap();
    assert_eq!(p.name(), "edge");
    assert_eq!(p.unlabelled(), Unlabelled::Wildcard);
    assert_eq!(p.on_unready(), OnUnready::Fallback);
    assert_eq!(p.fallback(), Fallback::Any, "from the preset");
    assert!(!p.is_enabled());
    assert!(p.reads_lanes() && !p.reads_versions());
    let p: Policy = serde_json::from_str("{}").unwrap();
    assert_eq!(p, Policy::new());
    // `false` switches a label key off where the format has no null (TOML), and
    // `own_lane` back to none.
    let p: Policy =
        serde_json::from_str(r#"{"lane_key":false,"flag_key":false,"own_lane":false}"#).unwrap();
    assert!(!p.reads_lanes());
    assert_eq!(p.own_lane(), None);
}

#[test]
fn every_preset_is_named_and_round_trips_through_its_config() {
    for name in presets::PRESETS {
        assert!(
            presets::EXPECTED_PRESET.contains(&format!("`{name}`")),
            "{name}"
        );
        let preset = Policy::preset(name).unwrap();
        assert_eq!(preset.name(), *name);
        let config = PolicyConfig::from(&preset);
        let json = serde_json::to_string(&config).unwrap();
        let back: Policy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, preset, "{json}");
    }
    let own = Policy::seed_000().with_own_lane(Some(lane("gray")));
    assert_eq!(Policy::try_from(PolicyConfig::from(&own)).unwrap(), own);
}
