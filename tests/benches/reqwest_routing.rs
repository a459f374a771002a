//! What routing costs a reqwest client, over one real loopback hop.
//!
//! Two axum servers on loopback ports (`stock-base` and `stock-gray`, no gray layer of
//! their own: the server side is the same for every client) answer `GET /items` with a
//! short body. One request at a time, each in the gray lane (the task-local stain, as in a
//! handler behind `ExtractStainLayer`), body read to its end:
//!
//! - `plain`: `reqwest::Client` to `http://127.0.0.1:<port>/items`;
//! - `middleware`: the same through `reqwest_middleware::ClientWithMiddleware` with no
//!   middleware (what the middleware chain itself costs);
//! - `propagate`: `PropagateMiddleware` only, which writes `x-gray-lane: gray`;
//! - `routed`: `PropagateMiddleware` + `RouteMiddleware`, to `http://stock/items`: the
//!   balancer picks `stock-gray` by the stain and the URL is rewritten to it.
//!
//! The difference between `routed` and `plain` is what routing with reqwest costs per
//! request. Client and servers share one current-thread runtime, so every instruction of
//! a request (client, servers, kernel) runs on the bench's thread: group `cpu` reports
//! that thread's CPU time per request (`CLOCK_THREAD_CPUTIME_ID`, which time spent
//! waiting for a CPU taken by another process does not inflate, unlike wall time on a busy
//! machine), group `wall` the wall time.
//!
//! Run with: `cargo bench -p gray-tests --bench reqwest_routing`

use std::{net::SocketAddr, time::Duration};

use axum::{Router, routing::get};
use criterion::{Criterion, criterion_group, criterion_main};
use gray_balance::{BalanceLayer, reqwest::RouteMiddleware};
use gray_core::{Labels, Lane, Stain};
use gray_discovery::{Instance, Registry};
use gray_policy::Policy;
use gray_tower::reqwest::{ClientBuilder, ClientWithMiddleware, PropagateMiddleware};
use tokio::{net::TcpListener, runtime::Runtime};

async fn server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = Router::new().route("/items", get(|| async { "a short list of items" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn instance(id: &str, addr: SocketAddr, labels: Labels) -> Instance {
    Instance::new(
        id.parse().expect("id"),
        addr.to_string().parse().expect("address"),
        labels,
    )
}

/// Clients and URLs, built on `rt`.
struct Setup {
    plain: (reqwest::Client, String),
    middleware: (ClientWithMiddleware, String),
    propagate: (ClientWithMiddleware, String),
    routed: (ClientWithMiddleware, String),
}

fn setup(rt: &Runtime) -> Setup {
    rt.block_on(async {
        let (base, gray) = (server().await, server().await);
        let registry = Registry::from_static([(
            "stock",
            [
                instance("stock-base", base, Labels::new()),
                instance("stock-gray", gray, Labels::from_iter([("gray", "true")])),
            ],
        )])
        .expect("a registry");
        let stock = registry.service("stock").expect("a name").discover();
        let balance = BalanceLayer::new("stock", Policy::new()).build(stock);
        let direct = format!("http://{gray}/items");
        let with = |client: ClientBuilder| client.build();
        // Loopback: no proxy from the environment.
        let http = || {
            reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("a client")
        };
        Setup {
            plain: (http(), direct.clone()),
            middleware: (with(ClientBuilder::new(http())), direct.clone()),
            propagate: (
                with(ClientBuilder::new(http()).with(PropagateMiddleware::new())),
                direct,
            ),
            routed: (
                with(
                    ClientBuilder::new(http())
                        .with(PropagateMiddleware::new())
                        .with(RouteMiddleware::new().route("stock", balance)),
                ),
                "http://stock/items".to_owned(),
            ),
        }
    })
}

/// The CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.unsigned_abs(), t.tv_nsec.unsigned_abs() as u32)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let setup = setup(&rt);
    let gray = Stain::in_lane(Lane::new("gray").expect("a lane"));

    macro_rules! bench_clients {
        ($($name:literal: $client:expr),*) => {
            let mut wall = c.benchmark_group("wall");
            $({
                let (client, url) = &$client;
                wall.bench_function($name, |b| {
                    b.to_async(&rt).iter(|| {
                        gray_core::task::scope(gray.clone(), async {
                            let res = client.get(url).send().await.expect("an answer");
                            assert!(res.status().is_success());
                            res.bytes().await.expect("a body")
                        })
                    })
                });
            })*
            wall.finish();
            let mut cpu = c.benchmark_group("cpu");
            $({
                let (client, url) = &$client;
                cpu.bench_function($name, |b| {
                    b.iter_custom(|iters| {
                        let start = thread_cpu();
                        rt.block_on(gray_core::task::scope(gray.clone(), async {
                            for _ in 0..iters {
                                let res = client.get(url).send().await.expect("an answer");
                                assert!(res.status().is_success());
                                res.bytes().await.expect("a body");
                            }
                        }));
                        thread_cpu() - start
                    })
                });
            })*
            cpu.finish();
        };
    }
    bench_clients!(
        "plain": setup.plain,
        "middleware": setup.middleware,
        "propagate": setup.propagate,
        "routed": setup.routed
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
