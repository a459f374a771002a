//! A strategy written outside the crate costs a virtual call per pick and no allocation:
//! routing through one, counted by a global allocator (per thread; the requests are
//! polled by hand on the test's thread, the driver runs on a runtime worker).

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use gray_balance::{
    BalanceLayer,
    strategy::{Candidates, Strategy},
};
use gray_core::{Labelled, Labels, Lane, Stain, rand::Rng};
use gray_policy::Policy;
use gray_test_support::alloc::{Counting, allocations_in};
use tower::{Service, discover::Change};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// An endpoint whose clone is a reference count increment.
#[derive(Clone)]
struct Endpoint(usize, Arc<Labels>);

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.1
    }
}

impl Service<http::Request<()>> for Endpoint {
    type Response = usize;
    type Error = Infallible;
    type Future = Ready<Result<usize, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        ready(Ok(self.0))
    }
}

/// The candidate with the highest `weight` label, scanning them all (ties: the first).
/// No probes, so that every pick below is the strategy's.
#[derive(Debug)]
struct Heaviest;

impl Strategy for Heaviest {
    fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
        let weight = |i: usize| {
            let load = candidates.get(i)?;
            load.labels().get("weight")?.parse::<u32>().ok()
        };
        (0..candidates.len())
            .max_by_key(|&i| (weight(i), std::cmp::Reverse(i)))
            .unwrap_or(0)
    }

    fn probes(&self) -> bool {
        false
    }
}

#[test]
fn routing_through_a_custom_strategy_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    // 64 endpoints, every 4th gray; the heaviest gray one is 60, the heaviest baseline 63.
    let endpoints = futures_util::stream::iter((0..64).map(|i| {
        let mut labels = Labels::from_iter([("weight", i.to_string())]);
        if i % 4 == 0 {
            labels.insert("gray", "true");
        }
        Ok::<_, Infallible>(Change::Insert(i, Endpoint(i, Arc::new(labels))))
    }));
    let mut balance = BalanceLayer::new("svc-b", Policy::seed_000())
        .with_strategy(Heaviest)
        .build(endpoints);
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let requests: Vec<http::Request<()>> = (0..2_000)
        .map(|i| {
            let mut req = http::Request::new(());
            if i % 2 == 0 {
                req.extensions_mut().insert(gray.clone());
            }
            req
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    let mut route = |req| {
        assert!(balance.poll_ready(&mut cx).is_ready());
        let fut = pin!(balance.call(req));
        match fut.poll(&mut cx) {
            Poll::Ready(Ok(id)) => id,
            other => panic!("{:?}", other.map(|r| r.is_ok())),
        }
    };
    let mut requests = requests.into_iter().enumerate();
    // Warm up: thread-locals are set up.
    for (_, req) in requests.by_ref().take(500) {
        route(req);
    }
    let mut served = Vec::with_capacity(1_500);
    let (_, n) = allocations_in(|| {
        for (i, req) in requests.by_ref() {
            served.push((i, route(req)));
        }
    });
    assert_eq!(n, 0, "{n} allocations for 1,500 requests");
    for (i, id) in served {
        let expected = if i % 2 == 0 { 60 } else { 63 };
        assert_eq!(id, expected, "request {i}");
    }
}
