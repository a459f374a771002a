//! Routing, readiness, fallback, ejection, probing and the background task, with
//! `tower_test` mocks and paused time.
//!
//! The harness is here; the tests of routing, of passive health and of probing new
//! endpoints are in `routing.rs`, `health.rs` and `probe.rs`.

mod health;
mod probe;
mod retry;
mod routing;
mod strategy;

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
use gray_core::{Labelled, Labels, Lane, Stain, backoff::Backoff};
use gray_policy::{OnUnready, OwnedSubset, Policy, UnroutableReason};
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

// === the driver ===

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

#[test]
fn balance_and_its_future_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    fn assert_send<T: Send + 'static>() {}
    assert_send_sync::<Balance<&'static str, Endpoint>>();
    assert_send::<crate::future::BalanceFuture<Endpoint, Req>>();
    assert_send::<crate::Picked<&'static str, Endpoint>>();
    assert_send::<crate::Driver<Changes<Endpoint>>>();
    assert_send_sync::<BalanceLayer>();
}
