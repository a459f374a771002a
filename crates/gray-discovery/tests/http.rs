//! Instances as HTTP client services, against real loopback servers.

mod support;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures_util::StreamExt;
use gray_core::{Labelled, unsent::Unsent};
use gray_discovery::{
    Instance, StaticDiscover,
    http::{HttpEndpoints, RequestError, ResponseBody},
};
use gray_test_support::{
    WAIT,
    net::{OK, answers_early, closed_port, is_refused, read_head, serve},
};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tower::{ServiceExt, discover::Change};

/// A server that answers `NAME PATH?QUERY host=HOST`.
async fn server(name: &'static str) -> SocketAddr {
    let (addr, _) = serve(move |stream| async move {
        let service = service_fn(move |req: Request<hyper::body::Incoming>| async move {
            let host = req
                .headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let body = format!("{name} {} host={host}", req.uri());
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
        });
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    })
    .await;
    addr
}

#[tokio::test]
async fn endpoints_send_to_their_instance_and_carry_its_labels() {
    let (one, two) = (server("one").await, server("two").await);
    let instances = StaticDiscover::new([
        instance(one),
        support::instance("two", format!("http://{two}"), &[("gray", "true")]),
    ]);
    let endpoints = HttpEndpoints::<_, Full<Bytes>>::new();
    let mut discover = endpoints.discover(instances);
    let mut seen = Vec::new();
    while let Some(change) = discover.next().await {
        let Change::Insert(id, endpoint) = change.unwrap() else {
            panic!("a static list only inserts")
        };
        assert_eq!(endpoint.instance().id(), &id);
        // The request names only a path; the endpoint supplies scheme and authority.
        let request = Request::get("/hello?x=1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = endpoint.clone().oneshot(request).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let addr = endpoint.instance().address().authority().to_string();
        assert_eq!(body, format!("{id} /hello?x=1 host={addr}"));
        seen.push((
            id.to_string(),
            endpoint.labels().get("gray").map(str::to_owned),
        ));
    }
    assert_eq!(
        seen,
        [
            ("one".to_owned(), None),
            ("two".to_owned(), Some("true".to_owned()))
        ]
    );

    // An absolute URI from the caller is redirected to the instance as well.
    let endpoint = endpoints.endpoint(instance(one));
    let request = Request::get("http://elsewhere.invalid/x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = endpoint.oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, format!("one /x host={one}"));
}

#[tokio::test]
async fn an_unreachable_instance_is_an_error() {
    let closed = closed_port();
    let addr = closed.addr();
    let endpoint =
        HttpEndpoints::<_, Full<Bytes>>::new().endpoint(support::instance("gone", addr, &[]));
    let request = Request::post("/orders")
        .body(Full::new(Bytes::from_static(b"order")))
        .unwrap();
    let err = endpoint.oneshot(request).await.unwrap_err();
    // The error names the instance, says the connection failed, and keeps the cause.
    assert!(
        err.to_string()
            .starts_with(&format!("cannot connect to http://{addr}/")),
        "{err}"
    );
    let unsent = Unsent::find(&*err).expect("nothing was sent: the request comes back");
    let request_error = unsent
        .get_ref()
        .downcast_ref::<RequestError>()
        .expect("a RequestError");
    assert!(request_error.is_connect());
    assert!(
        is_refused(&*err),
        "the io::Error is in the source chain: {err:?}"
    );
    // As it was given: its body unread, no `Host` of the instance added.
    let back = unsent
        .take::<Request<Full<Bytes>>>()
        .expect("the request, once");
    assert_eq!(
        (back.method().as_str(), back.uri().path()),
        ("POST", "/orders")
    );
    assert!(back.headers().get(http::header::HOST).is_none());
    assert_eq!(
        back.into_body().collect().await.unwrap().to_bytes(),
        "order"
    );
}

/// A server that counts the connections it accepted and answers `/echo` with the request
/// body, `/stream` with 64 chunks of 16 KiB, `/wait/{ms}` with `ok` after that many
/// milliseconds, `/n/{n}` with its path (asking to close the connection when `n` is a
/// multiple of 10), anything else with `ok`. With `keep_alive` false it closes every
/// connection after one response.
async fn counting_server(keep_alive: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    serve(move |stream| async move {
        let service = service_fn(|req: Request<hyper::body::Incoming>| async move {
            let path = req.uri().path().to_owned();
            if let Some(ms) = path.strip_prefix("/wait/").and_then(|ms| ms.parse().ok()) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if let Some(n) = path.strip_prefix("/n/").and_then(|n| n.parse::<u64>().ok()) {
                let mut response = Response::new(BodyExt::boxed(
                    Full::new(Bytes::from(path)).map_err(|never| match never {}),
                ));
                if n % 10 == 0 {
                    response
                        .headers_mut()
                        .insert(http::header::CONNECTION, "close".parse().unwrap());
                }
                return Ok::<_, Infallible>(response);
            }
            let body: BoxBody<Bytes, hyper::Error> = match req.uri().path() {
                "/echo" => req.into_body().boxed(),
                "/stream" => BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                    (0..64).map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; 16 * 1024])))),
                ))),
                _ => Full::new(Bytes::from_static(b"ok"))
                    .map_err(|never| match never {})
                    .boxed(),
            };
            Ok::<_, Infallible>(Response::new(body))
        });
        let _ = http1::Builder::new()
            .keep_alive(keep_alive)
            .serve_connection(TokioIo::new(stream), service)
            .await;
    })
    .await
}

fn instance(addr: SocketAddr) -> Instance {
    support::instance("one", addr, &[])
}

fn get(path: &str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::new(Bytes::new())).unwrap()
}

async fn read(response: http::Response<ResponseBody>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn connections_are_reused_once_the_body_is_read() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(instance(addr));
    for _ in 0..20 {
        let response = endpoint.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(read(response).await, "ok");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "sequential requests share one connection"
    );

    // Eight at once need eight connections; afterwards they are all idle and reused.
    let responses =
        futures_util::future::join_all((0..8).map(|_| endpoint.clone().oneshot(get("/")))).await;
    for response in responses {
        assert_eq!(read(response.unwrap()).await, "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 8);
    for _ in 0..8 {
        let response = endpoint.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(read(response).await, "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 8);
}

#[tokio::test]
async fn bodies_stream_both_ways_and_the_connection_is_reused_after() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, BoxBody<Bytes, Infallible>>::new().endpoint(instance(addr));
    // A 1 MiB request body in 64 chunks, echoed back.
    let chunks =
        (0..64u8).map(|i| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![i; 16 * 1024]))));
    let request = Request::post("/echo")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            chunks,
        ))))
        .unwrap();
    let echoed = read(endpoint.clone().oneshot(request).await.unwrap()).await;
    assert_eq!(echoed.len(), 64 * 16 * 1024);
    assert!(
        echoed
            .chunks(16 * 1024)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| b == i as u8))
    );

    let request = Request::get("/stream")
        .body(Empty::new().map_err(|never| match never {}).boxed())
        .unwrap();
    let streamed = read(endpoint.clone().oneshot(request).await.unwrap()).await;
    assert_eq!(streamed.len(), 64 * 16 * 1024);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_closes_its_connection() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(instance(addr));
    let response = endpoint.clone().oneshot(get("/stream")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    drop(body);
    // The half-read connection cannot carry another request: a new one is opened.
    let response = endpoint.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(read(response).await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn connections_the_instance_closes_are_replaced() {
    // `Connection: close` after every response.
    let (addr, accepted) = counting_server(false).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(instance(addr));
    for _ in 0..5 {
        let response = endpoint.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(read(response).await, "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 5);

    // An instance that closes idle keep-alive connections without saying so: the closed
    // connection is noticed when it is taken, and the request goes on a new one.
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (addr, served) = serve(move |mut stream| {
        let closed_tx = closed_tx.clone();
        async move {
            if read_head(&mut stream).await {
                let _ = stream.write_all(OK).await;
            }
            // Closed right after the response, keep-alive notwithstanding.
            drop(stream);
            let _ = closed_tx.send(());
        }
    })
    .await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(instance(addr));
    for _ in 0..3 {
        let response = endpoint.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(read(response).await, "ok");
        // The next request comes once the instance has closed the connection (on loopback,
        // its FIN reaches the client's socket within the close).
        tokio::time::timeout(WAIT, closed.recv())
            .await
            .expect("the instance closes the connection")
            .expect("the server runs");
    }
    assert_eq!(served.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn idle_limits_are_applied() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_max_idle_per_instance(0)
        .endpoint(instance(addr));
    for _ in 0..3 {
        let response = endpoint.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(read(response).await, "ok");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "no connection is kept idle"
    );

    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_idle_timeout(Duration::from_millis(20))
        .endpoint(instance(addr));
    let response = endpoint.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(read(response).await, "ok");
    // Idle past the timeout (the condition under test).
    tokio::time::sleep(Duration::from_millis(60)).await;
    let response = endpoint.clone().oneshot(get("/")).await.unwrap();
    assert_eq!(read(response).await, "ok");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "the stale connection was not reused"
    );
}

/// The idle connections of every instance share one budget: with room for two, of four
/// instances asked in turn, two keep theirs for the next request and two connect again.
#[tokio::test]
async fn the_idle_connections_of_all_instances_share_one_budget() {
    let endpoints = HttpEndpoints::<_, Full<Bytes>>::new().with_max_idle_total(2);
    let mut servers = Vec::new();
    for _ in 0..4 {
        let (addr, accepted) = counting_server(true).await;
        servers.push((endpoints.endpoint(instance(addr)), accepted));
    }
    for _round in 0..2 {
        for (endpoint, _) in &servers {
            let response = endpoint.clone().oneshot(get("/")).await.unwrap();
            assert_eq!(read(response).await, "ok");
        }
    }
    let accepted: Vec<usize> = servers
        .iter()
        .map(|(_, a)| a.load(Ordering::SeqCst))
        .collect();
    assert_eq!(accepted, [1, 1, 2, 2], "the first two kept theirs idle");
}

#[tokio::test]
async fn a_response_later_than_the_timeout_fails_and_closes_its_connection() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_response_timeout(Duration::from_millis(150))
        .endpoint(instance(addr));
    // Without the timeout this request would be answered, after 10 s.
    let err = endpoint
        .clone()
        .oneshot(get("/wait/10000"))
        .await
        .unwrap_err();
    let request_error = err.downcast_ref::<RequestError>().expect("a RequestError");
    assert!(request_error.is_timeout() && !request_error.is_connect());
    assert_eq!(
        err.to_string(),
        format!("no response from http://{addr}/ within 150ms")
    );
    // The connection carried the abandoned request: the next one opens another.
    let response = endpoint.clone().oneshot(get("/wait/0")).await.unwrap();
    assert_eq!(read(response).await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_timeout_counts_from_each_request_on_a_reused_connection() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_response_timeout(Duration::from_millis(1_000))
        .endpoint(instance(addr));
    for round in 0..4 {
        // Each answer takes 200 ms of a 1 s budget (800 ms to spare on a loaded machine),
        // and the connection idles longer than the timeout between some of them: a timer
        // left from an earlier request must neither fire early nor carry over. (The idle
        // time is the condition under test, not a wait for an event.)
        let response = endpoint.clone().oneshot(get("/wait/200")).await.unwrap();
        assert_eq!(read(response).await, "ok", "round {round}");
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(1_200)).await;
        }
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection served every request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_each_get_their_own_answer() {
    let (addr, accepted) = counting_server(true).await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(instance(addr));
    const REQUESTS: u64 = 3_000;
    let answered = futures_util::stream::iter(0..REQUESTS)
        .map(|n| {
            let endpoint = endpoint.clone();
            // Each request runs on its own task, so the two runtime threads share the
            // endpoint's connections.
            tokio::spawn(async move {
                let response = endpoint.oneshot(get(&format!("/n/{n}"))).await.unwrap();
                if n % 7 == 3 {
                    // Dropped unread: its connection is closed, not reused.
                    return None;
                }
                Some((n, read(response).await))
            })
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let mut checked = 0;
    for result in answered {
        if let Some((n, body)) = result.unwrap() {
            assert_eq!(body, format!("/n/{n}"));
            checked += 1;
        }
    }
    assert_eq!(checked, (0..REQUESTS).filter(|n| n % 7 != 3).count());
    // Connections end when the server closes them (1 in 10) or a body is dropped (1 in 7);
    // otherwise they are reused. Without reuse there would be one per request.
    let accepted = accepted.load(Ordering::SeqCst) as u64;
    let ended = REQUESTS / 10 + REQUESTS / 7 + 2;
    assert!(
        accepted <= ended + 64,
        "{accepted} connections for {REQUESTS} requests"
    );
}

/// A 10 MiB request body fed by a task, as a proxy's body is fed by its client; the
/// returned handle ends once the body was sent whole or dropped, never before.
fn upload() -> (BoxBody<Bytes, Infallible>, tokio::task::JoinHandle<usize>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let producer = tokio::spawn(async move {
        let mut sent = 0;
        for _ in 0..160 {
            if tx.send(Bytes::from(vec![b'x'; 64 * 1024])).await.is_err() {
                break;
            }
            sent += 1;
        }
        sent
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), rx))
    });
    (BodyExt::boxed(StreamBody::new(chunks)), producer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_response_never_leaves_its_request_waiting_for_other_traffic() {
    // Long enough for the response to be read before the close resets the connection.
    let (addr, accepted) = answers_early(Duration::from_millis(20)).await;
    let timeout = Duration::from_secs(5);
    let endpoint = HttpEndpoints::<_, BoxBody<Bytes, Infallible>>::new()
        .with_response_timeout(timeout)
        .endpoint(instance(addr));
    // Twenty uploads, one after the other, and no other traffic: each must end by itself
    // (its response or an error, and its body sent or dropped). A hang would take the
    // whole bound; twenty response timeouts would take 100 s.
    let bound = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    for i in 0..20 {
        let (body, producer) = upload();
        let request = Request::post("/upload").body(body).unwrap();
        let exchange = async {
            if let Ok(response) = endpoint.clone().oneshot(request).await
                && let Ok(body) = response.into_body().collect().await
            {
                assert_eq!(body.to_bytes(), "ok");
                answered += 1;
            }
            // The body is not left behind in an idle connection that nobody polls.
            producer.await.unwrap()
        };
        tokio::time::timeout_at(bound, exchange)
            .await
            .unwrap_or_else(|_| panic!("upload {i} still waiting"));
    }
    assert!(
        answered > 0,
        "the instance answers before the reset, most of the time"
    );
    // No connection was reused with a body still in flight on it.
    assert_eq!(accepted.load(Ordering::SeqCst), 20);
}
