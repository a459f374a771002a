//! Heap allocations on the balancer's request path, counted by a global allocator.
//!
//! Through a retrying balancer (`retry::Retry`) too: a request it does not copy before
//! its first attempt allocates nothing more. A strategy written outside the crate costs a
//! virtual call per pick and no allocation.
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
    fmt::Debug,
    future::{Future, Ready, ready},
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use gray_balance::{
    Balance, BalanceLayer, Pick,
    retry::{Retry, RetryPolicy},
    strategy::{Candidates, Strategy},
};
use gray_core::{Labelled, Labels, Lane, Stain, rand::Rng};
use gray_policy::Policy;
use gray_test_support::alloc::Counting;
use http_body_util::Empty;
use tower::{Service, discover::Change};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> usize {
    gray_test_support::alloc::allocations_in(f).1
}

/// An endpoint whose clone is a reference count increment; it answers its index.
#[derive(Clone)]
struct Endpoint(usize, Arc<Labels>);

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.1
    }
}

impl<B> Service<http::Request<B>> for Endpoint {
    type Response = usize;
    type Error = Infallible;
    type Future = Ready<Result<usize, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        ready(Ok(self.0))
    }
}

/// 64 endpoints labelled by `labels(i)`.
fn endpoints(
    labels: impl Fn(usize) -> Labels,
) -> impl futures_util::Stream<Item = Result<Change<usize, Endpoint>, Infallible>> {
    futures_util::stream::iter(
        (0..64).map(move |i| Ok(Change::Insert(i, Endpoint(i, Arc::new(labels(i)))))),
    )
}

/// Every 4th endpoint gray.
fn every_4th_gray(i: usize) -> Labels {
    match i % 4 {
        0 => Labels::from_iter([("gray", "true")]),
        _ => Labels::new(),
    }
}

fn balancer(pick: Pick) -> Balance<usize, Endpoint> {
    BalanceLayer::new("svc-b", Policy::seed_000())
        .with_pick(pick)
        .build(endpoints(every_4th_gray))
}

/// `n` requests built before counting (`http::Extensions` boxes its map), the even ones
/// stained with the lane `gray`.
fn half_gray<B>(n: usize, body: impl Fn() -> B) -> Vec<http::Request<B>> {
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    (0..n)
        .map(|i| {
            let mut req = http::Request::new(body());
            if i % 2 == 0 {
                req.extensions_mut().insert(gray.clone());
            }
            req
        })
        .collect()
}

/// Polls `service` ready and calls it with `req`, on this thread: the endpoints answer at
/// once.
fn call_now<S, R>(service: &mut S, req: R) -> S::Response
where
    S: Service<R>,
    S::Error: Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    assert!(service.poll_ready(&mut cx).is_ready());
    let fut = pin!(service.call(req));
    match fut.poll(&mut cx) {
        Poll::Ready(Ok(answer)) => answer,
        Poll::Ready(Err(e)) => panic!("the call failed: {e:?}"),
        Poll::Pending => panic!("the call did not complete at once"),
    }
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
        let mut requests = half_gray(2_000, || ()).into_iter();
        // Warm up: every endpoint completes its probes, thread-locals are set up.
        for req in requests.by_ref().take(500) {
            call_now(&mut balance, req);
        }
        let mut gray_hits = 0;
        let n = allocations_in(|| {
            for (i, req) in requests.by_ref().enumerate() {
                let id = call_now(&mut balance, req);
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
        let stain = i.is_multiple_of(2).then_some(&gray);
        let picked = balance.pick(stain).unwrap();
        assert_eq!(picked.endpoint().0.is_multiple_of(4), i.is_multiple_of(2));
        picked.succeeded();
    };
    for i in 0..500 {
        once(i);
    }
    let n = allocations_in(|| (0..1_000).for_each(&mut once));
    assert_eq!(n, 0, "{n} allocations for 1,000 picks");
}

/// Allocations for 1,000 requests of `method` through a `Retry` under `policy`, after
/// 500 to warm up.
fn retrying(policy: RetryPolicy, method: &http::Method) -> usize {
    let balance = BalanceLayer::new("svc-b", Policy::seed_000())
        .with_retry(policy)
        .build(endpoints(every_4th_gray));
    let mut retry = Retry::new(balance);
    let requests: Vec<_> = half_gray(1_500, Empty::<Bytes>::new)
        .into_iter()
        .map(|mut req| {
            *req.method_mut() = method.clone();
            req
        })
        .collect();
    let mut requests = requests.into_iter();
    for req in requests.by_ref().take(500) {
        call_now(&mut retry, req);
    }
    allocations_in(|| {
        for (i, req) in requests.by_ref().enumerate() {
            let id = call_now(&mut retry, req);
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
    let rt = runtime();
    let _guard = rt.enter();
    // Every 4th endpoint gray; the heaviest gray one is 60, the heaviest baseline 63.
    let weighted = |i: usize| {
        let mut labels = every_4th_gray(i);
        labels.insert("weight", i.to_string());
        labels
    };
    let mut balance = BalanceLayer::new("svc-b", Policy::seed_000())
        .with_strategy(Heaviest)
        .build(endpoints(weighted));
    let mut requests = half_gray(2_000, || ()).into_iter().enumerate();
    // Warm up: thread-locals are set up.
    for (_, req) in requests.by_ref().take(500) {
        call_now(&mut balance, req);
    }
    let mut served = Vec::with_capacity(1_500);
    let n = allocations_in(|| {
        for (i, req) in requests.by_ref() {
            served.push((i, call_now(&mut balance, req)));
        }
    });
    assert_eq!(n, 0, "{n} allocations for 1,500 requests");
    for (i, id) in served {
        let expected = if i % 2 == 0 { 60 } else { 63 };
        assert_eq!(id, expected, "request {i}");
    }
}
