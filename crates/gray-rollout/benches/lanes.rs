//! The cost the gateway adds to each request for its per-lane evidence: finding the lane's
//! series ([`LaneStats::slot`], with `baseline` and 3 lanes known), two clock reads, and
//! the record (requests, bad outcomes, the latency histogram); and the same through
//! [`RecordLanesLayer`] around a service that answers at once (unstained requests: the
//! baseline series; the figure includes a current-thread runtime's `block_on`).
//!
//! Run with: `cargo bench -p gray-rollout --features tower --bench lanes`

#![allow(clippy::disallowed_methods, reason = "a benchmark times itself")]

use std::{convert::Infallible, hint::black_box, sync::Arc, time::Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gray_core::Lane;
use gray_rollout::{
    Outcome,
    lanes::{LaneStats, RecordLanesLayer},
};
use tower::{Layer, Service, ServiceExt, service_fn};

fn bench(c: &mut Criterion) {
    let lanes: Vec<Lane> = ["blue", "green", "gray"]
        .iter()
        .map(|l| Lane::new(l).unwrap())
        .collect();
    let stats = Arc::new(LaneStats::new(32));
    for lane in &lanes {
        stats.slot(Some(lane));
    }
    let mut group = c.benchmark_group("lanes");
    group.bench_function("slot_clock_record", |b| {
        let mut i = 0usize;
        b.iter(|| {
            let lane = i.is_multiple_of(2).then(|| &lanes[2]);
            let slot = stats.slot(black_box(lane));
            let start = Instant::now();
            stats
                .at(slot)
                .record(Outcome::of_status(black_box(200)), start.elapsed());
            i += 1;
        })
    });
    group.bench_function("layer", |b| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut svc =
            RecordLanesLayer::new(stats.clone()).layer(service_fn(|_: http::Request<()>| async {
                Ok::<_, Infallible>(http::Response::new(()))
            }));
        b.iter(|| {
            rt.block_on(async {
                let svc = svc.ready().await.unwrap();
                let _ = svc.call(http::Request::new(())).await;
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
