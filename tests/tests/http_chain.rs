//! A chain of three axum services A → B → C on real loopback ports.
//!
//! A's handler calls B with reqwest (through `PropagateMiddleware`), directly, from a task
//! started with `gray_tower::task::spawn`, from `spawn_blocking`, and through a
//! `tower::buffer::Buffer` around a hyper-util client; B calls C with the hyper-util client
//! behind `PropagateStainLayer`; C reports the stain it saw. Every service reads the stain
//! with `ExtractStainLayer`, and forwards the inbound `baggage` header the way an
//! OpenTelemetry propagator would.

use std::time::Duration;

use axum::{Router, extract::State, http::HeaderMap, routing::get};
use bytes::Bytes;
use gray_core::{Carriers, codec::BaggageMember};
use gray_tests::{Seen, Server, echo, serve};
use gray_tower::{
    CaptureStain, CaptureStainLayer, ExtractStainLayer, PropagateStain, PropagateStainLayer,
    propagate::Existing, reqwest::PropagateMiddleware,
};
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, ResponseFuture, connect::HttpConnector},
    rt::TokioExecutor,
};
use tower::{BoxError, ServiceBuilder, ServiceExt, buffer::Buffer};

type HyperClient = Client<HttpConnector, Empty<Bytes>>;

fn hyper_client() -> HyperClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Builds an outbound hyper request to `url`, forwarding the inbound `baggage` lines.
fn outbound(url: &str, inbound: &HeaderMap) -> Request<Empty<Bytes>> {
    let mut req = Request::get(url).body(Empty::new()).expect("valid request");
    for value in inbound.get_all("baggage") {
        req.headers_mut().append("baggage", value.clone());
    }
    req
}

async fn read_body(res: http::Response<hyper::body::Incoming>) -> Result<String, BoxError> {
    let bytes = res.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(bytes.to_vec())?)
}

#[derive(Clone)]
struct HopState {
    next: String,
    client: PropagateStain<HyperClient>,
}

async fn hop(State(state): State<HopState>, headers: HeaderMap) -> Result<String, String> {
    let res = state
        .client
        .oneshot(outbound(&state.next, &headers))
        .await
        .map_err(|e| e.to_string())?;
    read_body(res).await.map_err(|e| e.to_string())
}

#[derive(Clone)]
struct EdgeState {
    next: String,
    reqwest: reqwest_middleware::ClientWithMiddleware,
    buffered: CaptureStain<Buffer<Request<Empty<Bytes>>, ResponseFuture>>,
}

impl EdgeState {
    async fn call_next(&self, headers: &HeaderMap) -> Result<String, String> {
        let mut req = self.reqwest.get(&self.next);
        for value in headers.get_all("baggage") {
            req = req.header("baggage", value.clone());
        }
        let res = req.send().await.map_err(|e| e.to_string())?;
        res.text().await.map_err(|e| e.to_string())
    }
}

async fn direct(State(s): State<EdgeState>, headers: HeaderMap) -> Result<String, String> {
    s.call_next(&headers).await
}

async fn spawned(State(s): State<EdgeState>, headers: HeaderMap) -> Result<String, String> {
    gray_tower::task::spawn(async move { s.call_next(&headers).await })
        .await
        .map_err(|e| e.to_string())?
}

async fn bare_spawned(State(s): State<EdgeState>, headers: HeaderMap) -> Result<String, String> {
    tokio::spawn(async move { s.call_next(&headers).await })
        .await
        .map_err(|e| e.to_string())?
}

async fn blocking(State(s): State<EdgeState>, headers: HeaderMap) -> Result<String, String> {
    let runtime = tokio::runtime::Handle::current();
    gray_tower::task::spawn_blocking(move || runtime.block_on(s.call_next(&headers)))
        .await
        .map_err(|e| e.to_string())?
}

async fn buffered(State(s): State<EdgeState>, headers: HeaderMap) -> Result<String, String> {
    let res = s
        .buffered
        .oneshot(outbound(&s.next, &headers))
        .await
        .map_err(|e| e.to_string())?;
    read_body(res).await.map_err(|e| e.to_string())
}

/// The three services; dropped together.
struct Chain {
    a: Server,
    _b: Server,
    _c: Server,
}

async fn chain(carriers: Carriers, b_existing: Existing) -> Chain {
    let extract = || ExtractStainLayer::new().with_carriers(carriers.clone());

    let c = serve(Router::new().route("/echo", get(echo)).layer(extract())).await;

    let b_client = ServiceBuilder::new()
        .layer(
            PropagateStainLayer::new()
                .with_carriers(carriers.clone())
                .with_existing(b_existing),
        )
        .service(hyper_client());
    let b = serve(
        Router::new()
            .route("/hop", get(hop))
            .with_state(HopState {
                next: c.url("/echo"),
                client: b_client,
            })
            .layer(extract()),
    )
    .await;

    let reqwest = reqwest_middleware::ClientBuilder::new(gray_tests::reqwest_client())
        .with(PropagateMiddleware::new().with_carriers(carriers.clone()))
        .build();
    // The buffer's worker task runs the propagation; the capture layer, in the handler's
    // task, hands it the context through the request extensions.
    let inner = ServiceBuilder::new()
        .layer(PropagateStainLayer::new().with_carriers(carriers.clone()))
        .service(hyper_client());
    let buffered_client = ServiceBuilder::new()
        .layer(CaptureStainLayer::new())
        .service(Buffer::new(inner, 1024));
    let a = serve(
        Router::new()
            .route("/direct", get(direct))
            .route("/spawn", get(spawned))
            .route("/bare-spawn", get(bare_spawned))
            .route("/blocking", get(blocking))
            .route("/buffer", get(buffered))
            .with_state(EdgeState {
                next: b.url("/hop"),
                reqwest,
                buffered: buffered_client,
            })
            .layer(extract()),
    )
    .await;
    Chain { a, _b: b, _c: c }
}

fn driver() -> reqwest::Client {
    gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

async fn get_seen(client: &reqwest::Client, req: reqwest::RequestBuilder) -> Seen {
    let res = client
        .execute(req.build().expect("request"))
        .await
        .expect("response");
    assert_eq!(res.status(), 200, "the chain answers normally");
    Seen::parse(&res.text().await.expect("body"))
}

const ROUTE: &str = r#"{"all":"v2","custom":{"svc-b":"v3"}}"#;
const CARRIED_PATHS: [&str; 4] = ["/direct", "/spawn", "/blocking", "/buffer"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_sees_exactly_the_stain_that_reached_a() {
    let chain = chain(Carriers::default(), Existing::Replace).await;
    let client = driver();
    for path in CARRIED_PATHS {
        let stained = client
            .get(chain.a.url(path))
            .header("x-gray-lane", "canary")
            .header("x-gray-info", ROUTE);
        let seen = get_seen(&client, stained).await;
        assert_eq!(seen.lane.as_deref(), Some("canary"), "{path}");
        assert_eq!(seen.extension_lane.as_deref(), Some("canary"), "{path}");
        assert_eq!(seen.route.as_deref(), Some(ROUTE), "{path}");

        let unstained = get_seen(&client, client.get(chain.a.url(path))).await;
        assert_eq!(unstained, Seen::default(), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_tokio_spawn_loses_the_stain() {
    let chain = chain(Carriers::default(), Existing::Replace).await;
    let client = driver();
    let stained = client
        .get(chain.a.url("/bare-spawn"))
        .header("x-gray-lane", "canary");
    assert_eq!(get_seen(&client, stained).await, Seen::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_concurrent_requests_each_keep_their_own_stain() {
    const REQUESTS: usize = 10_000;
    const CONCURRENCY: usize = 64;
    let chain = chain(Carriers::default(), Existing::Replace).await;
    let client = driver();
    let a = chain.a.url("");
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..REQUESTS {
        let permit = semaphore.clone().acquire_owned().await.expect("semaphore");
        let client = client.clone();
        let url = format!("{a}{}", CARRIED_PATHS[i % CARRIED_PATHS.len()]);
        tasks.spawn(async move {
            let _permit = permit;
            let expected = (i % 2 == 0).then(|| format!("lane-{i}"));
            let mut req = client.get(&url);
            if let Some(lane) = &expected {
                req = req.header("x-gray-lane", lane);
            }
            let seen = get_seen(&client, req).await;
            (expected, seen)
        });
    }
    let mut mismatches = 0;
    let mut observed = 0;
    while let Some(joined) = tasks.join_next().await {
        let (expected, seen) = joined.expect("request task");
        observed += 1;
        if seen.lane != expected || seen.extension_lane != expected {
            mismatches += 1;
        }
    }
    assert_eq!(observed, REQUESTS);
    assert_eq!(mismatches, 0, "every observation matches its own request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baggage_stain_arrives_with_the_other_members_intact() {
    let carriers = Carriers::new().with(BaggageMember::new("gray.lane").expect("valid key"));
    // B rewrites the stain's member on the way out; the other members must not move.
    let chain = chain(carriers, Existing::Replace).await;
    let client = driver();
    for path in CARRIED_PATHS {
        let req = client
            .get(chain.a.url(path))
            .header("baggage", "userId=42,gray.lane=canary")
            .header("baggage", "tenant=acme;p=1");
        let seen = get_seen(&client, req).await;
        assert_eq!(seen.lane.as_deref(), Some("canary"), "{path}");
        let baggage = seen.baggage.expect("baggage arrives");
        let members: Vec<&str> = baggage.split(',').map(str::trim).collect();
        assert_eq!(
            members,
            ["userId=42", "tenant=acme;p=1", "gray.lane=canary"],
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_stains_get_a_normal_response_and_count_as_unstained() {
    let carriers = Carriers::default().with(BaggageMember::new("gray.lane").expect("valid key"));
    let chain = chain(carriers, Existing::Replace).await;
    let client = driver();
    let url = chain.a.url("/direct");
    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        (
            "non-UTF-8 lane",
            client.get(&url).header(
                "x-gray-lane",
                HeaderValue::from_bytes(b"gr\xffay").expect("obs-text is a valid header value"),
            ),
        ),
        (
            "oversized lane",
            client.get(&url).header("x-gray-lane", "g".repeat(10_000)),
        ),
        (
            "invalid lane name",
            client.get(&url).header("x-gray-lane", "a b"),
        ),
        (
            "broken JSON",
            client.get(&url).header("x-gray-info", r#"{"all":"v2""#),
        ),
        (
            "JSON of the wrong shape",
            client.get(&url).header("x-gray-info", r#"{"all":["v2"]}"#),
        ),
        (
            "duplicated baggage member, the first one malformed",
            client
                .get(&url)
                .header("baggage", "gray.lane=%zz,gray.lane=b"),
        ),
        (
            "bad percent-encoding in baggage",
            client.get(&url).header("baggage", "gray.lane=%zz"),
        ),
    ];
    for (case, req) in cases {
        let seen = get_seen(&client, req).await;
        assert_eq!(seen.lane, None, "{case}");
        assert_eq!(seen.extension_lane, None, "{case}");
        assert_eq!(seen.route, None, "{case}");
    }
    // Not malformed: a duplicated header is read as its first value (seed 000's
    // `request.getHeader`), and sent on as that one value.
    let duplicated = client
        .get(&url)
        .header("x-gray-lane", "gray")
        .header("x-gray-lane", "blue");
    let seen = get_seen(&client, duplicated).await;
    assert_eq!(seen.lane.as_deref(), Some("gray"), "duplicated lane");
    // The same rule for the stain's `baggage` member: the first one decides.
    let duplicated = client
        .get(&url)
        .header("baggage", "gray.lane=a,gray.lane=b");
    let seen = get_seen(&client, duplicated).await;
    assert_eq!(seen.lane.as_deref(), Some("a"), "duplicated baggage member");
}
