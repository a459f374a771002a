//! Seed 000's own lane where users put it: an axum service behind `ExtractStainLayer`,
//! calling the next service through a balancer with `Policy::seed_000().with_own_lane(..)`.
//!
//! Service A has a gray instance (own lane `gray`) and a baseline one (no own lane); the
//! next service C has a baseline instance (`gray=false`) and a gray one (`gray=true`).
//! Every hop reads and writes seed 000's header `gray`. A request with no `gray` header
//! takes the calling instance's own lane; `gray: false` (or any value that is not
//! `true`/`false`) is baseline wherever it lands; `gray: true` is gray. Real HTTP all the
//! way: reqwest → axum A → reqwest with `PropagateMiddleware` + `RouteMiddleware` → axum C.

use axum::{Router, extract::State, http::HeaderMap, http::StatusCode, routing::get};
use gray_balance::{BalanceLayer, reqwest::RouteMiddleware};
use gray_core::{Carriers, Lane, codec::PlainHeader};
use gray_discovery::Registry;
use gray_policy::Policy;
use gray_test_support::WAIT;
use gray_tests::{Server, serve, until};
use gray_tower::{
    ExtractStainLayer,
    reqwest::{ClientBuilder, ClientWithMiddleware, PropagateMiddleware},
};
use http::HeaderName;

/// Seed 000's carrier, on every layer and client of the chain.
fn carriers() -> Carriers {
    Carriers::new().with(PlainHeader::flag(
        HeaderName::from_static("gray"),
        Lane::new("gray").expect("a lane"),
    ))
}

/// C's handler: its id and the `gray` header it received (`-` when absent).
async fn c(State(id): State<&'static str>, headers: HeaderMap) -> String {
    let gray = headers.get("gray").map_or("-".into(), |v| {
        String::from_utf8_lossy(v.as_bytes()).into_owned()
    });
    format!("{id} gray={gray}")
}

/// A's handler: its id, then what C answered. No stain is passed by hand.
async fn a(
    State((id, client)): State<(&'static str, ClientWithMiddleware)>,
) -> Result<String, (StatusCode, String)> {
    let bad_gateway = |e: String| (StatusCode::BAD_GATEWAY, e);
    let res = client
        .get("http://svc-c/")
        .send()
        .await
        .map_err(|e| bad_gateway(e.to_string()))?;
    let status = res.status();
    let body = res.text().await.map_err(|e| bad_gateway(e.to_string()))?;
    if !status.is_success() {
        return Err((status, body));
    }
    Ok(format!("{id} -> {body}"))
}

struct Chain {
    a_gray: Server,
    a_base: Server,
    _c: [Server; 2],
}

async fn chain() -> Chain {
    let layer = || ExtractStainLayer::new().with_carriers(carriers());
    let c_app = |id: &'static str| {
        Router::new()
            .route("/", get(c))
            .with_state(id)
            .layer(layer())
    };
    let c_base = serve(c_app("c-base")).await;
    let c_gray = serve(c_app("c-gray")).await;
    let registry = Registry::from_static([(
        "svc-c",
        [
            c_base.instance("c-base", &[("gray", "false")]),
            c_gray.instance("c-gray", &[("gray", "true")]),
        ],
    )])
    .expect("a valid registry");

    // One A instance per own lane, each with its own balancer of C, as each process has.
    let mut a_servers = Vec::new();
    for (id, own_lane) in [("a-gray", Some("gray")), ("a-base", None)] {
        let own_lane = own_lane.map(|l| Lane::new(l).expect("a lane"));
        let policy = Policy::seed_000().with_own_lane(own_lane);
        let instances = registry.service("svc-c").expect("a valid name").discover();
        let balance = BalanceLayer::new("svc-c", policy).build(instances);
        until(WAIT, "both C instances in the balancer", || {
            balance.ready_len() == 2
        })
        .await;
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a reqwest client");
        let client = ClientBuilder::new(http)
            .with(PropagateMiddleware::new().with_carriers(carriers()))
            .with(RouteMiddleware::new().route("svc-c", balance))
            .build();
        let app = Router::new()
            .route("/", get(a))
            .with_state((id, client))
            .layer(layer());
        a_servers.push(serve(app).await);
    }
    let [a_gray, a_base] = <[Server; 2]>::try_from(a_servers).expect("two A instances");
    Chain {
        a_gray,
        a_base,
        _c: [c_base, c_gray],
    }
}

/// Sends `GET /` to `a` with the header `gray: value` when given; the body, on a 200.
async fn send(client: &reqwest::Client, a: &Server, gray: Option<&str>) -> String {
    let mut req = client.get(a.url("/"));
    if let Some(value) = gray {
        req = req.header("gray", value);
    }
    let res = req.send().await.expect("A answers");
    let status = res.status();
    let body = res.text().await.expect("a body");
    assert_eq!(status, 200, "{gray:?}: {body}");
    body
}

#[tokio::test]
async fn a_request_without_the_header_takes_the_calling_instances_own_lane() {
    let chain = chain().await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client");

    // No header: the unstained request takes A's own lane, and no carrier is written
    // onward (C, unstained too, would apply its own lane in turn).
    assert_eq!(
        send(&client, &chain.a_gray, None).await,
        "a-gray -> c-gray gray=-"
    );
    assert_eq!(
        send(&client, &chain.a_base, None).await,
        "a-base -> c-base gray=-"
    );
    // An explicit `gray: false`, in any case, and any value other than true/false:
    // baseline, whatever A's own lane.
    for value in ["false", "FALSE", "yes"] {
        for a in [&chain.a_gray, &chain.a_base] {
            let body = send(&client, a, Some(value)).await;
            assert!(body.ends_with("-> c-base gray=-"), "{value}: {body}");
        }
    }
    // `gray: true`: gray, and written onward.
    for value in ["true", "True"] {
        for a in [&chain.a_gray, &chain.a_base] {
            let body = send(&client, a, Some(value)).await;
            assert!(body.ends_with("-> c-gray gray=true"), "{value}: {body}");
        }
    }
}
