//! The edge layer: seed 003's whitelist through a trusted proxy, spoofing, trust and
//! precedence, and the client IP parsers under arbitrary input.

use std::{convert::Infallible, net::SocketAddr};

use gray_core::{
    Carriers, Lane, Stain,
    codec::{BaggageMember, PlainHeader},
    rules::{CidrList, Format, RuleSet},
};
use gray_tower::{
    edge::{
        ClientIpResolver, DecidedBy, EdgeDecision, EdgeLayer, ForwardedHeader, LiveRules, PeerAddr,
        Precedence, TrustedProxies,
    },
    task,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use proptest::prelude::*;
use tower::{Service, ServiceExt, service_fn};

/// What the service behind the edge saw.
#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    ctx: Option<Stain>,
    task_ctx: Option<Stain>,
    decision: Option<EdgeDecision>,
}

fn backend() -> impl Service<Request<()>, Response = Response<Seen>, Error = Infallible> + Clone {
    service_fn(|req: Request<()>| async move {
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(Response::new(Seen {
            headers: req.headers().clone(),
            ctx: req.extensions().get::<Stain>().cloned(),
            task_ctx: task::current(),
            decision: req.extensions().get::<EdgeDecision>().cloned(),
        }))
    })
}

async fn send(layer: &EdgeLayer, req: Request<()>) -> Seen {
    let svc = tower::Layer::layer(layer, backend());
    let seen = svc.oneshot(req).await.expect("infallible").into_body();
    assert_eq!(seen.ctx, seen.task_ctx, "extensions and task-local agree");
    seen
}

fn request(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut req = Request::builder().uri("/orders?page=1");
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
    assert_eq!(seen.ctx.as_ref().and_then(|c| c.lane()), Some(&gray()));
    assert_eq!(seen.headers["x-gray-lane"], "gray");
    assert_eq!(seen.headers["gray"], "true");
    assert_eq!(seen.headers["x-gray-flag"], "true");
    assert_eq!(seen.headers["x-gray-ip"], "192.168.1.100");
    assert_eq!(seen.headers["baggage"], "gray.lane=gray");
    let d = seen.decision.expect("decision");
    assert_eq!(d.decided_by, DecidedBy::Rule);
    assert_eq!(d.rule_name.as_deref(), Some("ip-whitelist"));
    assert_eq!(d.client_ip, Some("192.168.1.100".parse().expect("ip")));

    // Everyone else is baseline, and told so downstream.
    let seen = send(
        &edge,
        request("10.0.0.2:51000", &[("x-forwarded-for", "198.51.100.4")]),
    )
    .await;
    assert!(seen.ctx.expect("ctx").is_baseline());
    assert_eq!(seen.headers["x-gray-flag"], "false");
    assert_eq!(seen.headers["x-gray-ip"], "198.51.100.4");
    assert!(seen.headers.get("x-gray-lane").is_none());

    // The global switch off (seed 003's `enable: false`): nobody is gray.
    let seen = send(
        &seed003_edge(false),
        request("10.0.0.2:51000", &[("x-forwarded-for", "192.168.1.100")]),
    )
    .await;
    assert!(seen.ctx.expect("ctx").is_baseline());
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
    assert!(seen.ctx.expect("ctx").is_baseline());
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
    assert!(seen.ctx.expect("ctx").is_baseline());
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

#[tokio::test]
async fn the_decision_extension_can_be_left_out() {
    let rules = RuleSet::parse(
        r#"{"rules":[{"name":"beta","when":{"cookie":{"name":"beta","exact":"1"}},"lane":"beta"}]}"#,
        Format::Json,
        "inline",
    )
    .expect("rules");
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
        seen.ctx
            .and_then(|c| c.lane().map(|l| l.to_string()))
            .as_deref(),
        Some("beta")
    );
    assert_eq!(seen.headers["x-gray-lane"], "beta");
}

#[tokio::test]
async fn trusted_clients_and_precedence() {
    let rules = RuleSet::parse(
        r#"{"rules":[{"name":"beta","when":{"cookie":{"name":"beta","exact":"1"}},"lane":"beta"}]}"#,
        Format::Json,
        "inline",
    )
    .expect("rules");
    let internal = CidrList::parse(["10.20.0.0/16"]).expect("cidrs");
    let rules_first = EdgeLayer::new(rules.clone()).with_trusted_clients(internal.clone());
    let inbound_first = rules_first
        .clone()
        .with_precedence(Precedence::InboundFirst);

    let lane_of = |seen: &Seen| {
        seen.ctx
            .as_ref()
            .and_then(|c| c.lane())
            .map(|l| l.to_string())
    };

    // A trusted caller's stain decides when no rule matches.
    let trusted = || request("10.20.1.1:1", &[("x-gray-lane", "canary")]);
    let seen = send(&rules_first, trusted()).await;
    assert_eq!(lane_of(&seen).as_deref(), Some("canary"));
    assert_eq!(seen.headers["x-gray-lane"], "canary");
    assert_eq!(seen.decision.expect("d").decided_by, DecidedBy::Inbound);

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
async fn rfc7239_forwarded_through_hops() {
    let edge = EdgeLayer::new(seed003_rules(true))
        .with_proxies(TrustedProxies::hops(2))
        .with_forwarded_header(ForwardedHeader::Forwarded);
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
    assert!(seen.ctx.expect("ctx").is_baseline());
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
