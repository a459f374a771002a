//! Instances as HTTP client services, against real loopback servers.

use std::{convert::Infallible, net::SocketAddr};

use bytes::Bytes;
use futures_util::StreamExt;
use gray_core::{Labelled, Labels};
use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{ServiceExt, discover::Change};

/// A server that answers `NAME PATH?QUERY host=HOST`.
async fn server(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
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
            });
        }
    });
    addr
}

#[tokio::test]
async fn endpoints_send_to_their_instance_and_carry_its_labels() {
    let (one, two) = (server("one").await, server("two").await);
    let instances = StaticDiscover::new([
        Instance::new(
            "one".parse().unwrap(),
            one.to_string().parse().unwrap(),
            Labels::new(),
        ),
        Instance::new(
            "two".parse().unwrap(),
            format!("http://{two}").parse().unwrap(),
            Labels::from_iter([("gray", "true")]),
        ),
    ]);
    let endpoints = HttpEndpoints::<_, Full<Bytes>>::new();
    let mut discover = endpoints.discover(instances);
    let mut seen = Vec::new();
    while let Some(change) = discover.next().await {
        let Change::Insert(id, endpoint) = change.unwrap() else {
            panic!("a static list only inserts")
        };
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
    let endpoint = endpoints.endpoint(Instance::new(
        "one".parse().unwrap(),
        one.to_string().parse().unwrap(),
        Labels::new(),
    ));
    let request = Request::get("http://elsewhere.invalid/x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = endpoint.oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, format!("one /x host={one}"));
}

#[tokio::test]
async fn an_unreachable_instance_is_an_error() {
    // Bind and drop: nothing listens on this port any more.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoint = HttpEndpoints::<_, Full<Bytes>>::new().endpoint(Instance::new(
        "gone".parse().unwrap(),
        addr.to_string().parse().unwrap(),
        Labels::new(),
    ));
    let request = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let err = endpoint.oneshot(request).await.unwrap_err();
    assert!(!err.to_string().is_empty());
}
