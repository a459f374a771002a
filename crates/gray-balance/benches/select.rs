//! Selection cost per request: `poll_ready` + `call` + completing the response, over
//! always-ready endpoints.
//!
//! One group per size `select/{10,100,1000,10000}`, each with:
//! - `gray_balance`: unlabelled endpoints, unstained requests (target: the 10,000 case
//!   costs at most 1.5× the 10 case);
//! - `tower_p2c`: `tower::balance::p2c::Balance` over the same unlabelled endpoints, both
//!   with Peak-EWMA (target: `gray_balance` at most 1.2× `tower_p2c`);
//! - `gray_balance_lane`: half the endpoints gray, requests in the gray lane (the context
//!   is read from the extensions, the lane looked up; building the request, whose
//!   extensions allocate, is part of this case).
//!
//! Run with: `cargo bench -p gray-balance --bench select`

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    hint::black_box,
    pin::pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use criterion::{Criterion, criterion_group, criterion_main};
use gray_balance::{Balance, BalanceLayer};
use gray_core::{Labelled, Labels, Lane, Policy, Stain};
use tower::{
    Service,
    discover::Change,
    load::{CompleteOnResponse, PeakEwmaDiscover},
};

type Req = http::Request<()>;

struct Endpoint(Labels);

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.0
    }
}

impl Service<Req> for Endpoint {
    type Response = ();
    type Error = Infallible;
    type Future = Ready<Result<(), Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(Ok(()))
    }
}

fn endpoints(
    n: usize,
    gray_every: usize,
) -> impl futures_util::Stream<Item = Result<Change<usize, Endpoint>, Infallible>> + Unpin {
    futures_util::stream::iter((0..n).map(move |i| {
        let labels = if gray_every > 0 && i % gray_every == 0 {
            Labels::from_iter([("gray", "true")])
        } else {
            Labels::new()
        };
        Ok(Change::Insert(i, Endpoint(labels)))
    }))
}

/// One request through `svc`: poll_ready, call, complete.
fn one<S>(svc: &mut S, cx: &mut Context<'_>, req: Req)
where
    S: Service<Req>,
    S::Error: std::fmt::Debug,
{
    match svc.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("balancer not ready: {:?}", other.map(|r| r.err())),
    }
    let fut = pin!(svc.call(req));
    match fut.poll(cx) {
        Poll::Ready(r) => {
            black_box(r.ok());
        }
        Poll::Pending => panic!("always-ready endpoint pending"),
    }
}

const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let waker = Waker::noop();
    let mut cx = Context::from_waker(waker);

    // One group per size, so that the three contenders run close together in time
    // (this machine is shared: interleaving keeps the ratios honest).
    let gray = Stain::in_lane(Lane::new("gray").expect("lane"));
    for n in SIZES {
        let mut group = c.benchmark_group(format!("select/{n}"));
        let mut plain: Balance<_, Req> = Balance::new(endpoints(n, 0), "svc-b", Policy::new());
        group.bench_function("gray_balance", |b| {
            b.iter(|| one(&mut plain, &mut cx, http::Request::new(())))
        });
        let discover = PeakEwmaDiscover::new(
            endpoints(n, 0),
            Duration::from_millis(30),
            Duration::from_secs(10),
            CompleteOnResponse::default(),
        );
        let mut p2c = tower::balance::p2c::Balance::new(discover);
        group.bench_function("tower_p2c", |b| {
            b.iter(|| one(&mut p2c, &mut cx, http::Request::new(())))
        });
        let mut laned = BalanceLayer::new("svc-b", Policy::seed_000()).build(endpoints(n, 2));
        group.bench_function("gray_balance_lane", |b| {
            b.iter(|| {
                let mut req = http::Request::new(());
                req.extensions_mut().insert(gray.clone());
                one(&mut laned, &mut cx, req)
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
