//! New instances get traffic at one request per second, with real servers, real clients
//! and Peak-EWMA on the real clock.
//!
//! Peak-EWMA assumes 30 ms for an endpoint it has not measured, so without a rule for new
//! endpoints p2c keeps choosing a warm one at low rates. gray-balance's crate docs ("New
//! endpoints") promise that a new endpoint is probed: with requests one at a time, it gets
//! the next request routed to its subset (**N = 1** for a single new endpoint) and its
//! first 3 requests. The balancer's unit test checks this on paused time with mock
//! endpoints; here the endpoints are HTTP servers on loopback, so time runs for real (a
//! paused clock would jump while a request waits on its socket, and the round trips
//! Peak-EWMA measures would be meaningless). Each test sends 3 requests one second apart.
//!
//! The instances come from a watched instance file; the baseline case sends with a tower
//! client (the balancer over gray-discovery's HTTP endpoints), the gray one with reqwest
//! (`RouteMiddleware`, which picks with `Balance::pick`).

use std::{net::SocketAddr, time::Duration};

use axum::{Router, extract::State, routing::get};
use bytes::Bytes;
use gray_balance::{Balance, BalanceLayer, reqwest::RouteMiddleware};
use gray_core::{Lane, Stain};
use gray_discovery::{Registry, http::HttpEndpoints, source::file::FileSource};
use gray_policy::Policy;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{Server, serve, until, write_instances};
use http::Request;
use http_body_util::{BodyExt, Empty};
use tower::ServiceExt;

/// The probes of a new endpoint (gray-balance's crate docs).
const PROBES: usize = 3;

/// An instance that answers with its id.
async fn instance(id: &'static str) -> Server {
    async fn answer(State(id): State<&'static str>) -> &'static str {
        id
    }
    serve(Router::new().route("/", get(answer)).with_state(id)).await
}

/// A registry on the instance file `instances.toml` in `dir`, holding `instances` of
/// `stock` now; polled every 50 ms.
async fn registry(dir: &TempDir, instances: &[(&str, SocketAddr, bool)]) -> Registry {
    let path = dir.path().join("instances.toml");
    write_instances(&path, "stock", instances);
    let source = FileSource::new(&path).with_interval(Duration::from_millis(50));
    Registry::start(source).await.expect("the registry starts")
}

/// Lists `instances` in the instance file in `dir`, then waits until `balance` has them.
async fn list<K, S>(
    dir: &TempDir,
    instances: &[(&str, SocketAddr, bool)],
    balance: &Balance<K, S>,
) {
    write_instances(&dir.path().join("instances.toml"), "stock", instances);
    let what = "the new instance in the balancer";
    until(WAIT, what, || balance.len() == instances.len()).await;
}

/// Waits one second (the request rate under test), then sends.
async fn one_second_later<F: Future>(send: F) -> F::Output {
    tokio::time::sleep(Duration::from_secs(1)).await;
    send.await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_baseline_instance_beside_a_warm_one_gets_the_next_request() {
    let (old, new) = (instance("old").await, instance("new").await);
    let dir = TempDir::new("new-baseline");
    let registry = registry(&dir, &[("old", old.addr(), false)]).await;
    let endpoints = HttpEndpoints::<_, Empty<Bytes>>::new();
    let stock = registry
        .service("stock")
        .expect("a name")
        .endpoints(endpoints);
    let balance = BalanceLayer::new("stock", Policy::new()).build(stock);
    let send = || async {
        let req = Request::get("/").body(Empty::new()).expect("a request");
        let res = balance.clone().oneshot(req).await.expect("an answer");
        let body = res.into_body().collect().await.expect("a body").to_bytes();
        String::from_utf8(body.to_vec()).expect("UTF-8")
    };

    // `old` is warm: past its probes, measured.
    for _ in 0..PROBES + 2 {
        assert_eq!(send().await, "old");
    }
    list(
        &dir,
        &[("old", old.addr(), false), ("new", new.addr(), false)],
        &balance,
    )
    .await;

    let mut served = Vec::new();
    for _ in 0..PROBES {
        served.push(one_second_later(send()).await);
    }
    assert_eq!(served, ["new"; PROBES], "N = 1, then its probes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_gray_instance_beside_another_gets_the_next_gray_request() {
    let base = instance("base").await;
    let (gray_1, gray_2) = (instance("gray-1").await, instance("gray-2").await);
    let dir = TempDir::new("new-gray");
    let first = [
        ("base", base.addr(), false),
        ("gray-1", gray_1.addr(), true),
    ];
    let registry = registry(&dir, &first).await;
    let stock = registry.service("stock").expect("a name").discover();
    let balance = BalanceLayer::new("stock", Policy::new()).build(stock);
    let client = reqwest_middleware::ClientBuilder::new(gray_tests::reqwest_client())
        .with(RouteMiddleware::new().route("stock", balance.clone()))
        .build();
    let gray = Stain::in_lane(Lane::new("gray").expect("a lane"));
    let send = |stain: Option<Stain>| {
        let mut req = client.get("http://stock/");
        if let Some(stain) = stain {
            req = req.with_extension(stain);
        }
        async move {
            let res = req.send().await.expect("an answer");
            res.text().await.expect("a body")
        }
    };

    for _ in 0..PROBES + 2 {
        assert_eq!(send(Some(gray.clone())).await, "gray-1");
        assert_eq!(send(None).await, "base");
    }
    let all = [
        ("base", base.addr(), false),
        ("gray-1", gray_1.addr(), true),
        ("gray-2", gray_2.addr(), true),
    ];
    list(&dir, &all, &balance).await;

    let mut served = Vec::new();
    for _ in 0..PROBES {
        served.push(one_second_later(send(Some(gray.clone()))).await);
        // Unstained requests meanwhile never reach a gray instance.
        assert_eq!(send(None).await, "base");
    }
    assert_eq!(served, ["gray-2"; PROBES], "N = 1, then its probes");
}
