//! Heap allocations on the request path, counted by a global allocator.
//!
//! A lane stain must cost no allocation once the lane is interned (`Carriers::with_names`):
//! reading it, scoping it as the task-local stain, reading it back and writing it onto an
//! outbound request only clone `Arc`s and `Bytes`. The one allocation source left on the
//! full `ExtractStain` → handler → `PropagateStain` path is `http::Extensions`, which
//! boxes its map and each value. What that costs is the `http` crate's business (and may
//! change with it); gray's part is measured against it: storing the stain costs what
//! storing any small value costs, and the full path costs exactly one such insert, no
//! more.
//!
//! With the `baggage` carrier on (`Carriers::with_baggage`), a lane stain on a request
//! without `baggage` costs nothing either: nothing is inherited, and the outbound
//! `gray.lane=<lane>` member is encoded once per lane. A request that does carry other
//! members pays for keeping them (one copy into the stain, one merged outbound value);
//! that is measured too, against a fixed bound.
//!
//! The allocator counts per thread, so the test harness's other threads do not disturb a
//! measurement; every measured closure runs on the test's own thread (the futures are
//! polled by hand with a no-op waker, no runtime involved).

use std::{
    convert::Infallible,
    future::Future,
    pin::pin,
    task::{Context, Poll, Waker},
};

use gray_core::{Carriers, Lane, Names, Stain};
use gray_test_support::alloc::{Counting, measure};
use gray_tower::{ExtractStainLayer, PropagateStainLayer, task};
use http::{HeaderMap, HeaderValue, Request, Response};
use tower::{Layer, Service, ServiceExt, service_fn};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Polls `fut` once with a no-op waker; everything under test is ready at once.
fn poll_once<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the future under test is not ready at its first poll"),
    }
}

fn gray() -> Lane {
    Lane::new("gray").expect("valid lane")
}

/// The default carriers (`x-gray-lane`, `x-gray-info`), with `gray` interned.
fn carriers(gray: &Lane) -> Carriers {
    Carriers::default().with_names(Names::new().with_lanes([gray.clone()]))
}

/// The default carriers and the `baggage` member `gray.lane`, with `gray` interned.
fn baggage_carriers(gray: &Lane) -> Carriers {
    carriers(gray).with_baggage()
}

fn inbound_headers() -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert("x-gray-lane", HeaderValue::from_static("gray"));
    headers
}

#[test]
fn codec_and_task_local_steps_allocate_nothing() {
    let gray = gray();
    let carriers = carriers(&gray);
    let inbound = inbound_headers();

    // 1. Extract: the interned lane comes back as an `Arc` clone.
    let (stain, n) = measure(|| carriers.extract(&inbound));
    let stain = stain.expect("a stain");
    assert_eq!(stain.lane(), Some(&gray));
    assert_eq!(
        n, 0,
        "Carriers::extract of an interned lane allocated {n} times"
    );

    // 2. The synchronous scope around `call()`, and reading the stain back in it.
    let (seen, n) = measure(|| task::sync_scope(stain.clone(), task::current));
    assert_eq!(seen.as_ref(), Some(&stain));
    assert_eq!(n, 0, "task::sync_scope + task::current allocated {n} times");

    // 3. The scope around the response future, polled by hand.
    let (seen, n) = measure(|| poll_once(task::scope(stain.clone(), async { task::current() })));
    assert_eq!(seen.as_ref(), Some(&stain));
    assert_eq!(n, 0, "task::scope + task::current allocated {n} times");

    // 4. Inject into an outbound map that already has room: remove, then write again.
    let mut outbound = HeaderMap::with_capacity(8);
    outbound.insert("accept", HeaderValue::from_static("*/*"));
    let ((), n) = measure(|| {
        carriers.strip(&mut outbound);
        carriers.inject(&stain, &mut outbound);
    });
    assert_eq!(outbound["x-gray-lane"], "gray");
    assert_eq!(outbound["accept"], "*/*");
    assert_eq!(n, 0, "Carriers::inject allocated {n} times");
}

#[test]
fn default_carriers_learn_a_lane_on_first_sight() {
    // `Carriers::default()` knows no lane in advance: the first request in `gray` builds
    // the name and the interner learns it; after warm-up, extraction allocates nothing.
    let carriers = Carriers::default();
    let inbound = inbound_headers();
    let (stain, n) = measure(|| carriers.extract(&inbound));
    assert_eq!(stain.expect("a stain").lane(), Some(&gray()));
    assert_eq!(n, 0, "extract of a learned lane allocated {n} times");
}

#[test]
fn an_unknown_lane_is_built_on_the_heap() {
    // The counter-example that keeps the tests above honest: with learning switched off
    // and no interned name, decoding a lane builds a new name every time (a `Box<str>`,
    // its `HeaderValue` bytes and the `Arc`).
    let carriers = Carriers::default().with_names(Names::new().with_learning_cap(0));
    let inbound = inbound_headers();
    let (stain, n) = measure(|| carriers.extract(&inbound));
    assert_eq!(stain.expect("a stain").lane(), Some(&gray()));
    println!("extract of a lane that is not interned: {n} allocations");
    assert!(
        n > 0,
        "decoding a lane that is not interned allocated nothing"
    );
}

/// The allocations of one `http::Extensions::insert` of `value` (a stain, as `ExtractStain`
/// makes for every inbound request); with `existing`, another entry is in the map already.
fn extensions_insert_cost<T: Clone + Send + Sync + 'static>(value: &T, existing: bool) -> usize {
    /// Stands for what a server puts there before the layer runs (peer address, ...).
    #[derive(Clone)]
    struct Earlier;

    let mut requests: Vec<Request<()>> = (0..9)
        .map(|_| {
            let mut req = Request::new(());
            if existing {
                req.extensions_mut().insert(Earlier);
            }
            req
        })
        .collect();
    let mut done = Vec::with_capacity(requests.len());
    let ((), n) = measure(|| {
        let mut req = requests.pop().expect("a request per run");
        req.extensions_mut().insert(value.clone());
        done.push(req);
    });
    assert_eq!(done.len(), 9);
    n
}

#[test]
fn storing_the_stain_costs_what_storing_any_small_value_costs() {
    /// Any small value a layer might store, the baseline of the comparison.
    #[derive(Clone)]
    struct Small(#[allow(dead_code)] u64);

    // Cloning a stain allocates nothing: it shares its lane and pins.
    let stain = Stain::in_lane(gray());
    let (clone, n) = measure(|| stain.clone());
    assert_eq!(
        (clone, n),
        (stain.clone(), 0),
        "a stain clone allocated {n} times"
    );

    // The insert, into a fresh map and into one that has an entry: whatever `http` needs
    // for a value, a stain needs nothing more.
    for existing in [false, true] {
        let small = extensions_insert_cost(&Small(7), existing);
        for stain in [Stain::in_lane(gray()), Stain::baseline()] {
            let n = extensions_insert_cost(&stain, existing);
            println!("extensions insert (existing entry: {existing}): {n}, a u64: {small}");
            assert_eq!(
                n, small,
                "storing {stain:?} allocated {n} times, storing a u64 {small} (existing entry: {existing})"
            );
        }
    }
}

/// Sends a request with `inbound` headers through `ExtractStain`, a handler,
/// `PropagateStain` (both with `carriers`) and a client stand-in, polled by hand. Returns
/// the `sent` header the client got and the allocations of one run after warm-up.
fn full_path(
    carriers: Carriers,
    inbound: fn() -> HeaderMap,
    sent: &'static str,
) -> (Option<HeaderValue>, usize) {
    // The outbound client: a stand-in answering with the `sent` header it was sent.
    let client = PropagateStainLayer::new()
        .with_carriers(carriers.clone())
        .layer(service_fn(move |req: Request<()>| {
            let sent = req.headers().get(sent).cloned();
            std::future::ready(Ok::<_, Infallible>(Response::new(sent)))
        }));
    // The handler sends the inbound request on, after dropping its stain (headers and
    // extensions) by hand: what reaches the client comes from the task-local stain.
    let handler = service_fn(move |mut req: Request<()>| {
        let mut client = client.clone();
        let from_extensions = req.extensions_mut().remove::<Stain>();
        req.headers_mut().remove("x-gray-lane");
        req.headers_mut().remove("baggage");
        async move {
            assert_eq!(from_extensions, task::current());
            client.ready().await?.call(req).await
        }
    });
    let mut server = ExtractStainLayer::new()
        .with_carriers(carriers)
        .layer(handler);

    // Requests are built outside the measured window: they are the caller's cost.
    let mut requests: Vec<Request<()>> = (0..9)
        .map(|_| {
            let mut req = Request::new(());
            *req.headers_mut() = inbound();
            req
        })
        .collect();
    let (res, n) = measure(|| {
        let req = requests.pop().expect("a request per run");
        poll_once(async {
            let res = server.ready().await?.call(req).await;
            res.map(Response::into_body)
        })
    });
    (res.expect("answered"), n)
}

fn no_headers() -> HeaderMap {
    HeaderMap::with_capacity(8)
}

#[test]
fn the_full_service_path_allocates_only_the_extensions_entry() {
    let insert = extensions_insert_cost(&Stain::in_lane(gray()), false);

    let gray = gray();
    let (sent, stained) = full_path(carriers(&gray), inbound_headers, "x-gray-lane");
    assert_eq!(sent.expect("a lane header"), "gray");
    assert_eq!(
        stained, insert,
        "a stained request allocated {stained} times; the extensions insert alone {insert}"
    );

    // An unstained request pays the same: the layer stores the baseline stain too.
    let (sent, unstained) = full_path(carriers(&gray), no_headers, "x-gray-lane");
    assert_eq!(sent, None);
    assert_eq!(
        unstained, insert,
        "an unstained request allocated {unstained} times; the extensions insert alone {insert}"
    );
}

#[test]
fn the_baggage_carrier_costs_nothing_for_a_request_without_baggage() {
    let gray = gray();
    let carriers = baggage_carriers(&gray);

    // Stained by `x-gray-lane` or by the `gray.lane` member alone: nothing to inherit.
    let mut by_member = HeaderMap::with_capacity(8);
    by_member.insert("baggage", HeaderValue::from_static("gray.lane=gray"));
    for inbound in [inbound_headers(), by_member] {
        let (stain, n) = measure(|| carriers.extract_or(&inbound, &Stain::baseline()));
        assert_eq!(stain.lane(), Some(&gray));
        assert_eq!(stain.baggage(), None);
        assert_eq!(n, 0, "extract with the baggage carrier allocated {n} times");
    }

    // Writing states the lane on all three carriers, `baggage` from its encoded member.
    let stain = Stain::in_lane(gray.clone());
    let mut outbound = HeaderMap::with_capacity(8);
    outbound.insert("accept", HeaderValue::from_static("*/*"));
    let ((), n) = measure(|| {
        outbound.remove("baggage");
        carriers.inject(&stain, &mut outbound);
    });
    assert_eq!(outbound["x-gray-lane"], "gray");
    assert_eq!(outbound["baggage"], "gray.lane=gray");
    assert_eq!(n, 0, "inject with the baggage carrier allocated {n} times");

    // A baseline stain on a request without baggage writes nothing and allocates nothing.
    let mut outbound = HeaderMap::with_capacity(8);
    let ((), n) = measure(|| carriers.inject(&Stain::baseline(), &mut outbound));
    assert!(outbound.is_empty());
    assert_eq!(n, 0, "inject of a baseline stain allocated {n} times");
}

#[test]
fn ten_inherited_members_cost_a_bounded_number_of_allocations() {
    let gray = gray();
    let carriers = baggage_carriers(&gray);
    let members: Vec<String> = (0..10).map(|i| format!("member{i}=value{i};p")).collect();
    let mut inbound = inbound_headers();
    inbound.insert(
        "baggage",
        HeaderValue::from_str(&members.join(",")).expect("valid header value"),
    );

    // Keeping them: the list under construction, and the shared copy in the stain.
    let (stain, n) = measure(|| carriers.extract_or(&inbound, &Stain::baseline()));
    assert_eq!(stain.baggage().map(|b| b.len()), Some(10));
    println!("extract of 10 inherited members: {n} allocations");
    assert!(n <= 2, "extract of 10 members allocated {n} times");

    // Writing them back: the merged value, built at its exact size.
    let mut outbound = HeaderMap::with_capacity(8);
    let ((), n) = measure(|| {
        outbound.remove("baggage");
        carriers.inject(&stain, &mut outbound);
    });
    assert_eq!(
        outbound["baggage"].to_str().ok(),
        Some(format!("{},gray.lane=gray", members.join(",")).as_str())
    );
    println!("inject of 10 inherited members: {n} allocations");
    assert!(n <= 1, "inject of 10 members allocated {n} times");
}

#[test]
fn the_full_service_path_with_the_baggage_carrier_allocates_only_the_extensions_entry() {
    // The `baggage` carrier on both layers, a request stained by `x-gray-lane` without
    // `baggage`: the outbound `baggage` is the encoded `gray.lane=gray`.
    let gray = gray();
    let insert = extensions_insert_cost(&Stain::in_lane(gray.clone()), false);
    let (sent, n) = full_path(baggage_carriers(&gray), inbound_headers, "baggage");
    assert_eq!(sent.expect("a baggage header"), "gray.lane=gray");
    assert_eq!(
        n, insert,
        "allocated {n} times; the extensions insert alone {insert}"
    );
}
