//! W3C baggage across a service in another language, on real loopback ports:
//!
//! ```text
//! client ──► A ──► middle ──► C ──► d (a baseline and a gray instance, by C's balancer)
//! ```
//!
//! A and C are Rust services with gray's layers and the `baggage` carrier on both sides
//! (`Carriers::default().with_baggage()`). The middle hop stands for an
//! OpenTelemetry-instrumented service in another language: it forwards **only**
//! `traceparent` and `baggage`, so the stain reaches C by its `baggage` member alone. A's
//! handler either builds a fresh outbound request or copies the inbound stain headers by
//! hand (as the issue's handlers did); no handler copies `baggage` for the members to
//! travel.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, Uri},
    routing::get,
};
use gray_core::{Carriers, Stain};
use gray_tests::{
    Server,
    route::{Lines, RoutedClient, current_lane, get_root, instances, routed_client},
    serve,
};
use gray_tower::{ExtractStainLayer, reqwest::PropagateMiddleware};
use reqwest_middleware::ClientWithMiddleware;
use tower::ServiceExt;

/// Request headers, as (name, value) pairs.
type Headers<'a> = &'a [(&'a str, &'a str)];

#[derive(Clone)]
struct AState {
    middle: String,
    client: ClientWithMiddleware,
}

/// A: calls the middle hop; with `?copy=true`, copies the inbound stain headers (and
/// `baggage`) onto the outbound request first.
async fn a(State(s): State<AState>, uri: Uri, headers: HeaderMap) -> Result<String, String> {
    let mut req = s.client.get(&s.middle);
    // A's tracing would forward the trace context; gray never touches it.
    if let Some(traceparent) = headers.get("traceparent") {
        req = req.header("traceparent", traceparent.clone());
    }
    if uri.query() == Some("copy=true") {
        for name in ["x-gray-lane", "x-gray-info", "baggage"] {
            for value in headers.get_all(name) {
                req = req.header(name, value.clone());
            }
        }
    }
    let res = req.send().await.map_err(|e| e.to_string())?;
    let body = res.text().await.map_err(|e| e.to_string())?;
    Ok(format!("a_lane={}\n{body}", current_lane()))
}

/// The middle hop: no gray code; forwards only `traceparent` and `baggage`, and reports
/// the `x-gray-lane` it received from A.
async fn middle(
    State((next, client)): State<(String, reqwest::Client)>,
    headers: HeaderMap,
) -> Result<String, String> {
    let mut req = client.get(&next);
    for name in ["traceparent", "baggage"] {
        for value in headers.get_all(name) {
            req = req.header(name, value.clone());
        }
    }
    let res = req.send().await.map_err(|e| e.to_string())?;
    let body = res.text().await.map_err(|e| e.to_string())?;
    let lanes: Vec<_> = headers
        .get_all("x-gray-lane")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    Ok(format!("middle_x_gray_lane={}\n{body}", lanes.join(",")))
}

/// C: reports the stain it read and calls `d` through its balancer.
async fn c(
    State(d): State<RoutedClient>,
    stain: axum::Extension<Stain>,
    headers: HeaderMap,
) -> Result<String, String> {
    let inherited = stain.baggage().map(|b| b.as_str().to_owned());
    let traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let seen_by_d = d.oneshot(get_root()).await.map_err(|e| e.to_string())?;
    Ok(format!(
        "c_lane={}\nc_inherited={}\nc_traceparent={traceparent}\n{}",
        current_lane(),
        inherited.unwrap_or_default(),
        seen_by_d.prefixed("d_")
    ))
}

/// The whole chain; dropped together.
struct Chain {
    a: Server,
    _middle: Server,
    _c: Server,
    _d: gray_tests::route::Instances,
    driver: reqwest::Client,
}

impl Chain {
    async fn start() -> Chain {
        let carriers = Carriers::default().with_baggage();
        let d = instances(&carriers).await;
        let c = serve(
            Router::new()
                .route("/", get(c))
                .with_state(routed_client(&d, &carriers, true))
                .layer(ExtractStainLayer::new().with_carriers(carriers.clone())),
        )
        .await;
        let middle = serve(
            Router::new()
                .route("/", get(middle))
                .with_state((c.url("/"), gray_tests::reqwest_client())),
        )
        .await;
        let client = gray_tower::reqwest::ClientBuilder::new(gray_tests::reqwest_client())
            .with(PropagateMiddleware::new().with_carriers(carriers.clone()))
            .build();
        let a = serve(
            Router::new()
                .route("/", get(a))
                .with_state(AState {
                    middle: middle.url("/"),
                    client,
                })
                .layer(ExtractStainLayer::new().with_carriers(carriers)),
        )
        .await;
        let driver = gray_tests::reqwest_builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("a client");
        Chain {
            a,
            _middle: middle,
            _c: c,
            _d: d,
            driver,
        }
    }

    /// Sends `headers` to A (copying them onward by hand with `copy`); what each hop saw.
    async fn send(&self, headers: &[(&str, &str)], copy: bool) -> Lines {
        let mut req = self.driver.get(self.a.url(&format!("/?copy={copy}")));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = req.send().await.expect("a response");
        assert_eq!(res.status(), 200, "the chain answers normally");
        Lines::parse(&res.text().await.expect("a body"))
    }
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// 64 members, 8,192 bytes once A adds `,gray.lane=gray`: the W3C minimum that every
/// platform must propagate. Among them `userId=42;ttl=5` and percent-encoded values.
fn sixty_four_members() -> String {
    let mut members = vec![
        "userId=42;ttl=5".to_owned(),
        "name=J%C3%BCrgen%20M%C3%BCller".to_owned(),
        "query=a%3Db%2Cc%3Bd;p".to_owned(),
    ];
    for i in members.len()..63 {
        members.push(format!("k{i:02}=v{i:02}"));
    }
    let without_last = members.join(",").len() + ",k63=".len();
    let filler = 8192 - ",gray.lane=gray".len() - without_last;
    members.push(format!("k63={}", "x".repeat(filler)));
    let list = members.join(",");
    assert_eq!(list.len() + ",gray.lane=gray".len(), 8192);
    list
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_members_cross_a_service_in_another_language_intact() {
    let chain = Chain::start().await;
    let members = sixty_four_members();
    let with_lane = format!("{members},gray.lane=gray");

    // The stain by `x-gray-lane` (which the middle hop drops), or by the member alone.
    let by_header = [
        ("x-gray-lane", "gray"),
        ("baggage", members.as_str()),
        ("traceparent", TRACEPARENT),
    ];
    let by_member = [
        ("baggage", with_lane.as_str()),
        ("traceparent", TRACEPARENT),
    ];
    for (case, headers) in [("x-gray-lane", &by_header[..]), ("member", &by_member)] {
        for copy in [false, true] {
            let seen = chain.send(headers, copy).await;
            assert_eq!(seen.get("a_lane"), "gray", "{case}, copy {copy}");
            assert_eq!(
                seen.get("middle_x_gray_lane"),
                "gray",
                "{case}, copy {copy}"
            );
            assert_eq!(seen.get("c_traceparent"), TRACEPARENT);
            // C read the lane from `baggage` alone, and kept the 64 members byte for byte.
            assert_eq!(seen.get("c_lane"), "gray", "{case}, copy {copy}");
            assert_eq!(seen.get("c_inherited"), members, "{case}, copy {copy}");
            // C's balancer routed by it, and C wrote the members onward.
            assert_eq!(seen.get("d_id"), "d-gray", "{case}, copy {copy}");
            assert_eq!(seen.get("d_lane"), "gray");
            assert_eq!(seen.get("d_baggage"), with_lane, "{case}, copy {copy}");
        }
    }

    // Unstained: the members travel all the same, and nothing routes to gray.
    let short = "userId=42;ttl=5,tenant=acme,name=J%C3%BCrgen";
    let seen = chain.send(&[("baggage", short)], false).await;
    assert_eq!(seen.get("c_lane"), "");
    assert_eq!(seen.get("c_inherited"), short);
    assert_eq!(seen.get("d_id"), "d-base");
    assert_eq!(seen.get("d_baggage"), short);
    assert_eq!(seen.get("middle_x_gray_lane"), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_duplicated_malformed_and_conflicting_stains_never_misroute() {
    const ROUNDS: usize = 25;
    let chain = Arc::new(Chain::start().await);
    // (case, what the client sends, A's decision)
    let cases: [(&str, Headers<'_>, &str); 7] = [
        (
            "duplicated member",
            &[
                ("x-gray-lane", "gray"),
                ("baggage", "userId=42,gray.lane=gray,gray.lane=gray"),
            ],
            "gray",
        ),
        (
            "duplicated member alone, read as its first one",
            &[("baggage", "userId=42,gray.lane=gray,gray.lane=blue")],
            "gray",
        ),
        (
            "conflicting member",
            &[
                ("x-gray-lane", "gray"),
                ("baggage", "userId=42,gray.lane=blue"),
            ],
            "gray",
        ),
        (
            "malformed member",
            &[
                ("x-gray-lane", "gray"),
                ("baggage", "userId=42,gray.lane=%%"),
            ],
            "gray",
        ),
        (
            "lane in another case",
            &[
                ("x-gray-lane", "GRAY"),
                ("baggage", "userId=42,gray.lane=Gray"),
            ],
            "gray",
        ),
        (
            "forged lane header and a malformed first member, baseline decision",
            &[
                ("x-gray-lane", "not a lane"),
                ("baggage", "userId=42,gray.lane=%%,gray.lane=gray"),
            ],
            "",
        ),
        (
            "malformed member alone, baseline decision",
            &[("baggage", "userId=42,gray.lane=%%")],
            "",
        ),
    ];
    let mut tasks = tokio::task::JoinSet::new();
    for (case, headers, decision) in cases {
        for copy in [false, true] {
            for _ in 0..ROUNDS {
                let chain = chain.clone();
                tasks.spawn(async move {
                    let seen = chain.send(headers, copy).await;
                    (case, copy, decision, seen)
                });
            }
        }
    }
    let mut misroutes = Vec::new();
    let mut requests = 0;
    while let Some(joined) = tasks.join_next().await {
        let (case, copy, decision, seen) = joined.expect("a request task");
        requests += 1;
        let expected_instance = if decision.is_empty() {
            "d-base"
        } else {
            "d-gray"
        };
        let expected_baggage = if decision.is_empty() {
            "userId=42".to_owned()
        } else {
            format!("userId=42,gray.lane={decision}")
        };
        let right = seen.get("a_lane") == decision
            && seen.get("middle_x_gray_lane") == decision
            && seen.get("c_lane") == decision
            && seen.get("d_id") == expected_instance
            && seen.get("d_baggage") == expected_baggage;
        if !right {
            misroutes.push(format!("{case}, copy {copy}: {seen:?}"));
        }
    }
    assert_eq!(requests, 7 * 2 * ROUNDS);
    assert!(
        misroutes.is_empty(),
        "{} misroutes, first: {:?}",
        misroutes.len(),
        misroutes.first()
    );
}
