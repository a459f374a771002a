//! What the gray layers cost on an in-process axum stack.
//!
//! One axum `Router` whose handler calls an outbound client (a `tower::Service` stand-in
//! for hyper-util's `Client`), driven with `oneshot`, no sockets: the figures are the
//! layers' own overhead. Each stack is measured with an unstained request, with one
//! stained `x-gray-lane: gray`, and with one stained so that also carries a `baggage`
//! header of 10 other members (`baggage10`); the request is built outside the timed part.
//!
//! - `bare`: no gray layer.
//! - `layers`: `ExtractStainLayer` around the router (`Layer::layer(router)`, as tower
//!   wraps any service) and `PropagateStainLayer` on the client, both with the lane
//!   interned (`Carriers::with_names`), as a deployment configures them.
//! - `router_layer`: the same, with `Router::layer(ExtractStainLayer)` instead; axum
//!   then boxes the layered route once more per request, which is axum's cost for any
//!   layer added that way, not the gray layers'.
//! - `baggage`: as `layers`, with the `baggage` carrier on both layers
//!   (`Carriers::default().with_baggage()`): the 10 members are kept with the stain and
//!   written onto the outbound request, with `gray.lane=gray` after them.
//!
//! The `edge` group measures `EdgeLayer` alone, around the same upstream stand-in, with a
//! browser-like request (eight headers) and an IP-whitelist rule: `2-carriers` is the
//! default (`x-gray-lane` + `x-gray-info`), `5-carriers` adds seed 000's `gray`, seed 001's
//! `version` and the `baggage` member. `baseline` is a client no rule picks, `gray` the
//! whitelisted one, `forged` an untrusted client sending `gray`, `x-gray-lane` and a
//! `baggage` with the stain's member (stripped), and `dirty-path` a whitelisted client
//! whose path needs normalising (`/svc//a/./b/%69`).
//!
//! Run with `cargo bench -p gray-tower --bench layers`.

use std::{convert::Infallible, future::ready, hint::black_box};

use axum::{
    Router,
    body::Body,
    http::{StatusCode, header::CONTENT_TYPE},
    routing::get,
};
use criterion::{
    BatchSize, BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use gray_core::{
    Carriers, Lane, Names,
    codec::{BaggageMember, PlainHeader},
};
use gray_rules::{Format, RuleSet};
use gray_tower::{
    ExtractStainLayer, PropagateStainLayer,
    edge::{EdgeLayer, PeerAddr},
};
use http::{HeaderName, HeaderValue, Request, Response};
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt, service_fn};

/// The outbound client stand-in: answers 200, 202 when the request carries a lane, 203
/// when it also carries the inherited `baggage` members.
fn upstream() -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone
+ Send
+ Sync
+ 'static {
    service_fn(|req: Request<Body>| {
        let mut res = Response::new(Body::empty());
        if req.headers().contains_key("x-gray-lane") {
            *res.status_mut() = StatusCode::ACCEPTED;
        }
        let inherited = req
            .headers()
            .get("baggage")
            .is_some_and(|b| b.as_bytes().starts_with(b"userId=42;ttl=5,"));
        if inherited {
            *res.status_mut() = StatusCode::NON_AUTHORITATIVE_INFORMATION;
        }
        ready(Ok(res))
    })
}

/// The application: one route whose handler makes one outbound call through `client`.
fn app<C>(client: C) -> Router
where
    C: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    C::Future: Send,
{
    Router::new().route(
        "/",
        get(move || {
            let client = client.clone();
            async move {
                // Real outbound requests carry headers of their own; with one there, the
                // map is allocated in both stacks and the lane header only fills it.
                let mut req = Request::new(Body::empty());
                req.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                match client.oneshot(req).await {
                    Ok(res) => res.status(),
                    Err(never) => match never {},
                }
            }
        }),
    )
}

/// The inbound requests measured.
#[derive(Clone, Copy, PartialEq)]
enum Inbound {
    Unstained,
    Stained,
    /// Stained, with a `baggage` header of 10 other members.
    Baggage10,
}

/// Ten members as an OpenTelemetry-instrumented client sends them.
const TEN_MEMBERS: &str = "userId=42;ttl=5,tenant=acme,session=9f8e7d6c5b4a,region=eu-west-1,\
    plan=premium,locale=de-DE,name=J%C3%BCrgen,ab=variant-b,device=ios,app=7.3.1";

fn request(inbound: Inbound) -> Request<Body> {
    let mut req = Request::new(Body::empty());
    if inbound != Inbound::Unstained {
        req.headers_mut()
            .insert("x-gray-lane", HeaderValue::from_static("gray"));
    }
    if inbound == Inbound::Baggage10 {
        req.headers_mut()
            .insert("baggage", HeaderValue::from_static(TEN_MEMBERS));
    }
    req
}

fn layers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let carriers = Carriers::default()
        .with_names(Names::new().with_lanes([Lane::new("gray").expect("valid lane")]));

    let extract = ExtractStainLayer::new().with_carriers(carriers.clone());
    let client = PropagateStainLayer::new()
        .with_carriers(carriers.clone())
        .layer(upstream());
    let baggage_carriers = carriers.with_baggage();
    let baggage_client = PropagateStainLayer::new()
        .with_carriers(baggage_carriers.clone())
        .layer(upstream());

    let bare = app(upstream());
    let layered = extract.layer(app(client.clone()));
    let router_layer = app(client).layer(extract);
    let baggage = ExtractStainLayer::new()
        .with_carriers(baggage_carriers)
        .layer(app(baggage_client));

    // The layers change what the upstream sees, never what the bare stack does.
    for inbound in [Inbound::Unstained, Inbound::Stained, Inbound::Baggage10] {
        let with_lane = match inbound {
            Inbound::Unstained => StatusCode::OK,
            Inbound::Stained | Inbound::Baggage10 => StatusCode::ACCEPTED,
        };
        let with_members = match inbound {
            Inbound::Baggage10 => StatusCode::NON_AUTHORITATIVE_INFORMATION,
            Inbound::Unstained | Inbound::Stained => with_lane,
        };
        assert_eq!(status(&rt, &bare, inbound), StatusCode::OK);
        assert_eq!(status(&rt, &layered, inbound), with_lane);
        assert_eq!(status(&rt, &router_layer, inbound), with_lane);
        assert_eq!(status(&rt, &baggage, inbound), with_members);
    }

    let mut group = c.benchmark_group("layers");
    let inputs = [
        (Inbound::Unstained, "unstained"),
        (Inbound::Stained, "stained"),
        (Inbound::Baggage10, "baggage10"),
    ];
    for (inbound, suffix) in inputs {
        measure(&mut group, &rt, &format!("bare/{suffix}"), &bare, inbound);
        measure(
            &mut group,
            &rt,
            &format!("layers/{suffix}"),
            &layered,
            inbound,
        );
        measure(
            &mut group,
            &rt,
            &format!("router_layer/{suffix}"),
            &router_layer,
            inbound,
        );
        measure(
            &mut group,
            &rt,
            &format!("baggage/{suffix}"),
            &baggage,
            inbound,
        );
    }
    group.finish();
}

/// The status `stack` answers `inbound` with.
fn status<S>(rt: &Runtime, stack: &S, inbound: Inbound) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    match rt.block_on(stack.clone().oneshot(request(inbound))) {
        Ok(res) => res.status(),
        Err(never) => match never {},
    }
}

fn measure<S>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    name: &str,
    stack: &S,
    inbound: Inbound,
) where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    group.bench_function(name, |b| {
        b.to_async(rt).iter_batched(
            || request(inbound),
            |req| async { black_box(stack.clone().oneshot(req).await) },
            BatchSize::SmallInput,
        );
    });
}

/// A browser-like request to the edge from `peer`.
fn edge_request(
    peer: &str,
    path: &'static str,
    extra: &[(&'static str, &'static str)],
) -> Request<Body> {
    let mut req = Request::builder().uri(path);
    for (name, value) in [
        ("host", "gw.example"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        ),
        ("accept", "application/json"),
        ("accept-language", "en-GB,en;q=0.5"),
        ("accept-encoding", "gzip, deflate, br"),
        ("cookie", "session=8f2c1e; theme=dark"),
        ("x-request-id", "0b5c6f0e-2f4c-4b8a-9c1d-6a7e3f2d1c0b"),
        ("content-type", "application/json"),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    {
        req = req.header(name, value);
    }
    req.extension(PeerAddr(peer.parse().expect("peer")))
        .body(Body::empty())
        .expect("request")
}

fn edge(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let rules = RuleSet::parse(
        r#"{"rules":[{"name":"testers","when":{"ip":["192.0.2.10"]},"lane":"gray"}]}"#,
        Format::Json,
        "bench",
    )
    .expect("rules");
    let gray = Lane::new("gray").expect("valid lane");
    let names = Names::new().with_lanes([gray.clone()]);
    let two = Carriers::default().with_names(names.clone());
    let five = Carriers::default()
        .with(PlainHeader::flag(HeaderName::from_static("gray"), gray))
        .with(PlainHeader::version(HeaderName::from_static("version")))
        .with(BaggageMember::new("gray.lane").expect("key"))
        .with_names(names);
    let layer = |carriers: Carriers| {
        EdgeLayer::new(rules.clone())
            .with_carriers(carriers)
            .with_decision_extension(false)
            .layer(upstream())
    };
    let stacks = [("2-carriers", layer(two)), ("5-carriers", layer(five))];
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static [(&'static str, &'static str)],
        StatusCode,
    );
    let cases: [Case; 4] = [
        (
            "baseline",
            "203.0.113.9:4000",
            "/svc/a/b?x=1",
            &[],
            StatusCode::OK,
        ),
        (
            "gray",
            "192.0.2.10:4000",
            "/svc/a/b?x=1",
            &[],
            StatusCode::ACCEPTED,
        ),
        (
            "forged",
            "203.0.113.9:4000",
            "/svc/a/b?x=1",
            &[
                ("gray", "true"),
                ("x-gray-lane", "gray"),
                ("baggage", "userId=42,gray.lane=gray"),
            ],
            StatusCode::OK,
        ),
        (
            "dirty-path",
            "192.0.2.10:4000",
            "/svc//a/./b/%69?x=1",
            &[],
            StatusCode::ACCEPTED,
        ),
    ];
    for (_, stack) in &stacks {
        for (_, peer, path, extra, status) in &cases {
            let res = rt.block_on(stack.clone().oneshot(edge_request(peer, path, extra)));
            assert_eq!(res.map(|r| r.status()), Ok(*status), "{path} from {peer}");
        }
    }

    let mut group = c.benchmark_group("edge");
    for (name, stack) in &stacks {
        for (case, peer, path, extra, _) in &cases {
            group.bench_function(format!("{name}/{case}"), |b| {
                b.to_async(&rt).iter_batched(
                    || edge_request(peer, path, extra),
                    |req| async { black_box(stack.clone().oneshot(req).await) },
                    BatchSize::SmallInput,
                );
            });
        }
    }
    group.finish();
}

criterion_group!(benches, layers, edge);
criterion_main!(benches);
