//! Retries: which failures are retried and where, the budget, the body cap, and that a
//! response is never retried.

use std::sync::Mutex;

use gray_core::unsent::Unsent;
use http_body_util::BodyExt;

use super::*;
use crate::{
    health::{Failure, classify},
    retry::{Copies, ReplayBody, Retry, RetryPolicy},
};

/// How a [`Scripted`] endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200.
    Ok,
    /// A response with this status.
    Status(u16),
    /// A refused connection, the request dropped (as tonic's channel does).
    Refuse,
    /// A refused connection, the request handed back (as gray-discovery's endpoints do).
    HandBack,
    /// The body is read, then the connection resets before the response head.
    Break,
}

/// What an endpoint received: its name, the method and the body.
type Log = Arc<Mutex<Vec<(&'static str, String, String)>>>;

#[derive(Clone)]
struct Scripted {
    name: &'static str,
    labels: Arc<Labels>,
    answer: Arc<Mutex<Answer>>,
    log: Log,
}

impl Labelled for Scripted {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

type Body = ReplayBody<String>;

impl Service<http::Request<Body>> for Scripted {
    type Response = (&'static str, u16);
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(&'static str, u16), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let me = self.clone();
        let answer = *me.answer.lock().unwrap();
        Box::pin(async move {
            let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
            let unsent = |request| -> BoxError { Box::new(Unsent::new(request, refused())) };
            match answer {
                Answer::Refuse => return Err(refused().into()),
                Answer::HandBack => return Err(unsent(request)),
                _ => {}
            }
            let method = request.method().to_string();
            let body = request.into_body().collect().await?.to_bytes();
            let body = String::from_utf8_lossy(&body).into_owned();
            me.log.lock().unwrap().push((me.name, method, body));
            match answer {
                Answer::Status(status) => Ok((me.name, status)),
                Answer::Break => Err(io::Error::from(io::ErrorKind::ConnectionReset).into()),
                _ => Ok((me.name, 200)),
            }
        })
    }
}

struct Retrying {
    tx: Tx<Scripted>,
    retry: Retry<&'static str, Scripted>,
    log: Log,
}

impl Retrying {
    fn new(layer: BalanceLayer) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let balance = layer.with_pick(Pick::RoundRobin).build(Changes(rx));
        Retrying {
            tx,
            retry: Retry::new(balance),
            log: Log::default(),
        }
    }

    /// Adds an endpoint answering `answer`; returns its answer, to change it.
    fn add(&self, name: &'static str, gray: bool, answer: Answer) -> Arc<Mutex<Answer>> {
        let labels: &[(&str, &str)] = if gray { &[("gray", "true")] } else { &[] };
        let answer = Arc::new(Mutex::new(answer));
        let endpoint = Scripted {
            name,
            labels: Arc::new(Labels::from_iter(labels.iter().copied())),
            answer: answer.clone(),
            log: self.log.clone(),
        };
        self.tx.send(Ok(Change::Insert(name, endpoint))).unwrap();
        answer
    }

    fn balance(&self) -> &Balance<&'static str, Scripted> {
        self.retry.get_ref()
    }

    async fn send(
        &self,
        method: http::Method,
        body: &str,
        gray: bool,
    ) -> Result<(&'static str, u16), BoxError> {
        let mut request = http::Request::new(body.to_owned());
        *request.method_mut() = method;
        if gray {
            request
                .extensions_mut()
                .insert(Stain::in_lane(Lane::new("gray").unwrap()));
        }
        self.retry.clone().oneshot(request).await
    }

    /// The endpoints that received a request, in order.
    fn received(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().iter().map(|(n, ..)| *n).collect()
    }
}

fn no_ejection() -> BalanceLayer {
    BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(Ejection::disabled())
}

#[tokio::test(start_paused = true)]
async fn a_refused_request_goes_to_another_endpoint_of_the_same_walk() {
    // Seed 000 falls back from gray to baseline: the gray request that its only gray
    // instance refused goes to baseline.
    let r = Retrying::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    r.add("g1", true, Answer::HandBack);
    r.add("b1", false, Answer::Ok);
    settle(|| r.balance().len() == 2).await;
    let served = r.send(http::Method::POST, "order-1", true).await.unwrap();
    assert_eq!(served, ("b1", 200));
    assert_eq!(
        r.log.lock().unwrap()[0],
        ("b1", "POST".into(), "order-1".into())
    );
    let stats = r.balance().retries();
    assert_eq!((stats.refused, stats.total()), (1, 1), "{stats:?}");
    // The refused one is out: the next gray request falls back at once.
    settle(|| r.balance().ready_len() == 1).await;
    assert_eq!(
        r.send(http::Method::POST, "order-2", true).await.unwrap().0,
        "b1"
    );
    assert_eq!(r.balance().retries().total(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_unsent_is_retried_only_from_a_copy() {
    for (copies, method, retried) in [
        // Not idempotent, not copied: the endpoint dropped it, nothing to send again.
        (Copies::Idempotent, http::Method::POST, false),
        // Idempotent: copied.
        (Copies::Idempotent, http::Method::GET, true),
        // Every request copied (for endpoints such as tonic's channel).
        (Copies::All, http::Method::POST, true),
    ] {
        let policy = RetryPolicy::new().with_copies(copies);
        let r = Retrying::new(no_ejection().with_retry(policy));
        r.add("b1", false, Answer::Refuse);
        r.add("b2", false, Answer::Ok);
        settle(|| r.balance().len() == 2).await;
        // Round-robin starts at b1: refused.
        let answer = r.send(method.clone(), "x", false).await;
        assert_eq!(answer.is_ok(), retried, "{copies:?} {method}: {answer:?}");
        if retried {
            assert_eq!(answer.unwrap().0, "b2");
            assert_eq!(r.log.lock().unwrap()[0].2, "x", "the copy's body");
            assert_eq!(r.balance().retries().refused, 1);
        } else {
            assert_eq!(r.balance().retries().total(), 0);
            assert!(r.received().is_empty());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_broken_connection_retries_idempotent_requests_once() {
    let r = Retrying::new(no_ejection());
    r.add("b1", false, Answer::Break);
    let b2 = r.add("b2", false, Answer::Break);
    settle(|| r.balance().len() == 2).await;
    // GET: b1 breaks, the retry goes to b2, which breaks too: once only, it fails.
    let err = r.send(http::Method::GET, "", false).await.unwrap_err();
    assert_eq!(classify(&*err), Failure::Broken, "{err}");
    assert_eq!(r.received(), ["b1", "b2"]);
    assert_eq!(r.balance().retries().broken, 1);
    // POST: sent, maybe processed: never sent again.
    r.log.lock().unwrap().clear();
    for _ in 0..2 {
        assert!(r.send(http::Method::POST, "p", false).await.is_err());
    }
    assert_eq!(r.received().len(), 2, "one attempt each");
    assert_eq!(r.balance().retries().broken, 1);
    // PUT with a body: b1 read it and broke; b2 gets the same bytes, from the buffer.
    *b2.lock().unwrap() = Answer::Ok;
    let mut retried = None;
    for _ in 0..2 {
        r.log.lock().unwrap().clear();
        let served = r.send(http::Method::PUT, "the body", false).await.unwrap();
        assert_eq!(served.0, "b2");
        if r.received().len() == 2 {
            retried = Some(r.log.lock().unwrap().clone());
        }
    }
    let log = retried.expect("one of two PUTs went to b1 first");
    assert_eq!(log[0], ("b1", "PUT".into(), "the body".into()));
    assert_eq!(
        log[1],
        ("b2", "PUT".into(), "the body".into()),
        "replayed whole"
    );
}

#[tokio::test(start_paused = true)]
async fn a_response_is_never_retried() {
    let r = Retrying::new(no_ejection());
    r.add("b1", false, Answer::Status(503));
    r.add("b2", false, Answer::Status(503));
    settle(|| r.balance().len() == 2).await;
    for _ in 0..4 {
        let (_, status) = r.send(http::Method::GET, "", false).await.unwrap();
        assert_eq!(status, 503);
    }
    assert_eq!(r.received().len(), 4, "one attempt per request");
    assert_eq!(r.balance().retries(), Default::default());
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_cap_is_not_sent_again() {
    let policy = RetryPolicy::new().with_max_replay_bytes(8);
    let r = Retrying::new(no_ejection().with_retry(policy));
    r.add("b1", false, Answer::Break);
    r.add("b2", false, Answer::Ok);
    settle(|| r.balance().len() == 2).await;
    // Round-robin: b1 first, it breaks. 9 bytes: over the cap, not sent again.
    let err = r
        .send(http::Method::PUT, "123456789", false)
        .await
        .unwrap_err();
    assert_eq!(classify(&*err), Failure::Broken);
    assert_eq!(r.received(), ["b1"]);
    let _ = r.send(http::Method::PUT, "b2 first", false).await.unwrap();
    // b1 again, 8 bytes: under the cap, sent again to b2.
    r.log.lock().unwrap().clear();
    let served = r.send(http::Method::PUT, "12345678", false).await.unwrap();
    assert_eq!(served.0, "b2");
    assert_eq!(r.received(), ["b1", "b2"]);
}

#[tokio::test(start_paused = true)]
async fn the_budget_bounds_the_load_on_a_sick_service() {
    // Every instance breaks every connection. 20 % of the requests may be retried, no
    // floor: 5,000 requests over 10 s make at most 6,000 attempts.
    let policy = RetryPolicy::new()
        .with_budget_percent(20)
        .with_min_per_second(0);
    let r = Retrying::new(no_ejection().with_retry(policy));
    for name in ["b1", "b2", "b3"] {
        r.add(name, false, Answer::Break);
    }
    settle(|| r.balance().len() == 3).await;
    let requests = 5_000;
    for i in 0..requests {
        assert!(r.send(http::Method::GET, "", false).await.is_err());
        if i % 500 == 499 {
            tokio::time::advance(Duration::from_secs(1)).await;
        }
    }
    let attempts = r.received().len();
    let stats = r.balance().retries();
    assert!(
        attempts <= requests * 12 / 10,
        "{attempts} attempts for {requests} requests: {stats:?}"
    );
    // Without a budget every request would have been tried twice: the budget, not the
    // policy, held them back.
    assert!(attempts >= requests * 115 / 100, "{attempts}: {stats:?}");
    assert!(stats.budget_exhausted > 0);
    assert_eq!(stats.broken as usize, attempts - requests);
}
