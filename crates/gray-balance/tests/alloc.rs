//! Heap allocations on the balancer's request path, counted by a global allocator.
//!
//! Through a retrying balancer (`retry::Retry`) too: a request it does not copy before
//! its first attempt allocates nothing more.
//!
//! Once warm, routing a request stained with a lane (read from the extensions, looked up
//! in the published subset index, picked by p2c over Peak-EWMA, the endpoint cloned,
//! polled ready, called, completed and its load recorded) allocates nothing; neither does
//! an unstained request, nor a `pick` and its completion. Requests are built before
//! counting (`http::Extensions` boxes its map). The balancer's driver runs on a runtime
//! worker; the requests are polled by hand on the test's own thread (the allocator counts
//! per thread).

use std::{
    convert::Infallible,
    future::{Future, Ready, ready},
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use gray_balance::{
    Balance, BalanceLayer, Pick,
    retry::{ReplayBody, Retry, RetryPolicy},
};
use gray_core::{Labelled, Labels, Lane, Stain};
use gray_policy::Policy;
use gray_test_support::alloc::Counting;
use http_body_util::Empty;
use tower::{Service, discover::Change};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    gray_test_support::alloc::allocations_in(f).1
}

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

fn balancer(pick: Pick) -> Balance<usize, Endpoint> {
    let endpoints = futures_util::stream::iter((0..64).map(|i| {
        let labels = if i % 4 == 0 {
            Labels::from_iter([("gray", "true")])
        } else {
            Labels::new()
        };
        Ok::<_, Infallible>(Change::Insert(i, Endpoint(i, Arc::new(labels))))
    }));
    BalanceLayer::new("svc-b", Policy::seed_000())
        .with_pick(pick)
        .build(endpoints)
}

/// A runtime whose one worker runs the balancers' drivers.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn routing_a_lane_stain_allocates_nothing() {
    let rt = runtime();
    let _guard = rt.enter();
    for pick in [Pick::default(), Pick::PendingRequests, Pick::RoundRobin] {
        let mut balance = balancer(pick);
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
        // Warm up: every endpoint completes its probes, thread-locals are set up.
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

#[test]
fn a_pick_and_its_completion_allocate_nothing() {
    let rt = runtime();
    let _guard = rt.enter();
    let balance = balancer(Pick::default());
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let mut once = |i: usize| {
        let stain = (i % 2 == 0).then_some(&gray);
        let picked = balance.pick(stain).unwrap();
        assert_eq!(picked.endpoint().0 % 4 == 0, i % 2 == 0);
        picked.succeeded();
    };
    for i in 0..500 {
        once(i);
    }
    let n = allocations_in(|| (0..1_000).for_each(&mut once));
    assert_eq!(n, 0, "{n} allocations for 1,000 picks");
}

/// An endpoint of a retrying balancer: it takes the replayable body.
#[derive(Clone)]
struct Replaying(usize, Arc<Labels>);

impl Labelled for Replaying {
    fn labels(&self) -> &Labels {
        &self.1
    }
}

type ReplayRequest = http::Request<ReplayBody<Empty<Bytes>>>;

impl Service<ReplayRequest> for Replaying {
    type Response = usize;
    type Error = Infallible;
    type Future = Ready<Result<usize, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: ReplayRequest) -> Self::Future {
        ready(Ok(self.0))
    }
}

/// Allocations for 1,000 requests of `method` through a `Retry` under `policy`, after
/// 500 to warm up.
fn retrying(policy: RetryPolicy, method: &http::Method) -> usize {
    let endpoints = futures_util::stream::iter((0..64).map(|i| {
        let labels = if i % 4 == 0 {
            Labels::from_iter([("gray", "true")])
        } else {
            Labels::new()
        };
        Ok::<_, Infallible>(Change::Insert(i, Replaying(i, Arc::new(labels))))
    }));
    let balance = BalanceLayer::new("svc-b", Policy::seed_000())
        .with_retry(policy)
        .build(endpoints);
    let mut retry = Retry::new(balance);
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let requests: Vec<http::Request<Empty<Bytes>>> = (0..1_500)
        .map(|i| {
            let mut req = http::Request::new(Empty::new());
            *req.method_mut() = method.clone();
            if i % 2 == 0 {
                req.extensions_mut().insert(gray.clone());
            }
            req
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    let mut route = |req| {
        assert!(retry.poll_ready(&mut cx).is_ready());
        let fut = pin!(retry.call(req));
        match fut.poll(&mut cx) {
            Poll::Ready(Ok(id)) => id,
            other => panic!("{:?}", other.map(|r| r.is_ok())),
        }
    };
    let mut requests = requests.into_iter();
    for req in requests.by_ref().take(500) {
        route(req);
    }
    allocations_in(|| {
        for (i, req) in requests.by_ref().enumerate() {
            let id = route(req);
            assert_eq!(id % 4 == 0, i % 2 == 0, "request {i} went to {id}");
        }
    })
}

#[test]
fn a_retrying_balancer_allocates_nothing_for_a_request_it_does_not_copy() {
    let rt = runtime();
    let _guard = rt.enter();
    // A POST is not copied: it is retried only when the endpoint hands it back unsent.
    assert_eq!(retrying(RetryPolicy::new(), &http::Method::POST), 0);
    // A GET is, unless idempotent requests are not retried.
    let no_idempotent = RetryPolicy::new().with_idempotent([]);
    assert_eq!(retrying(no_idempotent, &http::Method::GET), 0);
    // Nor does a balancer that never retries.
    assert_eq!(retrying(RetryPolicy::disabled(), &http::Method::GET), 0);
}
