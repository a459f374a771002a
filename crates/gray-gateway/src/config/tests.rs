use std::{path::Path, time::Duration};

use gray_balance::{
    Pick,
    health::{Ejection, Probe},
    retry::RetryPolicy,
};
use gray_config::Document;
use gray_core::CarrierConfig;
use gray_tower::edge::ForwardedHeader;

use super::{parse::needs_feature, *};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("gw.toml"))
}

#[test]
fn a_full_config_parses() {
    let cfg = Config::parse(
        r#"
listen = "127.0.0.1:8080"
admin = "127.0.0.1:9901"
trusted_clients = ["127.0.0.1/32"]
forwarded_header = "forwarded"
strip = ["x-internal"]
carriers = [{ kind = "flag" }, { kind = "lane" }]
rules = "rules.toml"
instances = "/abs/instances.toml"
max_connections = 5
release_buffers_above = 0
idle_timeout_ms = 0
[services.orders]
preset = "seed-000"
fallback = "baseline"
pick = "round-robin"
[services.stock]
"#,
        Path::new("/etc/gray/gateway.toml"),
    )
    .unwrap();
    assert!(matches!(&cfg.rules, Rules::File(p) if p == Path::new("/etc/gray/rules.toml")));
    assert!(
        matches!(cfg.discovery, Discovery::File(ref p) if p == Path::new("/abs/instances.toml"))
    );
    assert_eq!(cfg.forwarded_header, ForwardedHeader::Forwarded);
    assert_eq!(cfg.strip, ["x-internal"]);
    assert_eq!(cfg.carriers.len(), 2);
    assert_eq!(cfg.limits.max_connections, 5);
    assert_eq!(cfg.limits.release_buffers_above, 0);
    assert_eq!(cfg.limits.idle_timeout, None);
    assert_eq!(
        cfg.limits.header_read_timeout,
        Some(Duration::from_secs(10))
    );
    let orders = &cfg.services[0];
    assert_eq!(
        (orders.name.as_str(), orders.pick),
        ("orders", Pick::RoundRobin)
    );
    // Named after the preset, not the service; without a preset, `default`.
    assert_eq!(orders.policy.name(), "seed-000");
    assert_eq!(cfg.services[1].policy.name(), "default");
}

#[test]
fn defaults() {
    let cfg = parse("listen = \"127.0.0.1:1\"\n[services.a]\n").unwrap();
    assert_eq!(cfg.limits, Limits::default());
    assert!(cfg.reject_prefix_escape);
    assert_eq!(cfg.forwarded_header, ForwardedHeader::XForwardedFor);
    let headers: Vec<&str> = cfg.carriers.iter().map(|c| c.header().as_str()).collect();
    assert_eq!(headers, ["x-gray-lane", "x-gray-info"]);
    assert!(matches!(cfg.discovery, Discovery::Embedded));
    assert!(matches!(cfg.rules, Rules::None));
}

#[test]
fn the_default_carriers_are_the_library_defaults() {
    use gray_core::{Carriers, Lane, Pins, Stain, Version};

    let ours = CarrierConfig::carriers(&default_carriers());
    let library = Carriers::default();
    let names = |c: &Carriers| {
        c.iter()
            .map(|c| c.header_name().clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&ours), ["x-gray-lane", "x-gray-info"]);
    assert_eq!(names(&ours), names(&library));
    // The same kinds: they write a lane and pins alike, and read back what they wrote.
    let stain = Stain::in_lane(Lane::new("gray").unwrap())
        .with_pins(Pins::all(Version::new("v2").unwrap()));
    let (mut a, mut b) = (http::HeaderMap::new(), http::HeaderMap::new());
    ours.inject(&stain, &mut a);
    library.inject(&stain, &mut b);
    assert_eq!(a, b);
    assert_eq!(a.len(), 2);
    assert_eq!(ours.extract(&b), Some(stain));
}

/// What a binary built without `etcd` (or `etcd-tls`) answers for those tables: the check
/// `Config::parse` makes with `cfg!(feature = ..)`, made here with the feature off, so that
/// the build with every feature (CI's) runs it too.
#[test]
fn a_table_needs_its_feature() {
    let text = "listen = \"127.0.0.1:1\"\n[services.a]\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[etcd.tls]\nca_file = \"ca.pem\"\n";
    let doc = Document::new(text, gray_config::Format::Toml, "gw.toml");
    let e = needs_feature(&doc, "etcd", "etcd", false).unwrap_err();
    assert_eq!((e.line(), e.field()), (Some(3), Some("etcd")), "{e}");
    assert_eq!(
        e.message(),
        "the `[etcd]` table needs gray-gateway's `etcd` feature, which this binary was built \
         without (cargo build -p gray-gateway --features etcd)"
    );
    let e = needs_feature(&doc, "etcd.tls", "etcd-tls", false).unwrap_err();
    assert_eq!((e.line(), e.field()), (Some(5), Some("etcd.tls")), "{e}");
    assert!(e.message().contains("`etcd-tls` feature"), "{e}");
    assert!(needs_feature(&doc, "etcd", "etcd", true).is_ok());

    // The whole path, in this build: used with the feature, refused without it.
    let parsed = parse(&text[..text.find("[etcd.tls]").unwrap()]);
    if cfg!(feature = "etcd") {
        // (Debug: `Discovery::Etcd` exists only with the feature.)
        let discovery = format!("{:?}", parsed.unwrap().discovery);
        assert!(discovery.starts_with("Etcd("), "{discovery}");
    } else {
        let e = parsed.unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(3), Some("etcd")), "{e}");
    }
}

#[cfg(feature = "etcd")]
#[test]
fn the_etcd_table_maps_onto_etcd_config() {
    let cfg = parse(
        r#"listen = "127.0.0.1:1"
[services.a]
[etcd]
endpoints = ["http://127.0.0.1:2379"]
prefix = "/apps/"
rules_key = "/apps/rules.yaml"
keep_alive_interval_ms = 0
user = "gray"
password = "secret"
"#,
    )
    .unwrap();
    let Discovery::Etcd(etcd) = &cfg.discovery else {
        panic!("{:?}", cfg.discovery)
    };
    assert_eq!(etcd.prefix, "/apps/");
    assert_eq!(etcd.client.user(), Some("gray"));
    assert_eq!(etcd.client.keep_alive(), None);
    assert!(matches!(&cfg.rules, Rules::Etcd(_, key) if key == "/apps/rules.yaml"));

    let both = parse(
        "listen = \"127.0.0.1:1\"\ninstances = \"i.toml\"\n[services.a]\n[etcd]\nendpoints = [\"x:1\"]\n",
    )
    .unwrap_err();
    assert_eq!(both.field(), Some("etcd"), "{both}");
}

#[test]
fn retry_and_health_check_tables() {
    use gray_balance::health::Check;

    let cfg = parse(
        r#"listen = "127.0.0.1:1"
[services.a]
retry = { budget_percent = 10, max_retries = 1, methods = ["get", "PUT"], max_replay_bytes = 1024 }
health_check = { path = "/healthz", interval_ms = 500, max_interval_ms = 4000, timeout_ms = 300, max_fails = 3 }
[services.b]
retry = { enabled = false }
health_check = { kind = "grpc", grpc_service = "orders" }
[services.c]
"#,
    )
    .unwrap();
    let a = &cfg.services[0];
    assert_eq!(a.retry.budget_percent(), 10);
    assert_eq!(a.retry.max_retries(), 1);
    assert_eq!(a.retry.idempotent(), [http::Method::GET, http::Method::PUT]);
    assert_eq!(a.retry.max_replay_bytes(), 1024);
    assert_eq!(
        a.probe.check(),
        &Check::Http {
            path: "/healthz".into()
        }
    );
    assert_eq!(a.probe.timeout(), Duration::from_millis(300));
    assert_eq!(a.ejection.consecutive(), 3);
    assert_eq!(a.ejection.backoff().min(), Duration::from_millis(500));
    assert_eq!(a.ejection.backoff().max(), Duration::from_secs(4));
    let b = &cfg.services[1];
    assert_eq!(b.retry.max_retries(), 0);
    assert_eq!(
        b.probe.check(),
        &Check::Grpc {
            service: "orders".into()
        }
    );
    // Without the tables: retries as nginx's `proxy_next_upstream error`, a connect probe.
    let c = &cfg.services[2];
    assert_eq!(c.retry, RetryPolicy::new());
    assert_eq!(c.probe, Probe::connect());
    assert_eq!(c.ejection, Ejection::new());
}

#[test]
fn retry_and_health_check_mistakes_name_their_line_and_field() {
    for (text, line, field) in [
        (
            "listen = \"127.0.0.1:1\"\n[services.a]\nretry = { budget = 20 }\n",
            3,
            "services.a.retry.budget",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[services.a]\nhealth_check = { kind = \"tcp\" }\n",
            3,
            "services.a.health_check.kind",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[services.a]\n\n[services.a.health_check]\nkind = \"connect\"\npath = \"/healthz\"\n",
            6,
            "services.a.health_check.path",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[services.a]\nretry = { methods = [\"GET\", \"BAD METHOD\"] }\n",
            3,
            "services.a.retry.methods[1]",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[services.a]\nhealth_check = { interval_ms = 500, max_interval_ms = 100 }\n",
            3,
            "services.a.health_check.max_interval_ms",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[rollouts]\npartition_hold_ms = 0\n[services.a]\n",
            3,
            "rollouts.partition_hold_ms",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[rollouts]\nlease_ttl_ms = 500\n[services.a]\n",
            3,
            "rollouts.lease_ttl_ms",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[rollouts]\nsave_every_ms = 0\n[services.a]\n",
            3,
            "rollouts.save_every_ms",
        ),
        (
            "listen = \"127.0.0.1:1\"\n[rollouts]\nreport_every_ms = 0\n[services.a]\n",
            3,
            "rollouts.report_every_ms",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(line), Some(field)), "{e}");
        assert!(e.to_string().starts_with("gw.toml:"), "{e}");
    }
}

#[test]
fn upstream_protocol_and_tls() {
    use gray_discovery::http::Protocol;
    let cfg = parse("listen = \"127.0.0.1:1\"\n[services.a]\n[services.b]\nprotocol = \"h2c\"\n[services.c]\nprotocol = \"auto\"\ntls = { insecure_skip_verify = true, server_name = \"c.internal\" }\n").unwrap();
    let [a, b, c] = &cfg.services[..] else {
        panic!("three services")
    };
    assert_eq!(
        (a.transport.protocol, a.transport.tls.is_none()),
        (Protocol::Http1, true)
    );
    assert_eq!(b.transport.protocol, Protocol::Http2);
    assert_eq!(c.transport.protocol, Protocol::Auto);
    assert!(c.transport.insecure);
    assert!(
        c.transport
            .tls
            .as_ref()
            .is_some_and(gray_discovery::http::Tls::every_instance)
    );

    // Each mistake names its file, line and field.
    let dir = std::env::temp_dir().join(format!("gray-gw-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("empty.pem"), "not a certificate\n").unwrap();
    let gw = dir.join("gw.toml");
    for (keys, field, says) in [
        (
            "protocol = \"h3\"",
            "services.a.protocol",
            "unknown variant `h3`",
        ),
        (
            "protocol = \"h2c\"\ntls = {}",
            "services.a.protocol",
            "use `h2`",
        ),
        (
            "tls = { ca_file = \"missing.pem\" }",
            "services.a.tls.ca_file",
            "missing.pem",
        ),
        (
            "tls = { ca_file = \"empty.pem\" }",
            "services.a.tls.ca_file",
            "no PEM certificate",
        ),
        (
            "tls = { cert_file = \"empty.pem\" }",
            "services.a.tls.cert_file",
            "needs `key_file`",
        ),
        (
            "tls = { key_file = \"empty.pem\" }",
            "services.a.tls.key_file",
            "needs `cert_file`",
        ),
        (
            "tls = { server_name = \"not a name\" }",
            "services.a.tls.server_name",
            "DNS name",
        ),
        (
            "tls = { insecure_skip_verify = true, ca_file = \"empty.pem\" }",
            "services.a.tls.ca_file",
            "would not be used",
        ),
        (
            "tls = { verify = false }",
            "services.a.tls.verify",
            "unknown field",
        ),
    ] {
        let text = format!("listen = \"127.0.0.1:1\"\n[services.a]\n{keys}\n");
        let err = Config::parse(&text, &gw).unwrap_err();
        assert_eq!(err.field(), Some(field), "{keys}: {err}");
        assert!(err.line().is_some(), "{keys}: {err}");
        assert!(err.to_string().contains(says), "{keys}: {err}");
        assert!(err.to_string().contains("gw.toml"), "{keys}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn client_limits_parse_and_their_mistakes_name_their_field() {
    let cfg = parse(
        "listen = \"127.0.0.1:1\"\nrequest_body_timeout_ms = 0\nsend_timeout_ms = 5000\n\
         max_in_flight_per_client = 64\nhttp2_max_concurrent_streams = 10\n\
         http2_stream_window = 65535\nupstream_max_connects = 2\n[services.a]\n",
    )
    .unwrap();
    assert_eq!(cfg.limits.request_body_timeout, None);
    assert_eq!(cfg.limits.send_timeout, Some(Duration::from_secs(5)));
    assert_eq!(cfg.limits.max_in_flight_per_client, 64);
    assert_eq!(cfg.limits.http2_max_concurrent_streams, 10);
    assert_eq!(cfg.limits.http2_stream_window, 65_535);
    assert_eq!(cfg.limits.upstream_max_connects, 2);
    for (key, field) in [
        ("http2_stream_window = 1024", "http2_stream_window"),
        (
            "http2_connection_window = 2147483648",
            "http2_connection_window",
        ),
        (
            "http2_max_concurrent_streams = 0",
            "http2_max_concurrent_streams",
        ),
        ("upstream_max_connects = 0", "upstream_max_connects"),
        ("upstream_buffer_bytes = 100", "upstream_buffer_bytes"),
        (
            "max_cancelled_streams_percent = 101",
            "max_cancelled_streams_percent",
        ),
    ] {
        let e = parse(&format!("listen = \"127.0.0.1:1\"\n{key}\n[services.a]\n")).unwrap_err();
        assert_eq!((e.line(), e.field()), (Some(2), Some(field)), "{e}");
    }
}

#[test]
fn rollouts_shared_settings_default_and_parse() {
    let cfg = parse("listen = \"127.0.0.1:1\"\n[services.a]\n").unwrap();
    assert_eq!(
        (cfg.rollouts.partition_hold, cfg.rollouts.lease_ttl),
        (Duration::from_secs(30), Duration::from_secs(5))
    );
    let cfg = parse(
        "listen = \"127.0.0.1:1\"\n[rollouts]\npartition_hold_ms = 2500\nlease_ttl_ms = 3000\n[services.a]\n",
    )
    .unwrap();
    assert_eq!(
        (cfg.rollouts.partition_hold, cfg.rollouts.lease_ttl),
        (Duration::from_millis(2500), Duration::from_secs(3))
    );
}

#[test]
fn a_mirror_table_parses_with_its_defaults_and_refuses_what_cannot_work() {
    let cfg = parse(
        "listen = \"127.0.0.1:0\"\n[services.orders.mirror]\nlane = \"Gray\"\n[services.stock]\n",
    )
    .unwrap();
    let mirror = cfg.services[0].mirror.as_ref().unwrap();
    assert_eq!(mirror.lane.as_str(), "gray");
    assert_eq!(mirror.percent, 100.0);
    assert_eq!(mirror.methods, [http::Method::GET, http::Method::HEAD]);
    assert_eq!(
        (mirror.max_body_bytes, mirror.max_in_flight, mirror.timeout),
        (65_536, 256, Duration::from_secs(5))
    );
    assert_eq!(
        (mirror.control_percent, mirror.alpha, mirror.noise_min),
        (20.0, 0.05, 2)
    );
    assert!(cfg.services[1].mirror.is_none());

    for (keys, field, says) in [
        ("lane = \"baseline\"", "lane", "another lane than baseline"),
        ("lane = \"a b\"", "lane", ""),
        ("lane = \"gray\"\npercent = 101", "percent", "0 to 100"),
        (
            "lane = \"gray\"\nmethods = [\"GET\", \"CONNECT\"]",
            "methods[1]",
            "CONNECT",
        ),
        (
            "lane = \"gray\"\nmax_in_flight = 0",
            "max_in_flight",
            "at least 1",
        ),
        (
            "lane = \"gray\"\ntimeout_ms = 0",
            "timeout_ms",
            "at least 1",
        ),
        (
            "lane = \"gray\"\nignore_headers = [\"a b\"]",
            "ignore_headers[0]",
            "header name",
        ),
        (
            "lane = \"gray\"\nignore_fields = [\"ts\"]",
            "ignore_fields[0]",
            "JSON pointer",
        ),
        ("lane = \"gray\"\nlanes = 1", "lanes", "unknown field"),
        (
            "lane = \"gray\"\ncontrol_percent = -1",
            "control_percent",
            "0 to 100",
        ),
        ("lane = \"gray\"\nalpha = 1", "alpha", "between 0 and 1"),
        ("lane = \"gray\"\nnoise_min = 0", "noise_min", "at least 1"),
    ] {
        let text = format!("listen = \"127.0.0.1:0\"\n[services.orders.mirror]\n{keys}\n");
        let e = parse(&text).unwrap_err();
        let expected = format!("services.orders.mirror.{field}");
        assert_eq!(e.field(), Some(expected.as_str()), "{keys}: {e}");
        assert!(e.to_string().contains(says), "{keys}: {e}");
    }
}

#[test]
fn a_shadow_phase_needs_a_mirror() {
    let text = "listen = \"127.0.0.1:0\"\n[services.orders.rollout]\nrule = \"canary\"\nshadow = { hold_ms = 1000, min_requests = 10 }\n";
    let e = parse(text).unwrap_err();
    assert_eq!(e.field(), Some("services.orders.rollout.shadow"), "{e}");
    assert!(e.to_string().contains("mirror"), "{e}");
    let with_mirror = format!("{text}[services.orders.mirror]\nlane = \"gray\"\n");
    let cfg = parse(&with_mirror).unwrap();
    let shadow = cfg.services[0].rollout.as_ref().unwrap().shadow.unwrap();
    assert_eq!(
        (shadow.hold, shadow.min_requests),
        (Duration::from_secs(1), 10)
    );
}

#[test]
fn the_copies_priority_is_low_unless_said() {
    let cfg = parse("listen = \"127.0.0.1:0\"\n[services.orders]\n").unwrap();
    assert_eq!(cfg.mirror_priority, MirrorPriority::Low);
    let cfg = parse("listen = \"127.0.0.1:0\"\nmirror_priority = \"normal\"\n[services.orders]\n")
        .unwrap();
    assert_eq!(cfg.mirror_priority, MirrorPriority::Normal);
    let e = parse("listen = \"127.0.0.1:0\"\nmirror_priority = \"high\"\n[services.orders]\n")
        .unwrap_err();
    assert_eq!(e.field(), Some("mirror_priority"), "{e}");
}

#[test]
fn copies_are_shed_above_three_quarters_busy_unless_said() {
    let cfg = parse("listen = \"127.0.0.1:0\"\n[services.orders]\n").unwrap();
    assert!((cfg.mirror_max_busy - 0.75).abs() < 1e-9);
    let cfg = parse("listen = \"127.0.0.1:0\"\nmirror_max_busy = 1\n[services.orders]\n").unwrap();
    assert!((cfg.mirror_max_busy - 1.0).abs() < 1e-9);
    for bad in ["0", "-0.5", "1.5", "nan"] {
        let e = parse(&format!(
            "listen = \"127.0.0.1:0\"\nmirror_max_busy = {bad}\n[services.orders]\n"
        ))
        .unwrap_err();
        assert_eq!(e.field(), Some("mirror_max_busy"), "{bad}: {e}");
        assert!(e.to_string().contains("at most 1"), "{e}");
    }
}
