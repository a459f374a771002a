//! What a misbehaving client of a proxy costs the endpoint's pool, against real loopback
//! servers: requests dropped before their answer (a client that resets its streams) cost no
//! connections beyond the capped connects; a slow upload is not cut by the response
//! timeout while it moves, and a stalled one is.

mod support;

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::pin,
    sync::{Arc, atomic::AtomicUsize, atomic::Ordering},
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use gray_discovery::http::HttpEndpoints;
use gray_test_support::net::serve;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tower::{Service, ServiceExt};

/// A server that reads the request body, answers with its length, and counts the
/// connections it accepts.
async fn counting_server() -> (SocketAddr, Arc<AtomicUsize>) {
    serve(|stream| async move {
        let service = service_fn(|req: Request<hyper::body::Incoming>| async {
            let body = req.into_body().collect().await?.to_bytes();
            let answer = if body.is_empty() {
                "ok".to_owned()
            } else {
                body.len().to_string()
            };
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(answer))))
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

/// A body of `chunks` one-byte frames, one every `every`, then (if `stall`) no end.
fn trickle(chunks: usize, every: Duration, stall: bool) -> BoxBody<Bytes, Infallible> {
    let frames = futures_util::stream::unfold(0, move |n| async move {
        if n == chunks {
            if stall {
                std::future::pending::<()>().await;
            }
            return None;
        }
        tokio::time::sleep(every).await;
        Some((Ok(Frame::data(Bytes::from_static(b"x"))), n + 1))
    });
    BodyExt::boxed(StreamBody::new(frames))
}

#[tokio::test]
async fn a_moving_upload_outlasts_the_response_timeout_and_a_stalled_one_does_not() {
    let (addr, _) = counting_server().await;
    let endpoint = HttpEndpoints::<_, BoxBody<Bytes, Infallible>>::new()
        .with_response_timeout(Duration::from_millis(300))
        .endpoint(support::instance("one", addr, &[]));
    // 20 frames, 50 ms apart: a second in all, more than three times the timeout.
    let upload = Request::post("/").body(trickle(20, Duration::from_millis(50), false));
    let response = endpoint.clone().oneshot(upload.unwrap()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "20");

    let stalled = Request::post("/").body(trickle(2, Duration::from_millis(50), true));
    let error = tokio::time::timeout(gray_test_support::WAIT, endpoint.oneshot(stalled.unwrap()))
        .await
        .expect("a stalled upload ends")
        .unwrap_err();
    let error = error.downcast_ref::<gray_discovery::http::RequestError>();
    assert!(error.is_some_and(|e| e.is_timeout()), "{error:?}");
}
