//! OpenTelemetry interop (gray-tower feature `opentelemetry`), on real loopback ports and
//! with the real `opentelemetry_sdk` W3C `BaggagePropagator`:
//!
//! - a service that extracts inbound requests with OpenTelemetry's propagator, and has no
//!   gray server layer, routes its outbound calls by the lane in the OpenTelemetry
//!   baggage (through a balancer, and through the reqwest middleware);
//! - the same with `tracing-opentelemetry`, where the baggage lives in the request span's
//!   context: no second header;
//! - behind `ExtractStainLayer` + `AttachLaneLayer`, the lane is a member of the current
//!   OpenTelemetry baggage while a request is handled, and OpenTelemetry's propagator
//!   injects it onward;
//! - a lane an app sets in OpenTelemetry baggage (a job, outside any server) routes;
//! - in the OpenTelemetry-only configuration, reqwest's `RouteMiddleware` and
//!   `PropagateMiddleware` agree in either order: the gray instance is picked and receives
//!   the gray header.

use std::{sync::OnceLock, time::Duration};

use axum::{Router, extract::State, http::HeaderMap, middleware::Next, routing::get};
use gray_balance::{BalanceLayer, reqwest::RouteMiddleware};
use gray_core::{Carriers, Labels};
use gray_discovery::{Instance, StaticDiscover};
use gray_policy::{Fallback, Policy};
use gray_tests::{
    Server,
    route::{Instances, Lines, RoutedClient, get_root, instances, routed_client},
    serve,
};
use gray_tower::{
    ExtractStainLayer,
    otel::AttachLaneLayer,
    reqwest::{ClientBuilder, PropagateMiddleware},
};
use opentelemetry::{
    Context, KeyValue,
    baggage::BaggageExt,
    context::FutureExt,
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::TracerProvider,
};
use opentelemetry_sdk::propagation::BaggagePropagator;
use tower::ServiceExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Request headers, as (name, value) pairs.
type Headers<'a> = &'a [(&'a str, &'a str)];

/// Reads an `http::HeaderMap` for OpenTelemetry's propagators.
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes an `http::HeaderMap` for OpenTelemetry's propagators.
struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// The OpenTelemetry server middleware of an app: extracts the inbound baggage with the
/// SDK's propagator and makes it the current context while the request is handled.
async fn otel_extract(req: axum::extract::Request, next: Next) -> axum::response::Response {
    let cx = BaggagePropagator::new().extract(&HeaderExtractor(req.headers()));
    next.run(req).with_context(cx).await
}

/// The same with `tracing-opentelemetry`: the extracted context is the parent of the
/// request span, which the span makes current while it is entered.
async fn traced_extract(req: axum::extract::Request, next: Next) -> axum::response::Response {
    let cx = BaggagePropagator::new().extract(&HeaderExtractor(req.headers()));
    let span = tracing::info_span!("request");
    span.set_parent(cx).expect("a span with a parent");
    next.run(req).instrument(span).await
}

/// Installs a `tracing` subscriber with the OpenTelemetry layer (an SDK tracer), once.
fn install_tracing() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("gray-tests"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
    });
}

#[derive(Clone)]
struct AppState {
    /// `d`, through a balancer (`PropagateStainLayer` over a `Buffer`, no capture layer).
    d: RoutedClient,
    /// `d`'s gray instance directly, through reqwest with gray's middleware.
    reqwest: reqwest_middleware::ClientWithMiddleware,
    direct: String,
}

/// A handler with no gray code: calls `d` both ways, reports what `d` saw.
async fn app(State(s): State<AppState>) -> Result<String, String> {
    let routed = s.d.oneshot(get_root()).await.map_err(|e| e.to_string())?;
    let res = s
        .reqwest
        .get(&s.direct)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let direct = Lines::parse(&res.text().await.map_err(|e| e.to_string())?);
    Ok(format!(
        "{}{}",
        routed.prefixed("routed_"),
        direct.prefixed("direct_")
    ))
}

/// An app whose only server middleware is `extract` (OpenTelemetry's, no gray layer).
async fn otel_app(d: &Instances, extract_traced: bool) -> Server {
    let carriers = Carriers::default().with_baggage();
    let state = AppState {
        d: routed_client(d, &carriers, false),
        reqwest: ClientBuilder::new(gray_tests::reqwest_client())
            .with(PropagateMiddleware::new())
            .build(),
        direct: d.base.url("/"),
    };
    let router = Router::new().route("/", get(app)).with_state(state);
    let router = if extract_traced {
        router.layer(axum::middleware::from_fn(traced_extract))
    } else {
        router.layer(axum::middleware::from_fn(otel_extract))
    };
    serve(router).await
}

fn driver() -> reqwest::Client {
    gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("a client")
}

async fn send(server: &Server, baggage: Option<&str>) -> Lines {
    let mut req = driver().get(server.url("/"));
    if let Some(baggage) = baggage {
        req = req.header("baggage", baggage);
    }
    let res = req.send().await.expect("a response");
    assert_eq!(res.status(), 200, "the app answers normally");
    Lines::parse(&res.text().await.expect("a body"))
}

async fn a_lane_in_the_extracted_baggage_routes(extract_traced: bool) {
    let d = instances(&Carriers::default().with_baggage()).await;
    let server = otel_app(&d, extract_traced).await;
    for _ in 0..10 {
        let seen = send(&server, Some("userId=42,gray.lane=gray")).await;
        // The balancer routed by the lane OpenTelemetry extracted...
        assert_eq!(seen.get("routed_id"), "d-gray", "{seen:?}");
        assert_eq!(seen.get("routed_lane"), "gray");
        // ...and both clients stated it on their carriers.
        assert_eq!(seen.get("direct_id"), "d-base");
        assert_eq!(seen.get("direct_lane"), "gray", "{seen:?}");
        assert_eq!(seen.get("routed_baggage"), "gray.lane=gray");

        let unstained = send(&server, Some("userId=42")).await;
        assert_eq!(unstained.get("routed_id"), "d-base");
        assert_eq!(unstained.get("direct_lane"), "");
        let none = send(&server, None).await;
        assert_eq!(none.get("routed_id"), "d-base");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_extracting_with_the_otel_propagator_routes_by_its_lane() {
    a_lane_in_the_extracted_baggage_routes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_opentelemetry_no_second_header_is_needed() {
    install_tracing();
    a_lane_in_the_extracted_baggage_routes(true).await;
}

/// Reports the lane in the current OpenTelemetry baggage, and the `baggage` header
/// OpenTelemetry's propagator writes for an outbound request from here.
async fn otel_view() -> String {
    let lane = Context::map_current(|cx| {
        cx.baggage()
            .get("gray.lane")
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default()
    });
    let mut outbound = HeaderMap::new();
    BaggagePropagator::new().inject(&mut HeaderInjector(&mut outbound));
    let injected = outbound
        .get("baggage")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // The injector writes members in no fixed order: sort them.
    let mut members: Vec<&str> = injected.split(',').filter(|m| !m.is_empty()).collect();
    members.sort_unstable();
    format!("otel_lane={lane}\ninjected={}\n", members.join(","))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_extract_stain_the_lane_is_in_the_otel_baggage() {
    let carriers = Carriers::default().with_baggage();
    // The OpenTelemetry middleware outside, gray's layers inside: the lane joins the
    // baggage OpenTelemetry extracted.
    let server = serve(
        Router::new()
            .route("/", get(otel_view))
            .layer(AttachLaneLayer::new().with_carriers(carriers.clone()))
            .layer(ExtractStainLayer::new().with_carriers(carriers))
            .layer(axum::middleware::from_fn(otel_extract)),
    )
    .await;
    let client = driver();
    let view = |req: reqwest::RequestBuilder| async move {
        let res = req.send().await.expect("a response");
        Lines::parse(&res.text().await.expect("a body"))
    };

    // (what the client sends, the lane OpenTelemetry sees, what its propagator injects)
    let cases: [(Headers<'_>, &str, &str); 3] = [
        // Stained by `x-gray-lane` only: the lane joins the inbound members.
        (
            &[("x-gray-lane", "Gray"), ("baggage", "userId=42")],
            "gray",
            "gray.lane=gray,userId=42",
        ),
        // A conflicting member: gray's decision (x-gray-lane first) is what it sees.
        (
            &[
                ("x-gray-lane", "gray"),
                ("baggage", "userId=42,gray.lane=blue"),
            ],
            "gray",
            "gray.lane=gray,userId=42",
        ),
        // A duplicated member is read as its first one, as a duplicated header is: gray's
        // reading is what OpenTelemetry sees, whichever copy its own propagator kept.
        (
            &[("baggage", "userId=42,gray.lane=gray,gray.lane=blue")],
            "gray",
            "gray.lane=gray,userId=42",
        ),
    ];
    for (headers, lane, injected) in cases {
        let mut req = client.get(server.url("/"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let seen = view(req).await;
        assert_eq!(seen.get("otel_lane"), lane, "{headers:?}");
        assert_eq!(seen.get("injected"), injected, "{headers:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_set_in_otel_baggage_by_the_app_routes_the_outbound_call() {
    let carriers = Carriers::default().with_baggage();
    let d = instances(&carriers).await;
    // A job outside any server: its only stain is the OpenTelemetry baggage it sets.
    for capture in [false, true] {
        let client = routed_client(&d, &carriers, capture);
        let in_gray = Context::current_with_baggage([
            KeyValue::new("gray.lane", "gray"),
            KeyValue::new("userId", "42"),
        ]);
        let seen = client
            .clone()
            .oneshot(get_root())
            .with_context(in_gray)
            .await
            .expect("a response");
        assert_eq!(seen.get("id"), "d-gray", "capture {capture}");
        assert_eq!(seen.get("lane"), "gray");
        let seen = client.oneshot(get_root()).await.expect("a response");
        assert_eq!(seen.get("id"), "d-base", "capture {capture}");
    }

    // An invalid lane in the baggage is no stain.
    let client = routed_client(&d, &carriers, false);
    let bad = Context::current_with_baggage([KeyValue::new("gray.lane", "not a lane")]);
    let seen = client
        .oneshot(get_root())
        .with_context(bad)
        .await
        .expect("a response");
    assert_eq!(seen.get("id"), "d-base");
}

/// A handler with no gray code: calls `http://d/` through its reqwest client, reports what
/// the instance picked saw.
async fn call_d(
    State(client): State<reqwest_middleware::ClientWithMiddleware>,
) -> Result<String, String> {
    let res = client
        .get("http://d/")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    res.text().await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_and_propagation_agree_in_either_order_with_otel_only() {
    // `d`'s instances read the default carriers: `x-gray-lane` says what they were sent.
    let d = instances(&Carriers::default()).await;
    let instance = |id: &str, server: &Server, labels: Labels| {
        Instance::new(
            id.parse().expect("instance id"),
            server.addr().to_string().parse().expect("instance address"),
            labels,
        )
    };
    let discover = StaticDiscover::new([
        instance("d-base", &d.base, Labels::new()),
        instance("d-gray", &d.gray, Labels::from_iter([("lane", "gray")])),
    ]);
    let balance =
        BalanceLayer::new("d", Policy::new().with_fallback(Fallback::Baseline)).build(discover);
    gray_tests::until(
        gray_test_support::WAIT,
        "the balancer sees both instances",
        || balance.len() == 2,
    )
    .await;

    for route_first in [true, false] {
        // The OpenTelemetry-only configuration: the app extracts with OpenTelemetry's
        // propagator, has no gray server layer, and its client the default carriers.
        let route = RouteMiddleware::new().route("d", balance.clone());
        let builder = ClientBuilder::new(gray_tests::reqwest_client());
        let client = if route_first {
            builder.with(route).with(PropagateMiddleware::new())
        } else {
            builder.with(PropagateMiddleware::new()).with(route)
        }
        .build();
        let app = serve(
            Router::new()
                .route("/", get(call_d))
                .with_state(client)
                .layer(axum::middleware::from_fn(otel_extract)),
        )
        .await;
        let order = if route_first {
            "RouteMiddleware first"
        } else {
            "PropagateMiddleware first"
        };
        for _ in 0..10 {
            let seen = send(&app, Some("userId=42,gray.lane=gray")).await;
            assert_eq!(seen.get("id"), "d-gray", "{order}: {seen:?}");
            assert_eq!(seen.get("lane"), "gray", "{order}: the header was written");
            let seen = send(&app, Some("userId=42")).await;
            assert_eq!(seen.get("id"), "d-base", "{order}");
            assert_eq!(seen.get("lane"), "", "{order}");
            let seen = send(&app, None).await;
            assert_eq!(seen.get("id"), "d-base", "{order}");
        }
    }
}
