//! Requests dropped before their answer (a client that resets its streams) cost no
//! connections beyond the capped connects: against a real loopback server that counts the
//! connections it accepts.

mod support;

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::pin,
    sync::{Arc, atomic::AtomicUsize, atomic::Ordering},
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use gray_discovery::http::HttpEndpoints;
use gray_test_support::net::serve;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tower::{Service, ServiceExt};

/// A server that answers `ok` and counts the connections it accepts.
async fn counting_server() -> (SocketAddr, Arc<AtomicUsize>) {
    serve(|stream| async move {
        let service = service_fn(|_: Request<hyper::body::Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    })
    .await
}

fn get() -> Request<Full<Bytes>> {
    Request::get("/").body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn requests_dropped_while_connecting_leave_their_connections_idle() {
    let (addr, accepted) = counting_server().await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_max_connects_per_instance(2)
        .endpoint(support::instance("one", addr, &[]));
    // 200 requests each start connecting (one poll: the TCP connect is under way), then are
    // dropped, as a proxy drops the requests of streams its client resets.
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..200 {
        let mut endpoint = endpoint.clone();
        let mut call = pin!(endpoint.call(get()));
        assert!(matches!(call.as_mut().poll(&mut cx), Poll::Pending));
    }
    // The two connects that ran finish in the background; later requests use their
    // connections.
    for _ in 0..20 {
        let response = endpoint.clone().oneshot(get()).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
    }
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&opened),
        "200 cancelled requests and 20 sequential ones opened {opened} connections; \
         at most the 2 capped connects (and one more if a request came before they were idle)"
    );
}

#[tokio::test]
async fn a_burst_is_served_by_the_capped_connects_in_order() {
    let (addr, accepted) = counting_server().await;
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new()
        .with_max_connects_per_instance(2)
        .endpoint(support::instance("one", addr, &[]));
    let responses =
        futures_util::future::join_all((0..50).map(|_| endpoint.clone().oneshot(get()))).await;
    for response in responses {
        let body = response.unwrap().into_body().collect().await.unwrap();
        assert_eq!(body.to_bytes(), "ok");
    }
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=50).contains(&opened),
        "50 requests at once opened {opened} connections"
    );
}
