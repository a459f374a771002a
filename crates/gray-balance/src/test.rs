//! Readiness, fallback and ejection, with `tower_test` mocks and paused time.

use std::{
    convert::Infallible,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures_util::Stream;
use gray_core::{
    Labelled, Labels, Lane, Policy, Stain,
    matching::{OnUnready, UnroutableReason},
};
use tokio::sync::mpsc;
use tower::{BoxError, discover::Change};
use tower_service::Service;
use tower_test::mock;

use crate::{Balance, BalanceLayer, Pick, error::Unroutable, health::Ejection};

type Req = http::Request<&'static str>;
type Handle = mock::Handle<Req, &'static str>;

/// A mock endpoint with labels.
struct Endpoint {
    mock: mock::Mock<Req, &'static str>,
    labels: Labels,
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
struct Changes(mpsc::UnboundedReceiver<Change<&'static str, Endpoint>>);

impl Stream for Changes {
    type Item = Result<Change<&'static str, Endpoint>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|c| c.map(Ok))
    }
}

struct Harness {
    tx: mpsc::UnboundedSender<Change<&'static str, Endpoint>>,
    svc: mock::Spawn<Balance<Changes, Req>>,
}

impl Harness {
    fn new(layer: BalanceLayer<Req>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Harness {
            tx,
            svc: mock::Spawn::new(layer.build(Changes(rx))),
        }
    }

    /// Adds an endpoint; returns its mock handle, with no readiness granted yet.
    fn add(&self, key: &'static str, labels: &[(&str, &str)]) -> Handle {
        let (mock, mut handle) = mock::pair();
        handle.allow(0);
        let labels = Labels::from_iter(labels.iter().copied());
        self.tx
            .send(Change::Insert(key, Endpoint { mock, labels }))
            .expect("balancer alive");
        handle
    }

    fn remove(&self, key: &'static str) {
        self.tx.send(Change::Remove(key)).expect("balancer alive");
    }
}

fn gray_req() -> Req {
    let mut req = http::Request::new("hi");
    req.extensions_mut()
        .insert(Stain::in_lane(Lane::new("gray").unwrap()));
    req
}

fn base_req() -> Req {
    let mut req = http::Request::new("hi");
    req.extensions_mut().insert(Stain::baseline());
    req
}

/// The next request the endpoint received, which must have body `hi`.
async fn next(handle: &mut Handle) -> mock::SendResponse<&'static str> {
    let (req, send) = handle.next_request().await.expect("a request");
    assert_eq!(*req.body(), "hi");
    send
}

fn unroutable(err: BoxError) -> Unroutable {
    match err.downcast::<Unroutable>() {
        Ok(e) => *e,
        Err(other) => panic!("expected Unroutable, got {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn pending_until_an_endpoint_is_ready() {
    let mut h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    assert!(h.svc.poll_ready().is_pending(), "no endpoint yet");

    let mut base = h.add("b1", &[]);
    assert!(h.svc.poll_ready().is_pending(), "endpoint not ready");
    assert_eq!(h.svc.get_ref().len(), 1);
    assert_eq!(h.svc.get_ref().ready_len(), 0);

    base.allow(1);
    assert!(
        h.svc.is_woken(),
        "an endpoint becoming ready wakes the balancer"
    );
    assert!(h.svc.poll_ready().is_ready());
    assert_eq!(h.svc.get_ref().ready_len(), 1);

    let fut = h.svc.call(base_req());
    next(&mut base).await.send_response("b1");
    assert_eq!(fut.await.unwrap(), "b1");

    // The endpoint was called: it is not ready until polled again, and it granted no
    // more readiness, so the balancer is pending.
    assert_eq!(h.svc.get_ref().ready_len(), 0);
    assert!(h.svc.poll_ready().is_pending());
    base.allow(1);
    assert!(h.svc.poll_ready().is_ready());
}

#[tokio::test(start_paused = true)]
async fn gray_goes_to_gray_and_baseline_never_does() {
    let mut h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let mut base = h.add("b1", &[("gray", "false")]);
    let mut gray = h.add("g1", &[("gray", "TRUE")]);
    base.allow(10);
    gray.allow(10);
    assert!(h.svc.poll_ready().is_ready());

    let fut = h.svc.call(gray_req());
    next(&mut gray).await.send_response("g1");
    assert_eq!(fut.await.unwrap(), "g1");

    assert!(h.svc.poll_ready().is_ready());
    let fut = h.svc.call(base_req());
    next(&mut base).await.send_response("b1");
    assert_eq!(fut.await.unwrap(), "b1");

    // No baseline instance left: seed 000 refuses to send baseline traffic to gray.
    h.remove("b1");
    assert!(h.svc.poll_ready().is_ready());
    let err = unroutable(h.svc.call(base_req()).await.unwrap_err());
    assert_eq!(err.reason(), &UnroutableReason::NoMatch);
    assert_eq!(err.service(), "svc-b");
    assert_eq!(err.policy(), "seed-000");
    assert_eq!(err.lane(), None);
}

#[tokio::test(start_paused = true)]
async fn matched_subset_unready_fails_or_falls_back() {
    for on_unready in [OnUnready::Fail, OnUnready::Fallback] {
        let policy = Policy::seed_000().with_on_unready(on_unready);
        let mut h = Harness::new(BalanceLayer::new("svc-b", policy));
        let mut base = h.add("b1", &[]);
        let _gray = h.add("g1", &[("gray", "true")]); // never ready
        base.allow(10);
        assert!(h.svc.poll_ready().is_ready(), "one endpoint is ready");

        let fut = h.svc.call(gray_req());
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
                next(&mut base).await.send_response("b1");
                assert_eq!(fut.await.unwrap(), "b1");
            }
            _ => unreachable!("only the two settings above are tried"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn task_local_then_own_lane() {
    let policy = Policy::seed_000().with_own_lane(Some(Lane::new("gray").unwrap()));
    let mut h = Harness::new(BalanceLayer::new("svc-b", policy));
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(10);
    gray.allow(10);

    // No extension, no task-local: the calling instance's own lane (gray).
    assert!(h.svc.poll_ready().is_ready());
    let fut = h.svc.call(http::Request::new("hi"));
    next(&mut gray).await.send_response("g1");
    assert_eq!(fut.await.unwrap(), "g1");

    // A task-local baseline context wins over the own lane.
    assert!(h.svc.poll_ready().is_ready());
    let fut =
        gray_core::task::sync_scope(Stain::baseline(), || h.svc.call(http::Request::new("hi")));
    next(&mut base).await.send_response("b1");
    assert_eq!(fut.await.unwrap(), "b1");

    // The extension wins over the task-local.
    assert!(h.svc.poll_ready().is_ready());
    let fut = gray_core::task::sync_scope(Stain::baseline(), || h.svc.call(gray_req()));
    next(&mut gray).await.send_response("g1");
    assert_eq!(fut.await.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn failing_endpoint_is_removed() {
    let mut h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    let mut a = h.add("a", &[]);
    let mut b = h.add("b", &[]);
    a.allow(1);
    b.send_error("broken");
    assert!(h.svc.poll_ready().is_ready());
    assert_eq!(
        h.svc.get_ref().len(),
        1,
        "the endpoint that failed poll_ready is gone"
    );
    let fut = h.svc.call(base_req());
    next(&mut a).await.send_response("a");
    assert_eq!(fut.await.unwrap(), "a");
}

#[tokio::test(start_paused = true)]
async fn connection_errors_eject_with_growing_backoff() {
    let ejection = Ejection {
        consecutive: 2,
        base: Duration::from_secs(1),
        max: Duration::from_secs(10),
    };
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection);
    let mut h = Harness::new(layer);
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(100);
    gray.allow(100);

    let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
    for _ in 0..2 {
        assert!(h.svc.poll_ready().is_ready());
        let fut = h.svc.call(gray_req());
        next(&mut gray).await.send_error(refused());
        assert!(fut.await.is_err());
    }

    // Two connection errors in a row: g1 is ejected when next considered, so the gray
    // request falls back to baseline.
    let route = |h: &mut Harness| {
        assert!(h.svc.poll_ready().is_ready());
        h.svc.call(gray_req())
    };
    let fut = route(&mut h);
    next(&mut base).await.send_response("b1");
    assert_eq!(fut.await.unwrap(), "b1");
    let gray_ctx = Stain::in_lane(Lane::new("gray").unwrap());
    assert!(
        h.svc.poll_ready().is_ready(),
        "explain reports as of the last poll_ready"
    );
    let explained = h.svc.get_ref().explain(Some(&gray_ctx));
    assert!(explained.fallback_taken());
    assert_eq!(explained.candidates().unwrap(), ["b1"]);

    // After the first backoff (1 s), g1 is back.
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(
        h.svc.is_woken(),
        "the end of an ejection wakes the balancer"
    );
    let fut = route(&mut h);
    let send = next(&mut gray).await;
    send.send_error(refused());
    assert!(fut.await.is_err());
    let fut = route(&mut h);
    let send = next(&mut gray).await;
    send.send_error(refused());
    assert!(fut.await.is_err());

    // Ejected again, now for 2 s: still out after 1.5 s.
    let fut = route(&mut h);
    next(&mut base).await.send_response("b1");
    fut.await.unwrap();
    tokio::time::advance(Duration::from_millis(1500)).await;
    let fut = route(&mut h);
    next(&mut base).await.send_response("b1");
    fut.await.unwrap();
    tokio::time::advance(Duration::from_millis(600)).await;
    let fut = route(&mut h);
    next(&mut gray).await.send_response("g1");
    assert_eq!(fut.await.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn other_errors_do_not_eject() {
    let ejection = Ejection {
        consecutive: 1,
        ..Ejection::default()
    };
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection);
    let mut h = Harness::new(layer);
    let mut gray = h.add("g1", &[("gray", "true")]);
    gray.allow(100);
    for _ in 0..3 {
        assert!(h.svc.poll_ready().is_ready());
        let fut = h.svc.call(gray_req());
        let send = next(&mut gray).await;
        send.send_error(io::Error::from(io::ErrorKind::InvalidData));
        assert!(fut.await.is_err());
    }
    assert!(h.svc.poll_ready().is_ready());
    let fut = h.svc.call(gray_req());
    next(&mut gray).await.send_response("g1");
    assert_eq!(fut.await.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn all_ejected_is_pending_until_the_backoff_ends() {
    let ejection = Ejection {
        consecutive: 1,
        base: Duration::from_secs(5),
        max: Duration::from_secs(5),
    };
    let layer = BalanceLayer::new("svc-b", Policy::new())
        .with_ejection(ejection)
        .with_pick(Pick::RoundRobin);
    let mut h = Harness::new(layer);
    let mut only = h.add("b1", &[]);
    only.allow(100);
    assert!(h.svc.poll_ready().is_ready());
    let fut = h.svc.call(base_req());
    let send = next(&mut only).await;
    send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));
    assert!(fut.await.is_err());

    // Readiness comes back (the endpoint is polled ready), then the pick ejects it.
    assert!(
        h.svc.poll_ready().is_pending(),
        "ejected at the readiness check"
    );
    let err = unroutable(h.svc.call(base_req()).await.unwrap_err());
    assert_eq!(
        err.reason(),
        &UnroutableReason::NoMatch,
        "ejected counts as absent"
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(h.svc.is_woken());
    assert!(h.svc.poll_ready().is_ready());
}

#[test]
fn balance_and_its_future_are_send_for_buffer() {
    // `tower::buffer::Buffer` moves the balancer to its worker task.
    fn assert_send<T: Send + 'static>() {}
    assert_send::<Balance<Changes, Req>>();
    assert_send::<crate::future::ResponseFuture<mock::future::ResponseFuture<&'static str>>>();
    assert_send::<BalanceLayer<Req>>();
}

#[tokio::test]
async fn routed_is_recorded_only_when_asked() {
    use std::{
        convert::Infallible,
        future::{Ready, ready},
        task::{Context, Poll},
    };

    use gray_core::{Labelled, Labels, Lane, Policy, Stain, matching::OwnedSubset};
    use tower::{Layer, Service, ServiceExt, discover::Change};

    use crate::{BalanceLayer, RecordRouted, Routed};

    /// Answers with the `Routed` its request carried.
    struct Echo(Labels);
    impl Labelled for Echo {
        fn labels(&self) -> &Labels {
            &self.0
        }
    }
    impl Service<http::Request<()>> for Echo {
        type Response = Option<Routed>;
        type Error = Infallible;
        type Future = Ready<Result<Option<Routed>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            ready(Ok(req.extensions().get::<Routed>().cloned()))
        }
    }
    let endpoints = || {
        futures_util::stream::iter([Ok::<_, Infallible>(Change::Insert(1, Echo(Labels::new())))])
    };
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let request = || {
        let mut req = http::Request::new(());
        req.extensions_mut().insert(gray.clone());
        req
    };
    let policy = Policy::seed_000();

    let mut plain = BalanceLayer::new("svc", policy.clone()).layer(endpoints());
    assert_eq!(
        plain.ready().await.unwrap().call(request()).await.unwrap(),
        None
    );

    let baseline_request = || http::Request::new(());
    for record in [RecordRouted::Always, RecordRouted::Fallbacks] {
        let mut recording = BalanceLayer::new("svc", policy.clone())
            .with_routed(record)
            .layer(endpoints());
        let routed = recording
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap()
            .expect("recorded");
        assert_eq!(routed.subset(), &OwnedSubset::Baseline);
        assert!(
            routed.fallback(),
            "a gray request served by baseline is a fallback"
        );
        // A baseline request served by baseline took no fallback.
        let routed = recording
            .ready()
            .await
            .unwrap()
            .call(baseline_request())
            .await
            .unwrap();
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
