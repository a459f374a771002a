//! Selection cost per request: `poll_ready` + `call` + completing the response, over
//! always-ready endpoints; and the cost of a discovery change.
//!
//! One group per size `select/{10,100,1000,10000}`, each with:
//! - `gray_balance`: unlabelled endpoints, unstained requests (target: the 10,000 case
//!   costs at most 1.5× the 10 case);
//! - `tower_p2c`: `tower::balance::p2c::Balance` over the same unlabelled endpoints, both
//!   with Peak-EWMA (target: `gray_balance` at most 1.2× `tower_p2c`);
//! - `gray_balance_lane`: half the endpoints gray, requests in the gray lane (the stain
//!   is read from the extensions, the lane looked up; building the request, whose
//!   extensions allocate, is part of this case).
//!
//! The balancer's driver runs on a runtime worker; requests are polled on the bench's
//! thread. Then `change/{100,10000}`:
//! - `insert_remove`: one `Insert` and one `Remove` among that many endpoints, each
//!   applied by the driver and published (target: far below a rebuild);
//! - `rebuild`: a new balancer over that many endpoints, what a change would cost without
//!   the incremental index.
//!
//! Run with: `cargo bench -p gray-balance --bench select`

mod common;

use std::{
    convert::Infallible,
    future::Future,
    hint::black_box,
    pin::{Pin, pin},
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use common::{Endpoint, Req, endpoint, endpoints};
use criterion::{Criterion, criterion_group, criterion_main};
use gray_balance::{Balance, BalanceLayer};
use gray_core::{Labels, Lane, Stain};
use gray_policy::Policy;
use tower::{
    Service,
    discover::Change,
    load::{CompleteOnResponse, PeakEwmaDiscover},
};

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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
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
        let mut plain = Balance::new(endpoints(n, 0), "svc-b", Policy::new());
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
    changes(c);
}

/// A discover stream fed by a channel.
struct Changes(tokio::sync::mpsc::UnboundedReceiver<Change<usize, Endpoint>>);

impl futures_util::Stream for Changes {
    type Item = Result<Change<usize, Endpoint>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|c| c.map(Ok))
    }
}

fn changes(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let mut cx = Context::from_waker(Waker::noop());
    for n in [100, 10_000] {
        let mut group = c.benchmark_group(format!("change/{n}"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..n {
            tx.send(Change::Insert(i, endpoint(i, 2))).expect("open");
        }
        let (balance, mut driver) =
            BalanceLayer::new("svc-b", Policy::seed_000()).pair(Changes(rx));
        assert_eq!(balance.len(), n);
        let gray = Arc::new(Labels::from_iter([("gray", "true")]));
        group.bench_function("insert_remove", |b| {
            b.iter(|| {
                tx.send(Change::Insert(n, Endpoint(gray.clone())))
                    .expect("open");
                assert!(Pin::new(&mut driver).poll(&mut cx).is_pending());
                tx.send(Change::Remove(n)).expect("open");
                assert!(Pin::new(&mut driver).poll(&mut cx).is_pending());
            })
        });
        assert_eq!(balance.len(), n);
        group.bench_function("rebuild", |b| {
            b.iter(|| {
                let (balance, driver) =
                    BalanceLayer::new("svc-b", Policy::seed_000()).pair(endpoints(n, 2));
                black_box(balance.len());
                drop(black_box(driver));
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
