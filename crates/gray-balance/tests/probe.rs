//! Re-admission through probes, against real sockets on loopback: an ejected endpoint
//! stays out while its probe fails, and comes back when it passes, without a request of
//! a user spent on it.

use std::{
    convert::Infallible,
    future::{Ready, ready},
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use gray_balance::{
    Balance, BalanceLayer, Pick,
    health::{Ejection, Probe},
    retry::RetryPolicy,
};
use gray_core::{Labelled, Labels, Origin, backoff::Backoff};
use gray_policy::Policy;
use gray_test_support::{WAIT, net};
use http::uri::{Authority, Scheme};
use tokio::{io::AsyncWriteExt, net::TcpSocket};
use tower::{Service, ServiceExt, discover::Change};

/// An endpoint at a loopback address that counts the requests it gets; one that is
/// `down` refuses them, as a dead instance's connector would.
#[derive(Clone)]
struct Endpoint {
    authority: Authority,
    labels: Labels,
    down: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Labelled for Endpoint {
    fn labels(&self) -> &Labels {
        &self.labels
    }

    fn origin(&self) -> Option<&dyn Origin> {
        Some(self)
    }
}

impl Origin for Endpoint {
    fn scheme(&self) -> &Scheme {
        &Scheme::HTTP
    }

    fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl Service<http::Request<()>> for Endpoint {
    type Response = ();
    type Error = io::Error;
    type Future = Ready<Result<(), io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.down.load(Ordering::SeqCst) {
            true => ready(Err(io::ErrorKind::ConnectionRefused.into())),
            false => ready(Ok(())),
        }
    }
}

fn endpoint(addr: SocketAddr, down: bool) -> Endpoint {
    Endpoint {
        authority: addr.to_string().parse().unwrap(),
        labels: Labels::new(),
        down: Arc::new(AtomicBool::new(down)),
        calls: Arc::default(),
    }
}

/// A balancer over `first` and `second` (round-robin, first first), ejecting for 50 ms
/// at a time, probing with `probe`.
fn balancer(first: &Endpoint, second: &Endpoint, probe: Probe) -> Balance<u8, Endpoint> {
    let backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(50));
    let changes = [(1, first.clone()), (2, second.clone())]
        .map(|(k, e)| Ok::<_, Infallible>(Change::Insert(k, e)));
    BalanceLayer::new("svc", Policy::new())
        .with_pick(Pick::RoundRobin)
        .with_ejection(Ejection::new().with_backoff(backoff.without_jitter()))
        .with_probe(probe)
        .with_retry(RetryPolicy::disabled())
        .build(futures_util::stream::iter(changes))
}

/// Polls `check` every 5 ms until it holds, for at most [`WAIT`].
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ejects `dead` (which refuses): one request, which round-robin sends to it first.
async fn eject(balance: &Balance<u8, Endpoint>, dead: &Endpoint) {
    let err = balance
        .clone()
        .oneshot(http::Request::new(()))
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<io::Error>().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionRefused)
    );
    assert_eq!(dead.calls.load(Ordering::SeqCst), 1);
    until("the refused endpoint is ejected", || {
        balance.ready_len() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_probe_brings_an_instance_back_once_it_listens() {
    // Bound, not listening: connections to it are refused.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let dead = endpoint(socket.local_addr().unwrap(), true);
    let other = net::closed_port();
    let alive = endpoint(other.addr(), false);
    let balance = balancer(&dead, &alive, Probe::connect());
    eject(&balance, &dead).await;

    // Every request goes to the other one meanwhile; its probes (every 50 ms) fail.
    for _ in 0..10 {
        balance
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .unwrap();
    }
    assert_eq!(alive.calls.load(Ordering::SeqCst), 10);
    assert_eq!(balance.ready_len(), 1);

    // It listens: its next probe brings it back, and no request was spent on it.
    dead.down.store(false, Ordering::SeqCst);
    let _listener = socket.listen(16).unwrap();
    until("the recovered endpoint is readmitted", || {
        balance.ready_len() == 2
    })
    .await;
    assert_eq!(
        dead.calls.load(Ordering::SeqCst),
        1,
        "no user request probed it"
    );
    // And it serves again.
    for _ in 0..4 {
        balance
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .unwrap();
    }
    assert!(dead.calls.load(Ordering::SeqCst) > 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_probe_keeps_an_unhealthy_instance_out_until_it_answers_2xx() {
    // The instance listens, but its health check fails until told otherwise.
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let (addr, probes) = net::serve(move |mut stream| {
        let healthy = flag.load(Ordering::SeqCst);
        async move {
            if net::read_head(&mut stream).await {
                let answer: &[u8] = match healthy {
                    true => b"HTTP/1.1 204 No Content\r\n\r\n",
                    false => b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
                };
                let _ = stream.write_all(answer).await;
            }
        }
    })
    .await;
    let dead = endpoint(addr, true);
    let other = net::closed_port();
    let alive = endpoint(other.addr(), false);
    let balance = balancer(&dead, &alive, Probe::http("/healthz"));
    eject(&balance, &dead).await;

    // Three probes answered 503: still out, and no request reached it.
    until("three probes", || probes.load(Ordering::SeqCst) >= 3).await;
    assert_eq!(balance.ready_len(), 1);
    assert_eq!(dead.calls.load(Ordering::SeqCst), 1);

    dead.down.store(false, Ordering::SeqCst);
    healthy.store(true, Ordering::SeqCst);
    until("the healthy endpoint is readmitted", || {
        balance.ready_len() == 2
    })
    .await;
    assert_eq!(
        dead.calls.load(Ordering::SeqCst),
        1,
        "no user request probed it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_probe_a_request_finds_out() {
    // The behaviour before probes: back after the backoff, and the next request that
    // fits it is refused again.
    let gone = net::closed_port();
    let dead = endpoint(gone.addr(), true);
    let other = net::closed_port();
    let alive = endpoint(other.addr(), false);
    let balance = balancer(&dead, &alive, Probe::disabled());
    eject(&balance, &dead).await;
    until("readmitted without a probe", || balance.ready_len() == 2).await;
    let mut refused = 0;
    for _ in 0..2 {
        if balance
            .clone()
            .oneshot(http::Request::new(()))
            .await
            .is_err()
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 1, "a user's request was spent on it");
}
