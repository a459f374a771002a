//! Heap allocations on the balancer's request path, counted by a global allocator.
//!
//! Once warm, routing a request stained with a lane (read from the extensions, looked up
//! in the subset index, picked by p2c over Peak-EWMA, called, completed) allocates
//! nothing; neither does an unstained request. Requests are built before counting
//! (`http::Extensions` boxes its map), and everything runs on the test's own thread
//! (the allocator counts per thread), polled by hand with a no-op waker.

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    pin::pin,
    task::{Context, Poll, Waker},
};

use gray_balance::{BalanceLayer, Pick};
use gray_core::{Labelled, Labels, Lane, Policy, Stain};
use gray_test_support::alloc::Counting;
use tower::{Service, discover::Change};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    gray_test_support::alloc::allocations_in(f).1
}

struct Endpoint(usize, Labels);

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

#[test]
fn routing_a_lane_stain_allocates_nothing() {
    for pick in [Pick::default(), Pick::PendingRequests, Pick::RoundRobin] {
        let endpoints = futures_util::stream::iter((0..64).map(|i| {
            let labels = if i % 4 == 0 {
                Labels::from_iter([("gray", "true")])
            } else {
                Labels::new()
            };
            Ok::<_, Infallible>(Change::Insert(i, Endpoint(i, labels)))
        }));
        let mut balance = BalanceLayer::new("svc-b", Policy::seed_000())
            .with_pick(pick)
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
        let mut requests = requests.into_iter();
        // Warm up: the index's lists reach their working capacity.
        for req in requests.by_ref().take(500) {
            route(req);
        }
        let mut gray_hits = 0;
        let n = allocations_in(|| {
            for (i, req) in requests.by_ref().enumerate() {
                let id = route(req);
                if (500 + i) % 2 == 0 {
                    assert_eq!(id % 4, 0, "a gray request went to baseline {id}");
                    gray_hits += 1;
                }
            }
        });
        assert_eq!(gray_hits, 750);
        assert_eq!(n, 0, "{pick:?}: {n} allocations for 1,500 requests");
    }
}
