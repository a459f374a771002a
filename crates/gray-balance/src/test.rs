//! Routing, readiness, fallback, ejection, probing and the background task, with
//! `tower_test` mocks and paused time.

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures_util::Stream;
use gray_core::{
    Labelled, Labels, Lane, Policy, Stain,
    backoff::Backoff,
    matching::{OnUnready, OwnedSubset, UnroutableReason},
};
use tokio::sync::mpsc;
use tower::{BoxError, ServiceExt, discover::Change};
use tower_service::Service;
use tower_test::mock;

use crate::{
    Balance, BalanceLayer, Pick, RecordRouted, Routed, error::Unroutable, health::Ejection,
};

type Req = http::Request<String>;
type Handle = mock::Handle<Req, &'static str>;

/// A mock endpoint with labels; clones share the mock's handle.
#[derive(Clone)]
struct Endpoint {
    mock: mock::Mock<Req, &'static str>,
    labels: Arc<Labels>,
}

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl Service<Req> for Endpoint {
    type Response = &'static str;
    type Error = BoxError;
    type Future = mock::future::ResponseFuture<&'static str>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.mock.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.mock.call(req)
    }
}

/// A discover stream fed by a channel.
struct Changes<S>(mpsc::UnboundedReceiver<Result<Change<&'static str, S>, BoxError>>);

impl<S> Stream for Changes<S> {
    type Item = Result<Change<&'static str, S>, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

type Tx<S> = mpsc::UnboundedSender<Result<Change<&'static str, S>, BoxError>>;

struct Harness<S = Endpoint> {
    tx: Tx<S>,
    balance: Balance<&'static str, S>,
}

impl<S: Labelled + Send + Sync + 'static> Harness<S> {
    fn new(layer: BalanceLayer) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Harness {
            tx,
            balance: layer.build(Changes(rx)),
        }
    }

    fn send(&self, change: Change<&'static str, S>) {
        self.tx.send(Ok(change)).expect("driver alive");
    }

    fn remove(&self, key: &'static str) {
        self.send(Change::Remove(key));
    }
}

impl Harness<Endpoint> {
    /// Adds an endpoint; returns its mock handle, with no readiness granted yet.
    fn add(&self, key: &'static str, labels: &[(&str, &str)]) -> Handle {
        let (mock, mut handle) = mock::pair();
        handle.allow(0);
        let labels = Arc::new(Labels::from_iter(labels.iter().copied()));
        self.send(Change::Insert(key, Endpoint { mock, labels }));
        handle
    }

    async fn call(&self, req: Req) -> Result<&'static str, BoxError> {
        self.balance.clone().oneshot(req).await
    }
}

/// One request through `balance`, as a boxed future: spawned futures that name the
/// `&'static str` keys directly trip a compiler limitation ("not general enough").
fn send<S>(
    balance: Balance<&'static str, S>,
    req: Req,
) -> Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>
where
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    S::Response: Send,
{
    Box::pin(balance.oneshot(req))
}

/// Lets the background task run until `check` holds (a bounded number of turns).
async fn settle(mut check: impl FnMut() -> bool) {
    for _ in 0..1_000 {
        if check() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the background task did not get there");
}

fn gray_req() -> Req {
    let mut req = http::Request::new("hi".to_owned());
    req.extensions_mut()
        .insert(Stain::in_lane(Lane::new("gray").unwrap()));
    req
}

fn base_req() -> Req {
    let mut req = http::Request::new("hi".to_owned());
    req.extensions_mut().insert(Stain::baseline());
    req
}

/// The next request the endpoint received, which must have body `hi`.
async fn next(handle: &mut Handle) -> mock::SendResponse<&'static str> {
    let (req, send) = handle.next_request().await.expect("a request");
    assert_eq!(req.body(), "hi");
    send
}

fn unroutable(err: BoxError) -> Unroutable {
    match err.downcast::<Unroutable>() {
        Ok(e) => *e,
        Err(other) => panic!("expected Unroutable, got {other}"),
    }
}

fn ejection(consecutive: u32, first: u64, max: u64) -> Ejection {
    let backoff = Backoff::new(Duration::from_secs(first), Duration::from_secs(max));
    Ejection::new()
        .with_consecutive(consecutive)
        .with_backoff(backoff.without_jitter())
}

#[tokio::test(start_paused = true)]
async fn no_instance_fails_at_once_naming_service_lane_and_policy() {
    let h: Harness = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let mut balance = h.balance.clone();
    assert!(
        std::future::poll_fn(|cx| Service::<Req>::poll_ready(&mut balance, cx))
            .await
            .is_ok(),
        "always ready"
    );
    // The future fails on its first poll: nothing waits for an instance.
    let mut fut = std::pin::pin!(balance.call(gray_req()));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let Poll::Ready(Err(err)) = fut.as_mut().poll(&mut cx) else {
        panic!("an unroutable request fails at once");
    };
    let err = unroutable(err);
    assert_eq!(err.reason(), &UnroutableReason::NoMatch);
    assert_eq!(
        (err.service(), err.policy(), err.lane().map(Lane::as_str)),
        ("svc-b", "seed-000", Some("gray"))
    );
    assert_eq!(
        err.to_string(),
        "no instance of `svc-b` fits lane `gray` (policy `seed-000`, fallback `baseline`)"
    );
}

#[tokio::test(start_paused = true)]
async fn gray_goes_to_gray_and_baseline_never_does() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let mut base = h.add("b1", &[("gray", "false")]);
    let mut gray = h.add("g1", &[("gray", "TRUE")]);
    base.allow(10);
    gray.allow(10);
    settle(|| h.balance.len() == 2).await;

    let fut = h.call(gray_req());
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
    let (answer, ()) = tokio::join!(h.call(base_req()), async {
        next(&mut base).await.send_response("b1");
    });
    assert_eq!(answer.unwrap(), "b1");

    // No baseline instance left: seed 000 refuses to send baseline traffic to gray.
    h.remove("b1");
    settle(|| h.balance.len() == 1).await;
    let err = unroutable(h.call(base_req()).await.unwrap_err());
    assert_eq!(err.reason(), &UnroutableReason::NoMatch);
    assert_eq!(err.service(), "svc-b");
    assert_eq!(err.policy(), "seed-000");
    assert_eq!(err.lane(), None);
}

#[tokio::test(start_paused = true)]
async fn discovery_is_applied_without_requests() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let gray_stain = Stain::in_lane(Lane::new("gray").unwrap());
    let _g = h.add("g1", &[("gray", "true")]);
    settle(|| h.balance.explain(Some(&gray_stain)).candidates() == Some(&["g1"][..])).await;
    assert_eq!((h.balance.len(), h.balance.ready_len()), (1, 1));
    h.remove("g1");
    settle(|| h.balance.is_empty()).await;
    assert!(h.balance.explain(Some(&gray_stain)).error().is_some());
}

#[tokio::test(start_paused = true)]
async fn the_endpoints_readiness_is_awaited_in_the_response_future() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    let mut base = h.add("b1", &[]);
    settle(|| h.balance.len() == 1).await;
    let balance = h.balance.clone();
    let call = tokio::spawn(send(balance, base_req()));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!call.is_finished(), "the endpoint grants no readiness");
    assert!(base.poll_request().is_pending(), "nothing was sent");
    base.allow(1);
    next(&mut base).await.send_response("b1");
    assert_eq!(call.await.unwrap().unwrap(), "b1");
}

#[tokio::test(start_paused = true)]
async fn an_unready_endpoint_fails_fast_or_falls_back_then_returns() {
    for on_unready in [OnUnready::Fail, OnUnready::Fallback] {
        let policy = Policy::seed_000().with_on_unready(on_unready);
        let layer = BalanceLayer::new("svc-b", policy).with_ejection(ejection(5, 2, 2));
        let h = Harness::new(layer);
        let mut base = h.add("b1", &[]);
        let mut gray = h.add("g1", &[("gray", "true")]);
        base.allow(10);
        settle(|| h.balance.len() == 2).await;

        // Its readiness check fails: the request gets the error, the endpoint is unready.
        gray.send_error("overloaded");
        let err = h.call(gray_req()).await.unwrap_err();
        assert_eq!(err.to_string(), "overloaded");
        settle(|| h.balance.ready_len() == 1).await;
        assert_eq!(h.balance.len(), 2, "unready, still present");

        let fut = h.call(gray_req());
        match on_unready {
            OnUnready::Fail => {
                let err = unroutable(fut.await.unwrap_err());
                assert!(
                    matches!(err.reason(), UnroutableReason::Unready { present: 1, .. }),
                    "{err}"
                );
                assert!(base.poll_request().is_pending(), "nothing was sent");
            }
            OnUnready::Fallback => {
                let (answer, ()) = tokio::join!(fut, async {
                    next(&mut base).await.send_response("b1");
                });
                assert_eq!(answer.unwrap(), "b1");
            }
            _ => unreachable!("only the two settings above are tried"),
        }
        // After the backoff it is back.
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle(|| h.balance.ready_len() == 2).await;
        gray.allow(1);
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_response("g1");
        });
        assert_eq!(answer.unwrap(), "g1");
    }
}

#[tokio::test(start_paused = true)]
async fn task_local_then_own_lane() {
    let policy = Policy::seed_000().with_own_lane(Some(Lane::new("gray").unwrap()));
    let h = Harness::new(BalanceLayer::new("svc-b", policy));
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(10);
    gray.allow(10);
    settle(|| h.balance.len() == 2).await;

    // No extension, no task-local: the calling instance's own lane (gray).
    let (answer, ()) = tokio::join!(h.call(http::Request::new("hi".to_owned())), async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");

    // A task-local baseline stain wins over the own lane: the pick runs in this task.
    let fut = gray_core::task::scope(
        Stain::baseline(),
        h.call(http::Request::new("hi".to_owned())),
    );
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut base).await.send_response("b1");
    });
    assert_eq!(answer.unwrap(), "b1");

    // The extension wins over the task-local.
    let fut = gray_core::task::scope(Stain::baseline(), h.call(gray_req()));
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn connection_errors_eject_with_growing_backoff() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(2, 1, 10));
    let h = Harness::new(layer);
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(100);
    gray.allow(100);
    settle(|| h.balance.len() == 2).await;
    let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
    let gray_ctx = Stain::in_lane(Lane::new("gray").unwrap());

    // Two connection errors in a row eject g1.
    for _ in 0..2 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_error(refused());
        });
        assert!(answer.is_err());
    }
    settle(|| h.balance.ready_len() == 1).await;
    let explained = h.balance.explain(Some(&gray_ctx));
    assert!(
        explained.fallback_taken(),
        "the ejected instance counts as absent"
    );
    assert_eq!(explained.candidates().unwrap(), ["b1"]);
    let serve_base = async {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut base).await.send_response("b1");
        });
        assert_eq!(answer.unwrap(), "b1");
    };
    serve_base.await;

    // After the first backoff (1 s), g1 is back; two more errors eject it for 2 s.
    tokio::time::sleep(Duration::from_millis(1001)).await;
    settle(|| h.balance.ready_len() == 2).await;
    for _ in 0..2 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_error(refused());
        });
        assert!(answer.is_err());
    }
    settle(|| h.balance.ready_len() == 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.balance.ready_len(), 1, "still out after 1.5 s");
    tokio::time::sleep(Duration::from_millis(600)).await;
    settle(|| h.balance.ready_len() == 2).await;
    let (answer, ()) = tokio::join!(h.call(gray_req()), async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn other_errors_do_not_eject() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(1, 1, 1));
    let h = Harness::new(layer);
    let mut gray = h.add("g1", &[("gray", "true")]);
    gray.allow(100);
    settle(|| h.balance.len() == 1).await;
    for _ in 0..3 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            let send = next(&mut gray).await;
            send.send_error(io::Error::from(io::ErrorKind::InvalidData));
        });
        assert!(answer.is_err());
        tokio::task::yield_now().await;
        assert_eq!(h.balance.ready_len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn all_ejected_is_unroutable_until_readmitted() {
    let layer = BalanceLayer::new("svc-b", Policy::new())
        .with_ejection(ejection(1, 5, 5))
        .with_pick(Pick::RoundRobin);
    let h = Harness::new(layer);
    let mut only = h.add("b1", &[]);
    only.allow(100);
    settle(|| h.balance.len() == 1).await;
    let (answer, ()) = tokio::join!(h.call(base_req()), async {
        let send = next(&mut only).await;
        send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));
    });
    assert!(answer.is_err());
    settle(|| h.balance.ready_len() == 0).await;
    let err = unroutable(h.call(base_req()).await.unwrap_err());
    assert_eq!(
        err.reason(),
        &UnroutableReason::NoMatch,
        "ejected counts as absent"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle(|| h.balance.ready_len() == 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_discovery_stream_keeps_its_endpoints_and_is_polled_again() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    let _a = h.add("a", &[]);
    h.tx.send(Err("registry unreachable".into())).unwrap();
    let _b = h.add("b", &[]);
    settle(|| h.balance.len() == 1).await;
    // The stream rests after the error (a backoff of at most 100 ms), then goes on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle(|| h.balance.len() == 2).await;
}

#[tokio::test]
async fn dropping_every_handle_ends_the_driver() {
    let (tx, rx) = mpsc::unbounded_channel::<Result<Change<&'static str, Endpoint>, BoxError>>();
    let (balance, driver) = BalanceLayer::new("svc-b", Policy::new()).pair(Changes(rx));
    let driver = tokio::spawn(driver);
    let clone = balance.clone();
    drop(balance);
    tokio::task::yield_now().await;
    assert!(!driver.is_finished(), "a clone is alive");
    drop(clone);
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("the driver ends")
        .unwrap();
    drop(tx);
}

/// An endpoint that answers after a simulated latency.
#[derive(Clone)]
struct Slow {
    name: &'static str,
    labels: Arc<Labels>,
    latency: Duration,
}

impl Labelled for Slow {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl Service<Req> for Slow {
    type Response = &'static str;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<&'static str, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        let (name, latency) = (self.name, self.latency);
        Box::pin(async move {
            tokio::time::sleep(latency).await;
            Ok(name)
        })
    }
}

fn slow(name: &'static str, labels: &[(&str, &str)], ms: u64) -> Change<&'static str, Slow> {
    Change::Insert(
        name,
        Slow {
            name,
            labels: Arc::new(Labels::from_iter(labels.iter().copied())),
            latency: Duration::from_millis(ms),
        },
    )
}

/// Sends `n` requests one per second; returns who served them, in order.
async fn one_per_second(h: &Harness<Slow>, n: usize, gray: bool) -> Vec<&'static str> {
    let mut served = Vec::new();
    for _ in 0..n {
        let req = if gray { gray_req() } else { base_req() };
        served.push(h.balance.clone().oneshot(req).await.unwrap());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    served
}

#[tokio::test(start_paused = true)]
async fn a_new_endpoint_gets_traffic_at_one_request_per_second() {
    for gray in [false, true] {
        let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
        let labels: &[(&str, &str)] = if gray { &[("gray", "true")] } else { &[] };
        h.send(slow("old", labels, 2));
        settle(|| h.balance.len() == 1).await;
        // The old endpoint is warm: measured, out of probing.
        assert!(
            one_per_second(&h, 5, gray)
                .await
                .iter()
                .all(|&n| n == "old")
        );

        // A new endpoint, as fast: it gets the very next request (N = 1), then its probes.
        h.send(slow("new", labels, 2));
        settle(|| h.balance.len() == 2).await;
        let served = one_per_second(&h, 20, gray).await;
        assert_eq!(served[..3], ["new"; 3], "gray={gray}: {served:?}");
        // Then both share the traffic.
        let new = served[3..].iter().filter(|&&n| n == "new").count();
        assert!((3..=14).contains(&new), "gray={gray}: {served:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_new_endpoint_gets_one_probe_at_a_time() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    h.send(slow("fast", &[], 1));
    settle(|| h.balance.len() == 1).await;
    one_per_second(&h, 3, false).await;
    h.send(slow("slow", &[], 500));
    settle(|| h.balance.len() == 2).await;
    // 20 concurrent requests: one probes the slow endpoint, the others go by load.
    let served =
        futures_util::future::join_all((0..20).map(|_| h.balance.clone().oneshot(base_req())))
            .await;
    let slow = served
        .iter()
        .filter(|r| *r.as_ref().unwrap() == "slow")
        .count();
    assert_eq!(slow, 1, "{served:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_route_by_their_own_task_local_stain() {
    let endpoints = futures_util::stream::iter((0..8).map(|i| {
        let labels: &[(&str, &str)] = if i % 2 == 0 { &[("gray", "true")] } else { &[] };
        let name = ["g0", "b1", "g2", "b3", "g4", "b5", "g6", "b7"][i];
        Ok::<_, Infallible>(slow(name, labels, 0))
    }));
    let balance = BalanceLayer::new("svc-b", Policy::seed_000()).build(endpoints);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let balance = balance.clone();
            tokio::spawn(async move {
                let stain = if i % 2 == 0 {
                    Stain::in_lane(Lane::new("gray").unwrap())
                } else {
                    Stain::baseline()
                };
                let mut served = Vec::new();
                for _ in 0..50 {
                    let call = send(balance.clone(), http::Request::new("hi".to_owned()));
                    served.push(gray_core::task::scope(stain.clone(), call).await.unwrap());
                }
                (i, served)
            })
        })
        .collect();
    let mut counts = HashMap::new();
    for task in tasks {
        let (i, served) = task.await.unwrap();
        let lane = if i % 2 == 0 { 'g' } else { 'b' };
        for name in served {
            assert!(name.starts_with(lane), "caller {i} got {name}");
            *counts.entry(name).or_insert(0) += 1;
        }
    }
    assert_eq!(counts.len(), 8, "every endpoint served: {counts:?}");
}

#[tokio::test(start_paused = true)]
async fn pick_reports_to_load_and_health() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(2, 1, 1));
    let h = Harness::new(layer);
    let _g = h.add("g1", &[("gray", "true")]);
    let _b = h.add("b1", &[]);
    settle(|| h.balance.len() == 2).await;
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let picked = h.balance.pick(Some(&gray)).unwrap();
    assert_eq!(*picked.key(), "g1");
    assert_eq!(picked.labels().get("gray"), Some("true"));
    assert_eq!(
        picked.routed().subset(),
        &OwnedSubset::Lane(Lane::new("gray").unwrap())
    );
    assert!(!picked.routed().fallback());
    picked.connection_failed();
    h.balance.pick(Some(&gray)).unwrap().connection_failed();
    settle(|| h.balance.ready_len() == 1).await;
    // The gray instance is ejected: a gray pick falls back to baseline (seed 000).
    let picked = h.balance.pick(Some(&gray)).unwrap();
    assert_eq!(*picked.key(), "b1");
    assert!(picked.routed().fallback());
    picked.succeeded();
    // No stain given: the task-local one.
    let picked = gray_core::task::sync_scope(Stain::baseline(), || h.balance.pick(None));
    assert_eq!(*picked.unwrap().key(), "b1");
    let err = h
        .balance
        .pick(Some(&Stain::in_lane(Lane::new("blue").unwrap())));
    assert!(err.is_ok(), "seed 000 falls back for any lane");
    let strict = Harness::<Endpoint>::new(BalanceLayer::new("svc-c", Policy::new()));
    let err = strict.balance.pick(None).unwrap_err();
    assert_eq!(err.service(), "svc-c");
}

#[tokio::test]
async fn routed_is_recorded_only_when_asked() {
    /// Answers with the `Routed` its request carried.
    #[derive(Clone)]
    struct Echo(Arc<Labels>);
    impl Labelled for Echo {
        fn labels(&self) -> &Labels {
            &self.0
        }
    }
    impl Service<Req> for Echo {
        type Response = Option<Routed>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Option<Routed>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Req) -> Self::Future {
            std::future::ready(Ok(req.extensions().get::<Routed>().cloned()))
        }
    }
    let endpoints = || {
        futures_util::stream::iter([Ok::<_, Infallible>(Change::Insert(1, Echo(Arc::default())))])
    };
    let policy = Policy::seed_000();
    let plain = BalanceLayer::new("svc", policy.clone()).build(endpoints());
    assert_eq!(plain.oneshot(gray_req()).await.unwrap(), None);

    for record in [RecordRouted::Always, RecordRouted::Fallbacks] {
        let recording = BalanceLayer::new("svc", policy.clone())
            .with_routed(record)
            .build(endpoints());
        let routed = recording.clone().oneshot(gray_req()).await.unwrap();
        let routed = routed.expect("recorded");
        assert_eq!(routed.subset(), &OwnedSubset::Baseline);
        assert!(
            routed.fallback(),
            "a gray request served by baseline is a fallback"
        );
        // A baseline request served by baseline took no fallback.
        let routed = recording.oneshot(base_req()).await.unwrap();
        match record {
            RecordRouted::Always => {
                let routed = routed.expect("recorded");
                assert_eq!(routed.subset(), &OwnedSubset::Baseline);
                assert!(!routed.fallback());
            }
            _ => assert_eq!(routed, None, "only fallbacks are recorded"),
        }
    }
}

#[test]
fn balance_and_its_future_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    fn assert_send<T: Send + 'static>() {}
    assert_send_sync::<Balance<&'static str, Endpoint>>();
    assert_send::<crate::future::ResponseFuture<Endpoint, Req>>();
    assert_send::<crate::Picked<&'static str, Endpoint>>();
    assert_send::<crate::Driver<Changes<Endpoint>>>();
    assert_send_sync::<BalanceLayer>();
}
