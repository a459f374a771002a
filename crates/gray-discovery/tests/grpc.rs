//! Instances as tonic channels (feature `tonic`), against real HTTP/2 servers on loopback.

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
use gray_core::{Labelled, Origin};
use gray_discovery::{Registry, grpc::GrpcChannels};
use gray_test_support::net::{closed_port, is_refused, serve};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::{server::conn::http2, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::instance;
use tower::{ServiceExt, discover::Change};

/// An HTTP/2 server that answers `NAME PATH VERSION` and counts its connections.
async fn server(name: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    serve(move |stream| async move {
        let service = service_fn(move |req: Request<hyper::body::Incoming>| async move {
            let body = format!("{name} {} {:?}", req.uri().path(), req.version());
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
        });
        let _ = http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service)
            .await;
    })
    .await
}

fn call(path: &'static str) -> Request<tonic::body::Body> {
    Request::post(path)
        .header("content-type", "application/grpc")
        .body(tonic::body::Body::empty())
        .unwrap()
}

#[tokio::test]
async fn one_lazy_http2_channel_per_instance() {
    let (base, base_accepted) = server("base").await;
    let (gray, gray_accepted) = server("gray").await;
    let registry = Registry::from_static([(
        "stock",
        [
            instance("base", base, &[]),
            instance("gray", gray, &[("gray", "true")]),
        ],
    )])
    .unwrap();
    let channels =
        GrpcChannels::new().with_endpoint(|endpoint| endpoint.timeout(Duration::from_secs(5)));
    let mut endpoints = registry.service("stock").unwrap().endpoints(channels);

    let mut made = Vec::new();
    for _ in 0..2 {
        let Some(Ok(Change::Insert(id, endpoint))) = endpoints.next().await else {
            panic!("two inserts")
        };
        made.push((id, endpoint));
    }
    // Made, not connected: a channel connects on its first call.
    assert_eq!(base_accepted.load(Ordering::SeqCst), 0);
    assert_eq!(gray_accepted.load(Ordering::SeqCst), 0);

    for (id, endpoint) in made {
        let gray_label = endpoint.labels().get("gray").map(str::to_owned);
        let authority = endpoint.authority().to_string();
        assert_eq!(endpoint.instance().id(), &id);
        let response = endpoint.oneshot(call("/stock.Stock/Items")).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("{id} /stock.Stock/Items HTTP/2.0"));
        match id.as_str() {
            "base" => assert_eq!((gray_label, authority), (None, base.to_string())),
            _ => assert_eq!(
                (gray_label.as_deref(), authority),
                (Some("true"), gray.to_string())
            ),
        }
    }
    assert_eq!(base_accepted.load(Ordering::SeqCst), 1);
    assert_eq!(gray_accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unreachable_instance_fails_on_use_not_on_discovery() {
    let gone = closed_port();
    let registry =
        Registry::from_static([("stock", [instance("gone", gone.addr(), &[])])]).unwrap();
    let mut endpoints = registry
        .service("stock")
        .unwrap()
        .endpoints(GrpcChannels::new());
    let Some(Ok(Change::Insert(_, endpoint))) = endpoints.next().await else {
        panic!("an insert")
    };
    let err = endpoint
        .oneshot(call("/stock.Stock/Items"))
        .await
        .unwrap_err();
    assert!(is_refused(&err), "a connection error: {err:?}");
}
