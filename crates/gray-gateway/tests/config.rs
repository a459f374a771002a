//! Every configuration mistake is refused with the file, the line and the field (issue 10).

use std::path::Path;

use gray_gateway::config::Config;

/// A valid head every case appends to.
const HEAD: &str = "listen = \"127.0.0.1:8080\"\n";

/// `(what, text after HEAD, line, field, words of the message)`.
const MISTAKES: &[(&str, &str, usize, &str, &str)] = &[
    (
        "unknown top-level key",
        "listen_port = 3\n[services.a]\n",
        2,
        "listen_port",
        "unknown field `listen_port`, expected one of",
    ),
    (
        "unknown key in a service table",
        "[services.orders]\npick = \"round-robin\"\nfalback = \"any\"\n",
        4,
        "services.orders.falback",
        "unknown field `falback`, expected one of `pick`, `retry`, `health_check`, `protocol`, `tls`, `strip_prefix`, `rollout`, `mirror`, `name`, `preset`",
    ),
    (
        "unknown key in a rollout table",
        "[services.orders]\n[services.orders.rollout]\nrule = \"canary\"\nhold_secs = 3\n",
        5,
        "services.orders.rollout.hold_secs",
        "unknown field `hold_secs`, expected one of `rule`, `steps`, `hold_ms`",
    ),
    (
        "a rollout's steps that do not end at 100",
        "[services.orders]\n[services.orders.rollout]\nrule = \"canary\"\nsteps = [5, 50]\n",
        5,
        "services.orders.rollout.steps[1]",
        "the last step must be 100",
    ),
    (
        "a rollout table with no rule",
        "[services.orders]\n[services.orders.rollout]\nsteps = [5, 100]\n",
        0,
        "services.orders.rollout.rule",
        "rule",
    ),
    (
        "an unknown key of [rollouts]",
        "[rollouts]\nstate_directory = \"x\"\n[services.orders]\n",
        3,
        "rollouts.state_directory",
        "unknown field `state_directory`",
    ),
    (
        "misspelt preset key",
        "[services.orders]\npresett = \"seed-000\"\n",
        3,
        "services.orders.presett",
        "unknown field `presett`",
    ),
    (
        "wrong fallback",
        "[services.orders]\nfallback = \"sometimes\"\n",
        3,
        "services.orders.fallback",
        "unknown variant `sometimes`, expected one of `none`, `baseline`, `any`",
    ),
    (
        "wrong pick",
        "[services.orders]\npick = \"random\"\n",
        3,
        "services.orders.pick",
        "unknown variant `random`, expected one of `peak-ewma`, `pending-requests`, `round-robin`",
    ),
    (
        "wrong unlabelled",
        "[services.orders]\nunlabelled = \"maybe\"\n",
        3,
        "services.orders.unlabelled",
        "unknown variant `maybe`",
    ),
    (
        "wrong on_unready",
        "[services.orders]\non_unready = \"wait\"\n",
        3,
        "services.orders.on_unready",
        "unknown variant `wait`",
    ),
    (
        "wrong flag_values",
        "[services.orders]\nflag_values = \"fuzzy\"\n",
        3,
        "services.orders.flag_values",
        "unknown variant `fuzzy`",
    ),
    (
        "unknown preset",
        "[services.orders]\npreset = \"seed-9\"\n",
        3,
        "services.orders.preset",
        "expected one of `seed-000`",
    ),
    (
        "own_lane at the edge",
        "[services.orders]\nown_lane = \"gray\"\n",
        3,
        "services.orders.own_lane",
        "a gateway has no own lane",
    ),
    (
        "two keys that must differ",
        "[services.orders]\nlane_key = \"k\"\nflag_key = \"k\"\n",
        4,
        "services.orders.flag_key",
        "different from `lane_key`",
    ),
    (
        "wrong forwarded_header",
        "forwarded_header = \"x-real-ip\"\n[services.a]\n",
        2,
        "forwarded_header",
        "unknown variant `x-real-ip`, expected `x-forwarded-for` or `forwarded`",
    ),
    (
        "unknown carrier kind",
        "carriers = [{ kind = \"lane\" },\n  { kind = \"colour\" }]\n[services.a]\n",
        3,
        "carriers[1].kind",
        "unknown variant `colour`, expected one of `flag`, `lane`, `version`, `route`, `baggage`",
    ),
    (
        "unknown key in a carrier",
        "carriers = [\n  { kind = \"lane\", key = \"x\" },\n]\n[services.a]\n",
        3,
        "carriers[0].key",
        "unknown field `key`, expected `header` or `max_len`",
    ),
    (
        // The entry's line: serde buffers an internally tagged entry before reading it.
        "invalid carrier header",
        "[[carriers]]\nkind = \"flag\"\nheader = \"a b\"\n[services.a]\n",
        2,
        "carriers[0]",
        "expected a valid HTTP header name",
    ),
    (
        "invalid strip header",
        "strip = [\"x-ok\", \"not ok\"]\n[services.a]\n",
        2,
        "strip[1]",
        "expected a valid HTTP header name, found \"not ok\"",
    ),
    (
        "invalid trusted CIDR",
        "trusted_clients = [\"nope\"]\n[services.a]\n",
        2,
        "trusted_clients",
        "nope",
    ),
    (
        "header limit below hyper's buffer",
        "max_header_bytes = 100\n[services.a]\n",
        2,
        "max_header_bytes",
        "expected at least 8192",
    ),
    (
        "no connection allowed",
        "max_connections = 0\n[services.a]\n",
        2,
        "max_connections",
        "expected at least 1",
    ),
    (
        "a timeout that is not a number",
        "header_read_timeout_ms = \"10s\"\n[services.a]\n",
        2,
        "header_read_timeout_ms",
        "invalid type: string \"10s\", expected u64",
    ),
    (
        "no service",
        "admin = \"127.0.0.1:9901\"\n",
        0,
        "services",
        "expected at least one `[services.<name>]` table",
    ),
];

#[test]
fn every_mistake_names_file_line_and_field() {
    for (what, text, line, field, words) in MISTAKES {
        let e = Config::parse(&format!("{HEAD}{text}"), Path::new("conf/gw.toml"))
            .map(|_| ())
            .unwrap_err();
        let shown = e.to_string();
        assert_eq!(e.source_name(), "conf/gw.toml", "{what}: {shown}");
        if *line > 0 {
            assert_eq!(e.line(), Some(*line), "{what}: {shown}");
            assert!(
                shown.starts_with(&format!("conf/gw.toml:{line}:")),
                "{what}: {shown}"
            );
        }
        assert_eq!(e.field(), Some(*field), "{what}: {shown}");
        assert!(e.message().contains(words), "{what}: {shown}");
    }
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_table_mistakes_name_their_line_and_field() {
    for (what, text, line, field, words) in [
        (
            "unknown key in [etcd]",
            "[services.a]\n[etcd]\nendpoints = [\"x:1\"]\nusr = \"gray\"\n",
            5,
            "etcd.usr",
            "unknown field `usr`",
        ),
        (
            "unknown key in [etcd.tls]",
            "[services.a]\n[etcd]\nendpoints = [\"x:1\"]\n[etcd.tls]\nca = \"ca.pem\"\n",
            6,
            "etcd.tls.ca",
            "unknown field `ca`",
        ),
        (
            "user without password",
            "[services.a]\n[etcd]\nendpoints = [\"x:1\"]\nuser = \"gray\"\n",
            5,
            "etcd.user",
            "given without `password`",
        ),
        (
            "rules twice",
            "rules = \"r.toml\"\n[services.a]\n[etcd]\nendpoints = [\"x:1\"]\nrules_key = \"/gray/rules\"\n",
            6,
            "etcd.rules_key",
            "give either `rules` or `etcd.rules_key`",
        ),
    ] {
        let e = Config::parse(&format!("{HEAD}{text}"), Path::new("gw.toml"))
            .map(|_| ())
            .unwrap_err();
        let shown = e.to_string();
        println!("{shown}");
        assert_eq!(e.line(), Some(line), "{what}: {shown}");
        assert_eq!(e.field(), Some(field), "{what}: {shown}");
        assert!(e.message().contains(words), "{what}: {shown}");
    }
}

/// Runs in every build: with the `etcd` feature the table is read, without it the refusal
/// names the table's line and the feature (the refusal itself is tested with the feature
/// off in the crate's unit tests, which CI's build with every feature runs).
#[test]
fn an_etcd_table_is_read_or_refused_by_the_feature() {
    let parsed = Config::parse(
        &format!("{HEAD}[services.a]\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n"),
        Path::new("gw.toml"),
    );
    if cfg!(feature = "etcd") {
        // (Debug: `Discovery::Etcd` exists only with the feature.)
        let discovery = format!("{:?}", parsed.expect("read with the feature").discovery);
        assert!(
            discovery.starts_with("Etcd(") && discovery.contains("127.0.0.1:2379"),
            "{discovery}"
        );
    } else {
        let e = parsed.unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(3), Some("etcd")), "{e}");
        assert!(e.message().contains("`etcd` feature"), "{e}");
    }
}
