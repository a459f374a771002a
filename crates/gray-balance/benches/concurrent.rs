//! Shared-balancer throughput: 1, 8 and 64 concurrent callers (tasks on a two-worker
//! runtime) sending through one balancer over 100 endpoints that answer at once, half of
//! them gray, half of the requests in the gray lane.
//!
//! The figure is wall time per request (total time / requests): the lower, the higher the
//! throughput. Each caller holds a clone of one `Balance` handle (no mutex, no `Buffer`).
//! The figures of the balancer before the shared rewrite, behind a mutex as the gateway
//! shared it (`Arc<Mutex<Balance>>`: lock, `poll_ready`, `call`, unlock, await), were
//! recorded with this bench on that code; they are quoted in `docs/performance.md`.
//!
//! Run with: `cargo bench -p gray-balance --bench concurrent`

mod common;

use std::time::{Duration, Instant};

use common::{Req, endpoints};
use criterion::{Criterion, criterion_group, criterion_main};
use gray_balance::BalanceLayer;
use gray_core::{Lane, Stain};
use gray_policy::Policy;
use tower::{Service, ServiceExt};

const ENDPOINTS: usize = 100;
const CALLERS: [usize; 3] = [1, 8, 64];

fn request(i: u64, gray: &Stain) -> Req {
    let mut req = http::Request::new(());
    if i.is_multiple_of(2) {
        req.extensions_mut().insert(gray.clone());
    }
    req
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let gray = Stain::in_lane(Lane::new("gray").expect("lane"));
    let balance = {
        let _guard = rt.enter();
        BalanceLayer::new("svc-b", Policy::seed_000()).build(endpoints(ENDPOINTS, 2))
    };

    for callers in CALLERS {
        let mut group = c.benchmark_group(format!("concurrent/{callers}"));
        group.bench_function("shared_balance", |b| {
            b.iter_custom(|iters| {
                let per_task = iters.div_ceil(callers as u64);
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..callers)
                        .map(|_| {
                            let mut balance = balance.clone();
                            let gray = gray.clone();
                            tokio::spawn(async move {
                                for i in 0..per_task {
                                    let req = request(i, &gray);
                                    balance.ready().await.expect("always ready");
                                    balance.call(req).await.expect("answered");
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.expect("task");
                    }
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_task * callers as u64) as f64)
                })
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
