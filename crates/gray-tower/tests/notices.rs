//! What the edge says once rather than per request: a request that arrives without a peer
//! address while the configuration needs the client IP (a WARN naming the fix), and an
//! edge placed after axum's routing (an ERROR, and a 500 per request: see the
//! `gray-tests` crate's `edge_stacks` for that one, through a real axum server). Events
//! are captured by a subscriber set for the test's thread (the runtime is the test's
//! current thread), and counted: no sleep, no timing.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
};

use gray_tower::edge::{CidrList, EdgeLayer, Format, PeerAddr, RuleSet, TrustedProxies};
use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};
use tracing::{Level, field::Visit};
use tracing_subscriber::{layer::SubscriberExt, registry::LookupSpan};

/// The WARN and ERROR events of target `gray::edge`, with their messages.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(Level, String)>>>);

impl Captured {
    fn at(&self, level: Level) -> Vec<String> {
        let events = self.0.lock().expect("not poisoned");
        events
            .iter()
            .filter(|(l, _)| *l == level)
            .map(|(_, m)| m.clone())
            .collect()
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() == "gray::edge" && *meta.level() <= Level::WARN {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0
                .lock()
                .expect("not poisoned")
                .push((*meta.level(), message.0));
        }
    }
}

/// Captures the events of this thread until the guard is dropped.
fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    (captured, tracing::subscriber::set_default(subscriber))
}

/// Sends `n` requests through `edge`, with `PeerAddr` when `peer` is given.
async fn send(edge: &EdgeLayer, n: usize, peer: Option<&str>) {
    let svc = edge.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    for _ in 0..n {
        let mut req = Request::get("/orders").body(()).expect("request");
        if let Some(peer) = peer {
            req.extensions_mut()
                .insert(PeerAddr(peer.parse().expect("peer")));
        }
        let res = svc.clone().oneshot(req).await.expect("infallible");
        assert_eq!(res.status(), 200);
    }
}

fn rules(json: &str) -> RuleSet {
    RuleSet::parse(json, Format::Json, "inline").expect("rules")
}

const IP_RULE: &str =
    r#"{"rules":[{"name":"testers","when":{"ip":["10.1.0.0/16"]},"lane":"gray"}]}"#;
const STICKY_BY_IP: &str =
    r#"{"rules":[{"when":{"sticky":{"by":"client_ip","percent":10}},"lane":"gray"}]}"#;
const HEADER_RULE: &str =
    r#"{"rules":[{"when":{"header":{"name":"x-beta","present":true}},"lane":"gray"}]}"#;

#[tokio::test]
async fn a_missing_peer_is_warned_once_when_the_configuration_reads_the_client_ip() {
    let trusted = CidrList::parse(["10.0.0.0/8"]).expect("cidrs");
    for (what, edge) in [
        ("ip rule", EdgeLayer::new(rules(IP_RULE))),
        ("sticky by ip", EdgeLayer::new(rules(STICKY_BY_IP))),
        (
            "trusted clients",
            EdgeLayer::new(rules(HEADER_RULE)).with_trusted_clients(trusted.clone()),
        ),
        (
            "trusted proxies",
            EdgeLayer::new(RuleSet::default()).with_proxies(TrustedProxies::hops(1)),
        ),
    ] {
        let (captured, _guard) = capture();
        send(&edge, 5, None).await;
        let warnings = captured.at(Level::WARN);
        assert_eq!(warnings.len(), 1, "{what}: {warnings:?}");
        assert!(
            warnings[0].contains("without a peer address")
                && warnings[0].contains("into_make_service_with_connect_info")
                && warnings[0].contains("with_peer"),
            "{what}: the warning names the fix: {}",
            warnings[0]
        );
        // A clone of the layer shares what was said.
        send(&edge.clone(), 3, None).await;
        assert_eq!(captured.at(Level::WARN).len(), 1, "{what}");
    }
}

#[tokio::test]
async fn nothing_is_said_when_the_peer_is_known_or_nothing_reads_the_ip() {
    let (captured, _guard) = capture();
    // A peer on every request: nothing to say.
    let edge = EdgeLayer::new(rules(IP_RULE))
        .with_trusted_clients(CidrList::parse(["10.0.0.0/8"]).expect("cidrs"));
    send(&edge, 3, Some("10.0.0.7:4000")).await;
    // Nothing reads the IP: a missing peer changes nothing.
    send(&EdgeLayer::new(rules(HEADER_RULE)), 3, None).await;
    send(&EdgeLayer::new(RuleSet::default()), 3, None).await;
    // A disabled IP rule is not read either.
    let disabled = r#"{"rules":[{"enabled":false,"when":{"ip":["10.1.0.0/16"]},"lane":"gray"}]}"#;
    send(&EdgeLayer::new(rules(disabled)), 3, None).await;
    assert_eq!(captured.at(Level::WARN), Vec::<String>::new());
}

#[tokio::test]
async fn live_rules_that_start_reading_the_ip_are_noticed() {
    let (captured, _guard) = capture();
    let live = gray_tower::edge::LiveRules::new(rules(HEADER_RULE));
    let edge = EdgeLayer::new(live.clone());
    send(&edge, 3, None).await;
    assert!(captured.at(Level::WARN).is_empty());
    // A new version with an IP rule: the next peerless request is warned about.
    let _ = live.replace(rules(IP_RULE), gray_tower::edge::Revision::Manual(2));
    send(&edge, 3, None).await;
    assert_eq!(captured.at(Level::WARN).len(), 1);
}
