//! The edge layer: seed 003's whitelist through a trusted proxy, spoofing (issue 13: every
//! forged carrier, `Connection`, path forms, duplicates), trust and precedence, and the
//! client IP parsers under arbitrary input.

use std::{convert::Infallible, net::SocketAddr};

use gray_core::{
    CarrierConfig, Carriers, Lane, Stain,
    codec::{BaggageMember, PlainHeader},
};
use gray_rules::{CidrList, Format, RuleSet, path::PathErrorKind};
use gray_test_support::alloc::{Counting, measure};
use gray_tower::{
    edge::{
        ClientIpResolver, DecidedBy, EdgeDecision, EdgeLayer, ForwardedHeader, LiveRules, PeerAddr,
        Precedence, RawUri, TrustedProxies,
    },
    task,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use proptest::prelude::*;
use tower::{Service, ServiceExt, service_fn};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What the service behind the edge saw.
#[derive(Debug, Clone)]
struct Seen {
    uri: Uri,
    headers: HeaderMap,
    stain: Option<Stain>,
    task_ctx: Option<Stain>,
    decision: Option<EdgeDecision>,
    raw_uri: Option<RawUri>,
}

impl Seen {
    fn lane(&self) -> Option<String> {
        self.stain
            .as_ref()
            .and_then(|c| c.lane())
            .map(|l| l.to_string())
    }

    /// Every value of `name`, in order.
    fn values(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("text"))
            .collect()
    }
}

fn backend() -> impl Service<Request<()>, Response = Response<Seen>, Error = Infallible> + Clone {
    service_fn(|req: Request<()>| async move {
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(Response::new(Seen {
            uri: req.uri().clone(),
            headers: req.headers().clone(),
            stain: req.extensions().get::<Stain>().cloned(),
            task_ctx: task::current(),
            decision: req.extensions().get::<EdgeDecision>().cloned(),
            raw_uri: req.extensions().get::<RawUri>().cloned(),
        }))
    })
}

async fn send(layer: &EdgeLayer, req: Request<()>) -> Seen {
    let svc = tower::Layer::layer(layer, backend());
    let res = svc.oneshot(req).await.expect("infallible");
    let seen = res
        .into_body()
        .into_inner()
        .expect("passed to the service behind");
    assert_eq!(seen.stain, seen.task_ctx, "extensions and task-local agree");
    seen
}

fn request(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
    request_to(peer, "/orders?page=1", headers)
}

/// A request for `uri` (a `?q=/../%2F` query is added when it has none).
fn request_to(peer: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
    let uri = if uri.contains('?') {
        uri.to_owned()
    } else {
        format!("{uri}?q=/../%2F")
    };
    let mut req = Request::builder().uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.extension(PeerAddr(peer.parse::<SocketAddr>().expect("peer")))
        .body(())
        .expect("request")
}

fn gray() -> Lane {
    Lane::new("gray").expect("lane")
}

/// Seed 003's carriers: its flag header plus the default lane header and baggage.
fn carriers() -> Carriers {
    Carriers::default()
        .with(PlainHeader::flag(HeaderName::from_static("gray"), gray()))
        .with(BaggageMember::new("gray.lane").expect("key"))
}

fn seed003_rules(enabled: bool) -> RuleSet {
    let text = format!(
        "enabled: {enabled}\nrules:\n  - name: ip-whitelist\n    when: {{ ip: [\"127.0.0.1\", \"192.168.1.100\"] }}\n    lane: gray\n"
    );
    RuleSet::parse(&text, Format::Yaml, "joylife-gateway.yaml").expect("seed 003 rules")
}

fn seed003_edge(enabled: bool) -> EdgeLayer {
    EdgeLayer::new(seed003_rules(enabled))
        .with_carriers(carriers())
        .with_proxies(TrustedProxies::cidrs(
            CidrList::parse(["10.0.0.0/8"]).expect("cidrs"),
        ))
        .with_seed003_headers(gray())
}

#[tokio::test]
async fn seed003_whitelist_through_a_trusted_proxy_hop() {
    let edge = seed003_edge(true);
    // nginx (10.0.0.2) appended the whitelisted tester's address.
    let seen = send(
        &edge,
        request("10.0.0.2:51000", &[("x-forwarded-for", "192.168.1.100")]),
    )
    .await;
    assert_eq!(seen.stain.as_ref().and_then(|c| c.lane()), Some(&gray()));
    assert_eq!(seen.headers["x-gray-lane"], "gray");
    assert_eq!(seen.headers["gray"], "true");
    assert_eq!(seen.headers["x-gray-flag"], "true");
    assert_eq!(seen.headers["x-gray-ip"], "192.168.1.100");
    assert_eq!(seen.headers["baggage"], "gray.lane=gray");
    let d = seen.decision.expect("decision");
    assert_eq!(d.decided_by, DecidedBy::Rule);
    assert_eq!(d.rule_name.as_deref(), Some("ip-whitelist"));
    assert_eq!(d.client_ip, Some("192.168.1.100".parse().expect("ip")));

    // Everyone else is baseline, and told so downstream. The edge decides: an explicit
    // baseline, never the unstained stain a balancer's own lane would apply to.
    let seen = send(
        &edge,
        request("10.0.0.2:51000", &[("x-forwarded-for", "198.51.100.4")]),
    )
    .await;
    assert_eq!(seen.stain.expect("stain"), gray_core::Stain::baseline());
    assert_eq!(seen.headers["x-gray-flag"], "false");
    assert_eq!(seen.headers["x-gray-ip"], "198.51.100.4");
    assert!(seen.headers.get("x-gray-lane").is_none());

    // The global switch off (seed 003's `enable: false`): nobody is gray.
    let seen = send(
        &seed003_edge(false),
        request("10.0.0.2:51000", &[("x-forwarded-for", "192.168.1.100")]),
    )
    .await;
    assert!(seen.stain.expect("stain").is_baseline());
    assert_eq!(seen.headers["x-gray-flag"], "false");
}

#[tokio::test]
async fn spoofed_stains_and_forwarded_for_are_ignored_and_stripped() {
    let edge = seed003_edge(true);
    // The client (203.0.113.9) forges a whitelisted address on the left and sends every
    // stain it can think of; the trusted proxy appends its real address.
    let seen = send(
        &edge,
        request(
            "10.0.0.2:51000",
            &[
                ("x-forwarded-for", "192.168.1.100, 127.0.0.1, 203.0.113.9"),
                ("gray", "true"),
                ("x-gray-lane", "gray"),
                ("x-gray-info", r#"{"all":"v9"}"#),
                ("x-gray-flag", "true"),
                ("x-gray-ip", "192.168.1.100"),
                ("baggage", "userId=42,gray.lane=gray,tenant=acme"),
            ],
        ),
    )
    .await;
    assert!(seen.stain.expect("stain").is_baseline());
    let d = seen.decision.expect("decision");
    assert_eq!(d.client_ip, Some("203.0.113.9".parse().expect("ip")));
    assert!(!d.trusted);
    assert_eq!(d.decided_by, DecidedBy::Default);
    for stripped in ["gray", "x-gray-lane", "x-gray-info"] {
        assert!(seen.headers.get(stripped).is_none(), "{stripped} kept");
    }
    assert_eq!(seen.headers["x-gray-flag"], "false");
    assert_eq!(seen.headers["x-gray-ip"], "203.0.113.9");
    // Only the stain's baggage member goes; the others stay, in order.
    assert_eq!(seen.headers["baggage"], "userId=42,tenant=acme");

    // A client talking to the edge directly cannot claim a proxy's authority.
    let seen = send(
        &edge,
        request(
            "203.0.113.9:4000",
            &[("x-forwarded-for", "192.168.1.100"), ("gray", "TRUE")],
        ),
    )
    .await;
    assert!(seen.stain.expect("stain").is_baseline());
    assert!(seen.headers.get("gray").is_none());

    // Without seed 003 headers configured, forged ones are removed, not passed on.
    let plain = EdgeLayer::new(seed003_rules(true)).with_carriers(carriers());
    let seen = send(
        &plain,
        request(
            "203.0.113.9:4000",
            &[("x-gray-flag", "true"), ("x-gray-ip", "1.2.3.4")],
        ),
    )
    .await;
    assert!(seen.headers.get("x-gray-flag").is_none());
    assert!(seen.headers.get("x-gray-ip").is_none());
}

/// One rule: the cookie `beta=1` stains `beta`.
fn beta_cookie_rules() -> RuleSet {
    RuleSet::parse(
        r#"{"rules":[{"name":"beta","when":{"cookie":{"name":"beta","exact":"1"}},"lane":"beta"}]}"#,
        Format::Json,
        "inline",
    )
    .expect("rules")
}

#[tokio::test]
async fn the_decision_extension_can_be_left_out() {
    let rules = beta_cookie_rules();
    let with = EdgeLayer::new(rules);
    let without = with.clone().with_decision_extension(false);
    let beta = || request("10.0.0.1:1", &[("cookie", "beta=1")]);
    let seen = send(&with, beta()).await;
    assert_eq!(
        seen.decision.expect("recorded").rule_name.as_deref(),
        Some("beta")
    );
    // Without it, the stain is decided and written all the same.
    let seen = send(&without, beta()).await;
    assert!(seen.decision.is_none());
    assert_eq!(
        seen.stain
            .and_then(|c| c.lane().map(|l| l.to_string()))
            .as_deref(),
        Some("beta")
    );
    assert_eq!(seen.headers["x-gray-lane"], "beta");
}

#[tokio::test]
async fn the_task_local_stain_can_be_left_out() {
    let rules = beta_cookie_rules();
    let with = EdgeLayer::new(rules);
    let without = with.clone().with_task_local(false);
    let beta = || request("10.0.0.1:1", &[("cookie", "beta=1")]);
    // `send` checks that the task-local and the extension agree.
    let seen = send(&with, beta()).await;
    assert_eq!(
        seen.task_ctx
            .as_ref()
            .and_then(|c| c.lane())
            .map(|l| l.as_str()),
        Some("beta")
    );
    // Without it, the backend sees no task-local stain, and the decision all the same: in
    // the extension and in the headers.
    let svc = tower::Layer::layer(&without, backend());
    let res = svc.oneshot(beta()).await.expect("infallible");
    let seen = res.into_body().into_inner().expect("passed");
    assert_eq!(seen.task_ctx, None);
    assert_eq!(seen.lane().as_deref(), Some("beta"));
    assert_eq!(seen.headers["x-gray-lane"], "beta");
}

#[tokio::test]
async fn trusted_clients_and_precedence() {
    let rules = beta_cookie_rules();
    let internal = CidrList::parse(["10.20.0.0/16"]).expect("cidrs");
    let rules_first = EdgeLayer::new(rules.clone()).with_trusted_clients(internal.clone());
    let inbound_first = rules_first
        .clone()
        .with_precedence(Precedence::InboundFirst);

    let lane_of = |seen: &Seen| {
        seen.stain
            .as_ref()
            .and_then(|c| c.lane())
            .map(|l| l.to_string())
    };

    // A trusted caller's stain decides when no rule matches.
    let trusted = || request("10.20.1.1:1", &[("x-gray-lane", "canary")]);
    let seen = send(&rules_first, trusted()).await;
    assert_eq!(lane_of(&seen).as_deref(), Some("canary"));
    assert_eq!(seen.headers["x-gray-lane"], "canary");
    assert_eq!(
        seen.decision.as_ref().expect("d").decided_by,
        DecidedBy::Inbound
    );

    // Both: the rule wins by default, the stain with InboundFirst.
    let both = || {
        request(
            "10.20.1.1:1",
            &[("x-gray-lane", "canary"), ("cookie", "beta=1")],
        )
    };
    let seen = send(&rules_first, both()).await;
    assert_eq!(lane_of(&seen).as_deref(), Some("beta"));
    assert_eq!(seen.headers["x-gray-lane"], "beta");
    let seen = send(&inbound_first, both()).await;
    assert_eq!(lane_of(&seen).as_deref(), Some("canary"));

    // The same stain from an untrusted client is stripped; its rule still applies.
    let seen = send(
        &inbound_first,
        request("10.21.0.1:1", &[("x-gray-lane", "canary")]),
    )
    .await;
    assert_eq!(lane_of(&seen), None);
    assert!(seen.headers.get("x-gray-lane").is_none());
    let seen = send(
        &inbound_first,
        request(
            "10.21.0.1:1",
            &[("x-gray-lane", "canary"), ("cookie", "beta=1")],
        ),
    )
    .await;
    assert_eq!(lane_of(&seen).as_deref(), Some("beta"));

    // Rules switched off: trusted stains still count, untrusted ones are still stripped.
    let off = RuleSet::parse(
        r#"{"enabled":false,"rules":[{"lane":"x"}]}"#,
        Format::Json,
        "off",
    )
    .expect("rules");
    let edge = EdgeLayer::new(off).with_trusted_clients(internal);
    assert_eq!(
        lane_of(&send(&edge, trusted()).await).as_deref(),
        Some("canary")
    );
    let seen = send(&edge, request("8.8.8.8:1", &[("x-gray-lane", "canary")])).await;
    assert_eq!(lane_of(&seen), None);
}

#[tokio::test]
async fn rfc7239_forwarded_through_hops_in_either_builder_order() {
    let proxies_first = EdgeLayer::new(seed003_rules(true))
        .with_proxies(TrustedProxies::hops(2))
        .with_forwarded_header(ForwardedHeader::Forwarded);
    let header_first = EdgeLayer::new(seed003_rules(true))
        .with_forwarded_header(ForwardedHeader::Forwarded)
        .with_proxies(TrustedProxies::hops(2));
    for edge in [proxies_first, header_first] {
        let seen = send(
            &edge,
            request(
                "10.0.0.2:1",
                &[(
                    "forwarded",
                    r#"for=198.51.100.1, for="[::ffff:192.168.1.100]:3000";proto=https, for=10.9.9.9"#,
                )],
            ),
        )
        .await;
        assert_eq!(seen.headers["x-gray-lane"], "gray");
        // X-Forwarded-For is not what this edge's proxies write: ignored.
        let seen = send(
            &edge,
            request(
                "10.0.0.2:1",
                &[("x-forwarded-for", "192.168.1.100, 10.9.9.9")],
            ),
        )
        .await;
        assert!(seen.headers.get("x-gray-lane").is_none());
    }
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_connect_info_is_the_peer() {
    let edge = EdgeLayer::new(seed003_rules(true));
    let req = Request::builder()
        .extension(axum::extract::ConnectInfo(
            "127.0.0.1:5555".parse::<SocketAddr>().expect("addr"),
        ))
        .body(())
        .expect("request");
    let seen = send(&edge, req).await;
    assert_eq!(seen.headers["x-gray-lane"], "gray");
}

#[tokio::test]
async fn live_rules_take_effect_for_the_next_request() {
    let live = LiveRules::new(RuleSet::default());
    let edge = EdgeLayer::new(live.clone());
    let seen = send(&edge, request("1.2.3.4:1", &[])).await;
    assert!(seen.stain.expect("stain").is_baseline());
    live.apply(
        r#"{"rules":[{"name":"all","lane":"gray"}]}"#,
        Format::Json,
        "inline",
        gray_tower::edge::Revision::Manual(7),
    )
    .expect("valid");
    let seen = send(&edge, request("1.2.3.4:1", &[])).await;
    assert_eq!(seen.headers["x-gray-lane"], "gray");
    assert_eq!(seen.decision.expect("d").generation, 2);
}

// === issue 13: spoofing at the layer ===

/// The whitelisted tester, the untrusted stranger and the internal (trusted) caller.
const TESTER: &str = "192.0.2.10:40000";
const STRANGER: &str = "203.0.113.9:40000";
const INTERNAL: &str = "10.20.0.5:40000";

/// A guard keeps `/svc/internal` baseline; the tester is gray everywhere else.
fn guarded_rules() -> RuleSet {
    RuleSet::parse(
        r#"
rules:
  - name: guard
    when: { path: { prefix: /svc/internal } }
    baseline: true
  - name: tester
    when: { ip: ["192.0.2.10"] }
    lane: gray
"#,
        Format::Yaml,
        "guarded.yaml",
    )
    .expect("rules")
}

/// The five carriers of the seeds, from a configuration file.
fn five_carriers() -> Carriers {
    #[derive(serde::Deserialize)]
    struct File {
        carriers: Vec<CarrierConfig>,
    }
    let file: File = toml::from_str(
        r#"
carriers = [
  { kind = "lane" },
  { kind = "route" },
  { kind = "flag", header = "gray", lane = "gray" },
  { kind = "version" },
  { kind = "baggage", key = "gray.lane" },
]
"#,
    )
    .expect("carriers");
    CarrierConfig::carriers(&file.carriers)
}

/// A spoofing case: its name, the headers the client sends, what the service behind gets.
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [Want],
);

/// What the service behind must (not) have received.
enum Want {
    Absent(&'static str),
    Is(&'static str, &'static str),
}

fn check(seen: &Seen, wants: &[Want], case: &str) {
    for want in wants {
        match want {
            Want::Absent(name) => assert!(
                seen.headers.get(*name).is_none(),
                "{case}: `{name}` reached the service: {:?}",
                seen.values(name)
            ),
            Want::Is(name, value) => {
                assert_eq!(seen.values(name), [*value], "{case}: `{name}`")
            }
        }
    }
}

#[tokio::test]
async fn every_forged_carrier_is_stripped_from_untrusted_clients() {
    use Want::*;
    // The gateway's configuration before issue 13: the default carriers only, plus one
    // header that only the services behind read.
    let default_carriers = EdgeLayer::new(guarded_rules())
        .with_trusted_clients(CidrList::parse(["10.20.0.0/16"]).expect("cidrs"))
        .with_strip([HeaderName::from_static("x-tenant-tier")]);
    let five = default_carriers.clone().with_carriers(five_carriers());
    let cases: &[Case] = &[
        ("seed 000 flag", &[("gray", "true")], &[Absent("gray")]),
        (
            "seed 000 flag, odd case",
            &[("GRAY", "TRUE")],
            &[Absent("gray")],
        ),
        (
            "seed 001 version",
            &[("version", "2.0")],
            &[Absent("version")],
        ),
        (
            "baggage member beside others",
            &[("baggage", "userId=42,gray.lane=gray;p=1, tenant=acme")],
            &[Is("baggage", "userId=42,tenant=acme")],
        ),
        (
            "baggage member on a second line",
            &[("baggage", "userId=42"), ("baggage", "gray.lane=gray")],
            &[Is("baggage", "userId=42")],
        ),
        (
            "baggage key percent-encoded, with `+`, spaces and another case",
            &[(
                "baggage",
                "userId=42,gray%2Elane=gray,%67ray.lane=gray,gray.lane+=gray, \
                 gray.lane%20=gray,Gray.Lane=gray,gray%252Elane=gray,tenant=acme",
            )],
            &[Is("baggage", "userId=42,tenant=acme")],
        ),
        (
            "lane header",
            &[("x-gray-lane", "gray")],
            &[Absent("x-gray-lane")],
        ),
        (
            "lane header with underscores or dots (WSGI reads HTTP_X_GRAY_LANE)",
            &[("x_gray_lane", "gray"), ("x.gray.info", "{}")],
            &[Absent("x_gray_lane"), Absent("x.gray.info")],
        ),
        (
            "seed 002 route header",
            &[("x-gray-info", r#"{"all":"v2"}"#)],
            &[Absent("x-gray-info")],
        ),
        (
            "seed 003 headers",
            &[("x-gray-flag", "true"), ("x-gray-ip", "192.0.2.10")],
            &[Absent("x-gray-flag"), Absent("x-gray-ip")],
        ),
        (
            "extra strip header",
            &[("x-tenant-tier", "gold")],
            &[Absent("x-tenant-tier")],
        ),
        (
            "everything at once, twice",
            &[
                ("gray", "true"),
                ("gray", "true"),
                ("version", "2.0"),
                ("x-gray-lane", "gray"),
                ("x-request-id", "r-1"),
            ],
            &[
                Absent("gray"),
                Absent("version"),
                Absent("x-gray-lane"),
                Is("x-request-id", "r-1"),
            ],
        ),
    ];
    for (edge_name, edge) in [
        ("default carriers", &default_carriers),
        ("five carriers", &five),
    ] {
        for (case, headers, wants) in cases {
            let case = format!("{edge_name}: {case}");
            let seen = send(edge, request(STRANGER, headers)).await;
            assert_eq!(seen.lane(), None, "{case}");
            let decision = seen.decision.clone().expect("decision");
            assert_eq!(decision.decided_by, DecidedBy::Default, "{case}");
            assert!(!decision.trusted, "{case}");
            check(&seen, wants, &case);
        }
    }

    // A trusted caller keeps what it sent, read through the configured carriers.
    let seen = send(
        &five,
        request(
            INTERNAL,
            &[
                ("gray", "true"),
                ("version", "2.0"),
                ("x-tenant-tier", "gold"),
            ],
        ),
    )
    .await;
    assert_eq!(seen.lane().as_deref(), Some("gray"));
    assert_eq!(
        seen.stain
            .as_ref()
            .and_then(|c| c.version_for("orders"))
            .map(|v| v.to_string()),
        Some("2.0".to_owned())
    );
    check(
        &seen,
        &[
            Want::Is("gray", "true"),
            Want::Is("x-gray-lane", "gray"),
            Want::Is("version", "2.0"),
            Want::Is("baggage", "gray.lane=gray"),
            Want::Is("x-tenant-tier", "gold"),
        ],
        "trusted caller",
    );

    // The known set can be switched off (seed 004's API `version` header means something
    // else); configured carriers are stripped all the same.
    let api_versions = EdgeLayer::new(guarded_rules()).with_strip_known(false);
    let seen = send(
        &api_versions,
        request(STRANGER, &[("version", "2"), ("x-gray-lane", "gray")]),
    )
    .await;
    check(
        &seen,
        &[Want::Is("version", "2"), Want::Absent("x-gray-lane")],
        "known set off",
    );
}

#[tokio::test]
async fn connection_cannot_remove_the_stain_the_edge_writes() {
    use Want::*;
    let edge = EdgeLayer::new(guarded_rules())
        .with_carriers(five_carriers())
        .with_trusted_clients(CidrList::parse(["10.20.0.0/16"]).expect("cidrs"))
        .with_seed003_headers(gray());
    let cases: &[Case] = &[
        (
            "Connection: x-gray-lane",
            &[("connection", "x-gray-lane")],
            &[Is("x-gray-lane", "gray")],
        ),
        (
            "Connection: x-gray-flag, x-gray-ip",
            &[("connection", "x-gray-flag, x-gray-ip")],
            &[Is("x-gray-flag", "true"), Is("x-gray-ip", "192.0.2.10")],
        ),
        (
            "Connection naming every carrier, on two lines, odd case",
            &[
                ("connection", "keep-alive, GRAY, Version"),
                ("connection", "baggage,x-gray-lane"),
                ("keep-alive", "timeout=5"),
                ("baggage", "userId=42"),
            ],
            &[
                Is("gray", "true"),
                Is("x-gray-lane", "gray"),
                // The client's baggage was for this hop only; the stain's member is written.
                Is("baggage", "gray.lane=gray"),
                Absent("keep-alive"),
            ],
        ),
        (
            "Connection naming a header the client sent",
            &[
                ("connection", "x-secret"),
                ("x-secret", "1"),
                ("te", "gzip, trailers"),
            ],
            // `TE` is hop-by-hop, but its ask for trailers is passed on as the proxy's own
            &[
                Absent("x-secret"),
                Is("te", "trailers"),
                Is("x-gray-lane", "gray"),
            ],
        ),
    ];
    for (case, headers, wants) in cases {
        let seen = send(&edge, request(TESTER, headers)).await;
        assert_eq!(seen.lane().as_deref(), Some("gray"), "{case}");
        assert_eq!(
            seen.decision.as_ref().and_then(|d| d.rule_name.as_deref()),
            Some("tester"),
            "{case}"
        );
        assert!(seen.headers.get("connection").is_none(), "{case}");
        check(&seen, wants, case);
    }

    // A trusted caller's stain named in `Connection` was meant for this hop only: not read.
    let seen = send(
        &edge,
        request(
            INTERNAL,
            &[("connection", "x-gray-lane"), ("x-gray-lane", "canary")],
        ),
    )
    .await;
    assert_eq!(seen.lane(), None);
    check(
        &seen,
        &[Absent("x-gray-lane"), Is("x-gray-flag", "false")],
        "trusted, hop-only stain",
    );

    // Switched off, `Connection` reaches the service behind (which then owns the problem).
    let seen = send(
        &edge.clone().with_hop_by_hop(false),
        request(TESTER, &[("connection", "x-gray-lane")]),
    )
    .await;
    check(
        &seen,
        &[Is("connection", "x-gray-lane"), Is("x-gray-lane", "gray")],
        "hop-by-hop off",
    );
}

#[tokio::test]
async fn paths_are_normalised_before_rules_and_forwarding() {
    let edge = EdgeLayer::new(guarded_rules()).with_carriers(five_carriers());
    let guarded = "/svc/internal/x";
    for raw in [
        "/svc/internal/x",
        "/svc//internal/x",
        "/svc/x/../internal/x",
        "/svc/./internal/x",
        "/svc/%69nternal/x",
        "/svc/%2e%2e/svc/internal/x",
        "/svc/x/%2E%2E/internal//x/.",
        "http://gw.example//svc/internal/x",
    ] {
        let seen = send(&edge, request_to(TESTER, raw, &[])).await;
        let d = seen.decision.clone().expect("decision");
        assert_eq!(d.rule_name.as_deref(), Some("guard"), "{raw}");
        assert_eq!(seen.lane(), None, "{raw}");
        assert!(seen.headers.get("x-gray-lane").is_none(), "{raw}");
        // The upstream sees what the rules saw; the query is untouched.
        assert!(
            seen.uri.path() == guarded || seen.uri.path() == "/svc/internal/x/",
            "{raw} -> {}",
            seen.uri
        );
        assert_eq!(seen.uri.query(), Some("q=/../%2F"), "{raw}");
        match &seen.raw_uri {
            Some(RawUri(original)) => assert!(
                original
                    .to_string()
                    .contains(raw.trim_start_matches("http://gw.example")),
                "{raw}"
            ),
            None => assert_eq!(raw, guarded),
        }
    }

    // Outside the guard the tester is gray, on the normalised path.
    let seen = send(&edge, request_to(TESTER, "/svc/internal/../public/x", &[])).await;
    assert_eq!(seen.lane().as_deref(), Some("gray"));
    assert_eq!(seen.uri.path(), "/svc/public/x");

    // Rejected: answered 400 by the edge itself; no rule runs, nothing reaches the service.
    for (raw, kind) in [
        ("/svc/internal%2Fx", PathErrorKind::EncodedSlash),
        ("/svc%2finternal/x", PathErrorKind::EncodedSlash),
        ("/svc/internal%5Cx", PathErrorKind::EncodedSlash),
        ("/svc\\internal/x", PathErrorKind::Backslash),
        (
            "/svc/..;/internal/x",
            PathErrorKind::DotSegmentWithParameters,
        ),
        ("/svc/../../internal/x", PathErrorKind::AboveRoot),
        ("/svc/%00/internal/x", PathErrorKind::Nul),
        ("/svc/%zz", PathErrorKind::BadPercentEncoding),
    ] {
        let svc = tower::Layer::layer(&edge, backend());
        let req = request_to(TESTER, raw, &[("x-gray-lane", "gray"), ("gray", "true")]);
        let res = svc.oneshot(req).await.expect("infallible");
        assert_eq!(res.status(), 400, "{raw}");
        assert_eq!(res.headers()["content-type"], "application/json", "{raw}");
        let body = res.into_body();
        let answer: serde_json::Value =
            serde_json::from_slice(body.answer().expect("the edge's answer")).expect("JSON");
        assert_eq!(answer["error"], "invalid path", "{raw}");
        assert_eq!(answer["reason"], kind.as_str(), "{raw}");
        assert!(body.into_inner().is_none(), "{raw} reached the service");
    }

    // Switched off, the rules see the raw path (and the guard is bypassed).
    let raw_paths = edge.clone().with_path_normalization(false);
    let seen = send(&raw_paths, request_to(TESTER, "/svc//internal/x", &[])).await;
    assert_eq!(seen.lane().as_deref(), Some("gray"));
    assert_eq!(seen.uri.path(), "/svc//internal/x");
}

#[tokio::test]
async fn duplicates_are_read_as_their_first_value_by_rules_and_carriers() {
    let header_rule = RuleSet::parse(
        r#"{"rules":[{"name":"seed 000","when":{"header":{"name":"gray","exact":"true","ignore_case":true}},"lane":"gray"}]}"#,
        Format::Json,
        "inline",
    )
    .expect("rules");
    let edge = EdgeLayer::new(header_rule)
        .with_carriers(five_carriers())
        .with_trusted_clients(CidrList::parse(["10.20.0.0/16"]).expect("cidrs"));
    let off = EdgeLayer::new(RuleSet::default())
        .with_carriers(five_carriers())
        .with_trusted_clients(CidrList::parse(["10.20.0.0/16"]).expect("cidrs"));
    let false_true: &[(&str, &str)] = &[("gray", "false"), ("gray", "true")];
    let true_false: &[(&str, &str)] = &[("gray", "true"), ("gray", "false")];

    // Through the header rule (an untrusted client: only the rule can stain it).
    let seen = send(&edge, request(STRANGER, false_true)).await;
    assert_eq!(seen.lane(), None);
    assert_eq!(
        seen.decision.as_ref().expect("d").decided_by,
        DecidedBy::Default
    );
    assert!(seen.headers.get("gray").is_none());
    let seen = send(&edge, request(STRANGER, true_false)).await;
    assert_eq!(seen.lane().as_deref(), Some("gray"));
    assert_eq!(
        seen.decision.as_ref().expect("d").decided_by,
        DecidedBy::Rule
    );
    assert_eq!(seen.values("gray"), ["true"]);

    // Through the `gray` carrier (a trusted client, no rule).
    let seen = send(&off, request(INTERNAL, false_true)).await;
    assert_eq!(seen.lane(), None);
    assert_eq!(
        seen.decision.as_ref().expect("d").decided_by,
        DecidedBy::Inbound
    );
    assert!(seen.headers.get("gray").is_none());
    let seen = send(&off, request(INTERNAL, true_false)).await;
    assert_eq!(seen.lane().as_deref(), Some("gray"));
    assert_eq!(
        seen.decision.as_ref().expect("d").decided_by,
        DecidedBy::Inbound
    );
    assert_eq!(seen.values("gray"), ["true"]);
    assert_eq!(seen.values("x-gray-lane"), ["gray"]);

    // A duplicated lane header: the first value, rewritten as one.
    let seen = send(
        &off,
        request(
            INTERNAL,
            &[("x-gray-lane", "canary"), ("x-gray-lane", "gray")],
        ),
    )
    .await;
    assert_eq!(seen.lane().as_deref(), Some("canary"));
    assert_eq!(seen.values("x-gray-lane"), ["canary"]);
}

#[test]
fn the_strip_set_is_listed() {
    let edge = EdgeLayer::new(RuleSet::default())
        .with_carriers(
            Carriers::new()
                .with(PlainHeader::lane(HeaderName::from_static("x-lane")))
                .with(BaggageMember::new("lane").expect("key")),
        )
        .with_strip([HeaderName::from_static("x-tenant-tier")]);
    let names: Vec<_> = edge.stripped_headers().iter().map(|h| h.as_str()).collect();
    assert_eq!(
        names,
        [
            "x-lane",
            "x-gray-lane",
            "x-gray-info",
            "x-gray-flag",
            "x-gray-ip",
            "gray",
            "version",
            "x-tenant-tier"
        ]
    );
    assert_eq!(
        edge.stripped_baggage_keys().collect::<Vec<_>>(),
        ["lane", "gray.lane"]
    );
    let edge = edge.with_strip_known(false).with_strip([]);
    assert_eq!(edge.stripped_headers(), [HeaderName::from_static("x-lane")]);
}

// === allocations ===

/// Polls `fut` once with a no-op waker; the edge and its stand-in are ready at once.
fn poll_once<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => panic!("not ready at the first poll"),
    }
}

/// The allocations of one edge call for requests made by `make` (outside the measured
/// window), after warm-up; and what the service behind saw of the lane.
fn edge_allocations(
    edge: &EdgeLayer,
    make: impl Fn() -> Request<()>,
) -> (Option<HeaderValue>, usize) {
    let mut svc = tower::Layer::layer(
        edge,
        service_fn(|req: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(
                req.headers().get("x-gray-lane").cloned(),
            )))
        }),
    );
    let mut requests: Vec<Request<()>> = (0..9).map(|_| make()).collect();
    measure(|| {
        let req = requests.pop().expect("a request per run");
        let res = poll_once(svc.call(req)).expect("infallible");
        res.into_body().into_inner().flatten()
    })
}

#[test]
fn hop_by_hop_and_path_checks_allocate_nothing_on_a_clean_request() {
    let edge = EdgeLayer::new(guarded_rules())
        .with_carriers(Carriers::default().with_names(gray_core::Names::new().with_lanes([gray()])))
        .with_decision_extension(false);
    // A browser-like request from `peer`, with room in its header map for the stain.
    let clean = |peer: &'static str| {
        move || {
            let mut req = request_to(
                peer,
                "/svc/public/x?page=2",
                &[
                    ("accept", "application/json"),
                    ("user-agent", "curl/8.5.0"),
                    ("cookie", "session=1"),
                ],
            );
            req.headers_mut().reserve(16);
            req
        }
    };
    // The only allocation is the stain's entry in the extensions (which already hold the
    // peer address): as for `ExtractStain`.
    let (lane, baseline) = edge_allocations(&edge, clean(STRANGER));
    assert_eq!(lane, None);
    assert_eq!(
        baseline, 1,
        "a clean baseline request allocated {baseline} times"
    );
    let (lane, gray_lane) = edge_allocations(&edge, clean(TESTER));
    assert_eq!(lane.expect("stained"), "gray");
    assert_eq!(
        gray_lane, 1,
        "a clean gray request allocated {gray_lane} times"
    );

    // The counter-example: a path to rewrite is built on the heap (and so is the URI).
    let (_, dirty) = edge_allocations(&edge, || request_to(TESTER, "/svc//public/./x", &[]));
    assert!(dirty > 1, "normalising a path allocated only {dirty} times");
}

#[test]
fn the_gateways_checks_add_no_allocation_to_a_request_that_passes() {
    // The gateway's shape: the peer given once per connection (its `X-Forwarded-For` entry
    // made then), paths checked for leaving their first segment, the peer appended.
    let plain = EdgeLayer::new(guarded_rules())
        .with_carriers(Carriers::default().with_names(gray_core::Names::new().with_lanes([gray()])))
        .with_decision_extension(false);
    let gateway = plain
        .clone()
        .with_reject_prefix_escape(true)
        .with_forwarded_for(true);
    let peer: SocketAddr = TESTER.parse().expect("peer");
    let clean = || {
        let mut req = Request::get("/svc/public/x?page=2")
            .header("accept", "application/json")
            .header("user-agent", "curl/8.5.0")
            .body(())
            .expect("request");
        req.headers_mut().reserve(16);
        req
    };
    let measured = |edge: &EdgeLayer| {
        let mut svc = tower::Layer::layer(
            edge,
            service_fn(|req: Request<()>| {
                let forwarded = req.headers().get("x-forwarded-for").cloned();
                std::future::ready(Ok::<_, Infallible>(Response::new(forwarded)))
            }),
        )
        .with_peer(peer);
        let mut requests: Vec<Request<()>> = (0..9).map(|_| clean()).collect();
        measure(|| {
            let req = requests.pop().expect("a request per run");
            let res = poll_once(svc.call(req)).expect("infallible");
            res.into_body().into_inner().flatten()
        })
    };
    let (forwarded, before) = measured(&plain);
    assert_eq!(forwarded, None);
    let (forwarded, after) = measured(&gateway);
    assert_eq!(forwarded.expect("appended"), "192.0.2.10");
    assert_eq!(
        after, before,
        "the gateway's checks allocated {after} times against {before}"
    );
}

/// Header bytes rich in the delimiters the parsers care about, a hop count, and which
/// header to read.
fn chain_header() -> impl Strategy<Value = (Vec<u8>, usize, bool)> {
    (
        proptest::collection::vec(
            prop_oneof![
                Just(b','),
                Just(b';'),
                Just(b'"'),
                Just(b'='),
                Just(b'['),
                Just(b']'),
                Just(b':'),
                Just(b' '),
                Just(b'\\'),
                any::<u8>(),
                b'0'..=b'9',
                b'a'..=b'f',
            ],
            0..200,
        ),
        0usize..40,
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Bounded smoke of the fuzz target: the X-Forwarded-For / Forwarded parsers never
    /// panic, and whatever they return is an address of the chain or the peer.
    #[test]
    fn forwarded_parsers_never_panic((bytes, hops, rfc) in chain_header()) {
        let Ok(value) = HeaderValue::from_bytes(&bytes) else { return Ok(()) };
        let header = if rfc { ForwardedHeader::Forwarded } else { ForwardedHeader::XForwardedFor };
        let mut headers = HeaderMap::new();
        headers.insert(if rfc { "forwarded" } else { "x-forwarded-for" }, value);
        let peer = Some("10.0.0.1".parse().expect("ip"));
        let by_hops = ClientIpResolver::new(TrustedProxies::hops(hops)).with_header(header);
        let by_cidr = ClientIpResolver::new(TrustedProxies::cidrs(CidrList::parse(["0.0.0.0/1", "10.0.0.0/8"]).expect("cidr"))).with_header(header);
        for resolver in [by_hops, by_cidr] {
            if let Some(ip) = resolver.resolve(peer, &headers) {
                let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
                let v4 = ip.to_string();
                prop_assert!(Some(ip) == peer || text.contains(&v4) || ip.is_ipv6() || text.contains("ffff"), "{ip} not from {text:?}");
            }
        }
    }
}

/// With a baggage carrier, the client's other `baggage` members travel on the stain the edge
/// decided, whatever decided it (a rule, nothing), and its forged stain member never does.
#[tokio::test]
async fn the_clients_other_baggage_members_travel_on_the_edges_decision() {
    let edge = EdgeLayer::new(guarded_rules()).with_carriers(five_carriers());
    let members = "userId=42;ttl=5,tenant=acme,gray.lane=canary";
    for (peer, lane) in [(TESTER, Some("gray")), (STRANGER, None)] {
        let seen = send(&edge, request(peer, &[("baggage", members)])).await;
        assert_eq!(seen.lane().as_deref(), lane, "{peer}");
        let inherited = seen
            .stain
            .as_ref()
            .and_then(|c| c.baggage())
            .map(|b| b.as_str().to_owned());
        assert_eq!(
            inherited.as_deref(),
            Some("userId=42;ttl=5,tenant=acme"),
            "{peer}: the stain carries the other members, not the forged one"
        );
        let written = seen.values("baggage").join(",");
        assert!(
            written.starts_with("userId=42;ttl=5,tenant=acme"),
            "{peer}: {written}"
        );
        match lane {
            Some(lane) => assert!(written.ends_with(&format!("gray.lane={lane}")), "{written}"),
            None => assert!(!written.contains("gray.lane"), "{peer}: {written}"),
        }
    }
}

/// With a baggage carrier of another key, the client's other members are read once the
/// known `gray.lane` member is stripped: no spelling of it travels on as "another member".
#[tokio::test]
async fn a_stripped_member_never_travels_on_as_another_member() {
    let carriers = Carriers::new().with(BaggageMember::new("lane").expect("a key"));
    let edge = EdgeLayer::new(guarded_rules()).with_carriers(carriers);
    let members = "userId=42,gray%2Elane=gray,Gray.Lane=gray,LANE=blue,tenant=acme";
    let seen = send(&edge, request(STRANGER, &[("baggage", members)])).await;
    assert_eq!(seen.lane(), None);
    assert_eq!(seen.values("baggage"), ["userId=42,tenant=acme"]);
}
