//! The edge in each server stack it claims to work in, over real loopback servers and
//! clients: axum (the edge wrapped around the `Router`: rules, the client IP from
//! `ConnectInfo`, paths normalised before routing, `/api/../web/x` refused; the edge put
//! in with `Router::layer`, after routing: every request refused with a 500 that says how
//! to fix it, and one ERROR), hyper (an accept loop with `Edge::with_peer`:
//! `X-Forwarded-For` appended, rejected paths answered) and tonic
//! (`Server::builder().layer(edge)`).
//!
//! Paths with dot segments are sent with hyper's client: reqwest (the WHATWG URL parser)
//! would resolve `..` and `%2e%2e` before sending. The tests run on the current-thread
//! runtime, so the events of the servers they start reach the subscriber set for the
//! test's thread.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    http::{HeaderMap, Uri},
    routing::get,
};
use bytes::Bytes;
use gray_tests::{loopback_listener, proto};
use gray_tower::edge::{CidrList, EdgeLayer, Format, RuleSet};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::{Layer, service_fn};
use tracing::{Level, field::Visit};
use tracing_subscriber::{layer::SubscriberExt, registry::LookupSpan};

/// The ERROR events of target `gray::edge`.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Errors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() == "gray::edge" && *meta.level() == Level::ERROR {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().expect("not poisoned").push(message.0);
        }
    }
}

impl Errors {
    fn capture() -> (Errors, tracing::subscriber::DefaultGuard) {
        let errors = Errors::default();
        let subscriber = tracing_subscriber::registry().with(errors.clone());
        (errors, tracing::subscriber::set_default(subscriber))
    }

    fn seen(&self) -> Vec<String> {
        self.0.lock().expect("not poisoned").clone()
    }
}

/// A rule set: `x-beta: 1` is gray.
fn beta_rules() -> RuleSet {
    RuleSet::parse(
        r#"{"rules":[{"name":"beta","when":{"header":{"name":"x-beta","exact":"1"}},"lane":"gray"}]}"#,
        Format::Json,
        "inline",
    )
    .expect("rules")
}

/// The edge of these tests: loopback is a trusted client (its own stain is honoured),
/// paths must stay in the first segment they name, the peer goes into `X-Forwarded-For`.
fn edge() -> EdgeLayer {
    EdgeLayer::new(beta_rules())
        .with_trusted_clients(CidrList::parse(["127.0.0.1/32"]).expect("cidrs"))
        .with_reject_prefix_escape(true)
        .with_forwarded_for(true)
}

/// What a route saw: `name path lane x-forwarded-for`.
async fn seen(name: &str, uri: &Uri, headers: &HeaderMap) -> String {
    let lane = gray_tower::current()
        .and_then(|stain| stain.lane().cloned())
        .map_or_else(|| "baseline".to_owned(), |lane| lane.to_string());
    let forwarded = headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    format!("{name} {} {lane} {forwarded}", uri.path())
}

/// `/api/…` and `/web/…`, each saying what it saw.
fn router() -> Router {
    Router::new()
        .route(
            "/api/{*rest}",
            get(|uri: Uri, headers: HeaderMap| async move { seen("api", &uri, &headers).await }),
        )
        .route(
            "/web/{*rest}",
            get(|uri: Uri, headers: HeaderMap| async move { seen("web", &uri, &headers).await }),
        )
}

/// Serves `app` on a loopback port with the peer address in `ConnectInfo`.
async fn serve_axum(app: Router) -> SocketAddr {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// `GET path` with `headers`, sent as is (no URL normalisation) over a fresh HTTP/1.1
/// connection: the status and the body.
async fn get_raw(
    addr: SocketAddr,
    path: &'static str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::get(Uri::from_static(path)).header("host", "edge.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    tokio::time::timeout(gray_test_support::WAIT, async {
        let res = send
            .send_request(req.body(Empty::<Bytes>::new()).expect("request"))
            .await
            .expect("an answer");
        let status = res.status();
        let body = res.into_body().collect().await.expect("a body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
    .expect("answered in time")
}

#[tokio::test]
async fn axum_with_the_edge_wrapped_around_the_router() {
    let (errors, _guard) = Errors::capture();
    // The right way: the edge wraps the router, and is served as a router again.
    let app = Router::new().fallback_service(edge().layer(router()));
    let addr = serve_axum(app).await;

    // A rule decides; the route sees the lane (task-local) and the peer appended.
    let (status, body) = get_raw(addr, "/api/x", &[("x-beta", "1")]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "api /api/x gray 127.0.0.1")
    );
    // The client IP came from `ConnectInfo`: loopback is trusted, so its own stain counts.
    let (_, body) = get_raw(addr, "/api/x", &[("x-gray-lane", "canary")]).await;
    assert_eq!(body, "api /api/x canary 127.0.0.1");
    // Normalised before routing: the router routes the path the rules saw.
    let (_, body) = get_raw(addr, "/web//a/./b/%69", &[]).await;
    assert_eq!(body, "web /web/a/b/i baseline 127.0.0.1");
    // `/api/../web/x` names `api`; normalised, it would reach `web`: refused.
    let (status, body) = get_raw(addr, "/api/../web/x", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["reason"], "prefix_escape", "{body}");
    // A rejected path: 400 from the edge, naming the reason.
    let (status, body) = get_raw(addr, "/api/a%2Fb", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        (answer["error"].as_str(), answer["reason"].as_str()),
        (Some("invalid path"), Some("encoded_slash"))
    );

    assert_eq!(errors.seen(), Vec::<String>::new());
}

#[tokio::test]
async fn axum_with_the_edge_layered_after_routing_is_refused_loudly_once() {
    let (errors, _guard) = Errors::capture();
    // The wrong way: `Router::layer` runs the edge after routing, where `/api/../web/x`
    // would already have gone to `api`.
    let addr = serve_axum(router().layer(edge())).await;

    for path in ["/api/x", "/web/y", "/api/x"] {
        let (status, body) = get_raw(addr, path, &[("x-beta", "1")]).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{path}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(answer["reason"], "after_routing", "{body}");
        let detail = answer["detail"].as_str().expect("detail");
        assert!(
            detail.contains("fallback_service")
                && detail.contains("into_make_service_with_connect_info"),
            "the answer says how to fix it: {detail}"
        );
    }
    let logged = errors.seen();
    assert_eq!(
        logged.len(),
        1,
        "one ERROR, not one per request: {logged:?}"
    );
    assert!(logged[0].contains("after axum's routing"), "{}", logged[0]);
}

#[tokio::test]
async fn hyper_with_the_edge_per_connection() {
    // The service behind: echoes the path and `X-Forwarded-For` it got.
    let inner = service_fn(|req: Request<Incoming>| async move {
        let forwarded = req
            .headers()
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let text = format!("{} {forwarded}", req.uri().path());
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
    });
    let listener = loopback_listener().await;
    let addr = listener.local_addr().expect("address");
    let layer = edge();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            // Once per connection: the peer, and its `X-Forwarded-For` entry with it.
            let service = layer.layer(inner).with_peer(peer);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                TokioIo::new(stream),
                hyper_util::service::TowerToHyperService::new(service),
            ));
        }
    });

    let (status, body) = get_raw(addr, "/svc//x", &[("x-forwarded-for", "203.0.113.9")]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "/svc/x 203.0.113.9, 127.0.0.1")
    );
    let (status, body) = get_raw(addr, "/svc/../other/x", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("prefix_escape"), "{body}");
}

/// The gRPC test service: answers the lane it ran in.
struct LaneOf;

#[tonic::async_trait]
impl proto::hop_server::Hop for LaneOf {
    async fn call(
        &self,
        _: tonic::Request<proto::HopRequest>,
    ) -> Result<tonic::Response<proto::HopReply>, tonic::Status> {
        let lane = gray_tower::current()
            .and_then(|stain| stain.lane().cloned())
            .map(|lane| lane.to_string())
            .unwrap_or_default();
        Ok(tonic::Response::new(proto::HopReply {
            lane,
            ..Default::default()
        }))
    }
}

#[tokio::test]
async fn tonic_with_the_edge_as_a_server_layer() {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(EdgeLayer::new(beta_rules()))
            .add_service(proto::hop_server::HopServer::new(LaneOf))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("serve gRPC");
    });
    let mut client = proto::hop_client::HopClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let call = |beta: bool, forged: bool| {
        let mut req = tonic::Request::new(proto::HopRequest::default());
        if beta {
            req.metadata_mut()
                .insert("x-beta", "1".parse().expect("value"));
        }
        if forged {
            req.metadata_mut()
                .insert("x-gray-lane", "canary".parse().expect("value"));
        }
        req
    };
    let lane = |reply: tonic::Response<proto::HopReply>| reply.into_inner().lane;
    assert_eq!(
        lane(client.call(call(true, false)).await.expect("served")),
        "gray"
    );
    // No trusted client: a forged stain is stripped.
    assert_eq!(
        lane(client.call(call(false, true)).await.expect("served")),
        ""
    );
}
