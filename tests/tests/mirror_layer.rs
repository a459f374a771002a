//! A service mirroring its own outbound calls to the next service's gray lane
//! (`gray_tower::mirror`), with real axum instances on loopback: a tower client (gray's
//! balancer over gray-discovery's HTTP endpoints, the shape a deployment builds) under
//! `MirrorLayer`, and a reqwest client with `MirrorMiddleware`. Baseline's GETs are copied
//! to gray with its stain and `x-gray-mirror`, stained and unlisted requests are not, and a
//! shadow that never answers costs the calls nothing.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::get};
use gray_balance::{BalanceLayer, reqwest::RouteMiddleware};
use gray_core::{Labels, Lane, Stain};
use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
use gray_policy::{Fallback, Policy};
use gray_test_support::WAIT;
use gray_tests::{Server, serve};
use gray_tower::{
    PropagateStainLayer, StainExt,
    mirror::{Copier, MirrorLayer, MirrorStats},
    reqwest::{ClientBuilder, MirrorMiddleware, PropagateMiddleware},
};
use http::Request;
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceBuilder, ServiceExt};

/// What an instance saw: each request's method, `x-gray-lane` and `x-gray-mirror`.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

async fn instance(seen: Seen) -> Server {
    async fn handle(
        State(seen): State<Seen>,
        method: axum::http::Method,
        headers: HeaderMap,
        _body: Bytes,
    ) -> &'static str {
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap_or_default().to_owned())
        };
        seen.lock().unwrap().push((
            method.to_string(),
            header("x-gray-lane"),
            header("x-gray-mirror"),
        ));
        "ok"
    }
    serve(
        Router::new()
            .route("/item", get(handle).post(handle))
            .with_state(seen),
    )
    .await
}

/// The two instances of `svc`: `base-1`, and `gray-1` (labelled `lane=gray`) at `gray`.
fn discover(base: SocketAddr, gray: SocketAddr) -> StaticDiscover {
    let instance = |id: &str, addr: SocketAddr, labels: Labels| {
        Instance::new(
            id.parse().unwrap(),
            addr.to_string().parse().unwrap(),
            labels,
        )
    };
    StaticDiscover::new([
        instance("base-1", base, Labels::new()),
        instance("gray-1", gray, Labels::from_iter([("lane", "gray")])),
    ])
}

/// Waits (within [`WAIT`]) until `done` copies are answered or failed.
async fn copies_done(stats: &MirrorStats, done: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while stats.answered() + stats.failed() < done {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} copies not done within {WAIT:?}: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn gray() -> Lane {
    Lane::new("gray").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_client_copies_baseline_gets_to_the_gray_lane() {
    let (base_seen, gray_seen) = (Seen::default(), Seen::default());
    let base = instance(base_seen.clone()).await;
    let gray_instance = instance(gray_seen.clone()).await;
    // The calls to `svc`, routed by their stain (baseline's fallback for gray's calls), and
    // the copies' client: the same instances, no fallback, the stain written.
    let calls = BalanceLayer::new("svc", Policy::new().with_fallback(Fallback::Baseline))
        .build(HttpEndpoints::new().discover(discover(base.addr(), gray_instance.addr())));
    let copies = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(
            BalanceLayer::new("svc", Policy::new())
                .build(HttpEndpoints::new().discover(discover(base.addr(), gray_instance.addr()))),
        );
    let mirror = MirrorLayer::new(Copier::new(gray()), copies);
    let stats = mirror.stats();
    let mut client = ServiceBuilder::new()
        .layer(mirror)
        .layer(PropagateStainLayer::new())
        .service(calls);
    let call = |method: http::Method| {
        Request::builder()
            .method(method)
            .uri("/item")
            .body(Full::new(Bytes::from_static(b"payload")))
            .unwrap()
    };
    for _ in 0..10 {
        let response = client
            .ready()
            .await
            .unwrap()
            .call(call(http::Method::GET))
            .await
            .unwrap();
        assert_eq!(
            response.into_body().collect().await.unwrap().to_bytes(),
            "ok"
        );
    }
    // Not listed: not copied.
    client
        .ready()
        .await
        .unwrap()
        .call(call(http::Method::POST))
        .await
        .unwrap();
    // A call of a gray request goes to gray, and is not copied (the stain is the task's
    // when the client is called: `oneshot` calls it in the scope).
    client
        .clone()
        .oneshot(call(http::Method::GET))
        .with_stain(Stain::in_lane(gray()))
        .await
        .unwrap();
    copies_done(&stats, 10).await;
    assert_eq!(
        (stats.sent(), stats.answered(), stats.failed()),
        (10, 10, 0)
    );

    let base_seen = base_seen.lock().unwrap().clone();
    assert_eq!(base_seen.len(), 11, "{base_seen:?}");
    assert!(
        base_seen
            .iter()
            .all(|(_, lane, mark)| lane.is_none() && mark.is_none())
    );
    let gray_seen = gray_seen.lock().unwrap().clone();
    let copies: Vec<_> = gray_seen.iter().filter(|s| s.2.is_some()).collect();
    assert_eq!(copies.len(), 10, "{gray_seen:?}");
    assert!(copies.iter().all(|(method, lane, mark)| method == "GET"
        && lane.as_deref() == Some("gray")
        && mark.as_deref() == Some("1")));
    assert_eq!(
        gray_seen.len(),
        11,
        "the copies and the gray call: {gray_seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_never_answers_costs_the_calls_nothing() {
    let (hole, _accepted) = gray_test_support::net::serve(|stream| async move {
        let _held = stream;
        std::future::pending::<()>().await;
    })
    .await;
    let base_seen = Seen::default();
    let base = instance(base_seen.clone()).await;
    let calls = BalanceLayer::new("svc", Policy::new())
        .build(HttpEndpoints::new().discover(discover(base.addr(), hole)));
    let copies = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(
            BalanceLayer::new("svc", Policy::new())
                .build(HttpEndpoints::new().discover(discover(base.addr(), hole))),
        );
    let mirror = MirrorLayer::new(Copier::new(gray()).with_max_in_flight(2), copies)
        .with_timeout(Duration::from_secs(60));
    let stats = mirror.stats();
    let mut client = ServiceBuilder::new().layer(mirror).service(calls);
    for _ in 0..20 {
        let request = Request::get("/item").body(Full::new(Bytes::new())).unwrap();
        let response = tokio::time::timeout(WAIT, client.ready().await.unwrap().call(request))
            .await
            .expect("a call does not wait for its copy")
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!((stats.sent(), stats.dropped_busy()), (2, 18));
    assert_eq!(stats.in_flight(), 2);
    assert_eq!(base_seen.lock().unwrap().len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reqwest_client_copies_baseline_gets_to_the_gray_lane() {
    let (base_seen, gray_seen) = (Seen::default(), Seen::default());
    let base = instance(base_seen.clone()).await;
    let gray_instance = instance(gray_seen.clone()).await;
    let route = |fallback: Fallback| {
        RouteMiddleware::new().route(
            "svc",
            BalanceLayer::new("svc", Policy::new().with_fallback(fallback))
                .build(discover(base.addr(), gray_instance.addr())),
        )
    };
    let copies = ClientBuilder::new(reqwest::Client::new())
        .with(route(Fallback::None))
        .with(PropagateMiddleware::new())
        .build();
    let mirror = MirrorMiddleware::new(Copier::new(gray()), copies);
    let stats = mirror.stats();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(mirror)
        .with(route(Fallback::Baseline))
        .with(PropagateMiddleware::new())
        .build();
    for _ in 0..10 {
        let response = client.get("http://svc/item").send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    client
        .post("http://svc/item")
        .body("x")
        .send()
        .await
        .unwrap();
    client
        .get("http://svc/item")
        .send()
        .with_stain(Stain::in_lane(gray()))
        .await
        .unwrap();
    copies_done(&stats, 10).await;
    assert_eq!((stats.sent(), stats.answered()), (10, 10));
    let base_seen = base_seen.lock().unwrap().clone();
    assert_eq!(base_seen.len(), 11, "{base_seen:?}");
    assert!(base_seen.iter().all(|s| s.2.is_none()));
    let gray_seen = gray_seen.lock().unwrap().clone();
    let copies: Vec<_> = gray_seen.iter().filter(|s| s.2.is_some()).collect();
    assert_eq!(copies.len(), 10, "{gray_seen:?}");
    assert!(
        copies
            .iter()
            .all(|(method, lane, _)| method == "GET" && lane.as_deref() == Some("gray"))
    );
}
