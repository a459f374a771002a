//! What the gray layers cost on an in-process axum stack.
//!
//! One axum `Router` whose handler calls an outbound client (a `tower::Service` stand-in
//! for hyper-util's `Client`), driven with `oneshot`, no sockets: the figures are the
//! layers' own overhead. Each stack is measured with an unstained request and with one
//! stained `x-gray-lane: gray`; the request is built outside the timed part.
//!
//! - `bare`: no gray layer.
//! - `layers`: `ExtractStainLayer` around the router (`Layer::layer(router)`, as tower
//!   wraps any service) and `PropagateStainLayer` on the client, both with the lane
//!   interned (`Carriers::with_names`), as a deployment configures them.
//! - `router_layer`: the same, with `Router::layer(ExtractStainLayer)` instead; axum
//!   then boxes the layered route once more per request, which is axum's cost for any
//!   layer added that way, not the gray layers'.
//!
//! Run with `cargo bench -p gray-tower --bench layers`.

use std::{convert::Infallible, future::ready, hint::black_box};

use axum::{
    Router,
    body::Body,
    http::{StatusCode, header::CONTENT_TYPE},
    routing::get,
};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use gray_core::{Carriers, Lane, Names};
use gray_tower::{ExtractStainLayer, PropagateStainLayer};
use http::{HeaderValue, Request, Response};
use tower::{Layer, Service, ServiceExt, service_fn};

/// The outbound client stand-in: answers 200, or 202 when the request carries a lane.
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

fn request(stained: bool) -> Request<Body> {
    let mut req = Request::new(Body::empty());
    if stained {
        req.headers_mut()
            .insert("x-gray-lane", HeaderValue::from_static("gray"));
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
        .with_carriers(carriers)
        .layer(upstream());

    let bare = app(upstream());
    let layered = extract.layer(app(client.clone()));
    let router_layer = app(client).layer(extract);

    // The layers change what the upstream sees, never what the bare stack does.
    for stained in [false, true] {
        let with_lane = if stained {
            StatusCode::ACCEPTED
        } else {
            StatusCode::OK
        };
        let status = |res: Result<Response<Body>, Infallible>| res.map(|r| r.status());
        let run = |req| rt.block_on(bare.clone().oneshot(req));
        assert_eq!(status(run(request(stained))), Ok(StatusCode::OK));
        let run = |req| rt.block_on(layered.clone().oneshot(req));
        assert_eq!(status(run(request(stained))), Ok(with_lane));
        let run = |req| rt.block_on(router_layer.clone().oneshot(req));
        assert_eq!(status(run(request(stained))), Ok(with_lane));
    }

    let mut group = c.benchmark_group("layers");
    for (stained, suffix) in [(false, "unstained"), (true, "stained")] {
        group.bench_function(format!("bare/{suffix}"), |b| {
            b.to_async(&rt).iter_batched(
                || request(stained),
                |req| async { black_box(bare.clone().oneshot(req).await) },
                BatchSize::SmallInput,
            );
        });
        group.bench_function(format!("layers/{suffix}"), |b| {
            b.to_async(&rt).iter_batched(
                || request(stained),
                |req| async { black_box(layered.clone().oneshot(req).await) },
                BatchSize::SmallInput,
            );
        });
        group.bench_function(format!("router_layer/{suffix}"), |b| {
            b.to_async(&rt).iter_batched(
                || request(stained),
                |req| async { black_box(router_layer.clone().oneshot(req).await) },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, layers);
criterion_main!(benches);
