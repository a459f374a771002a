//! Run with: cargo run -p example-hyper-client
//!
//! The hyper-util legacy `Client` wrapped in `PropagateStainLayer` with `ServiceBuilder`:
//! version pins from the task-local context travel as seed 002's `x-gray-info` header, and a
//! context put on one request's extensions wins over the task-local one. A small axum server
//! on a loopback port answers with the headers it received.

use axum::{Router, http::HeaderMap, routing::get};
use bytes::Bytes;
use gray_core::{Lane, Pins, Stain, Version};
use gray_tower::{PropagateStainLayer, StainExt};
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn stain_headers(headers: HeaderMap) -> String {
    let get = |name| {
        headers
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    format!("lane={} route={}", get("x-gray-lane"), get("x-gray-info"))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(async move {
        axum::serve(listener, Router::new().route("/", get(stain_headers))).await
    });

    let client = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>());

    let send = |req: Request<Empty<Bytes>>| {
        let client = client.clone();
        async move {
            let res = client.oneshot(req).await?;
            let body = res.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>(String::from_utf8(body.to_vec())?)
        }
    };

    // Version pins in the task-local context: all services on v2, svc-b on v3.
    let pins = Pins::new(Some(Version::new("v2")?), [("svc-b", Version::new("v3")?)])?;
    let pinned = Stain::pinned(pins);
    let from_task = send(Request::get(&url).body(Empty::new())?)
        .with_stain(pinned)
        .await?;

    // A context on the request's extensions wins over the task-local one.
    let mut req = Request::get(&url).body(Empty::new())?;
    req.extensions_mut()
        .insert(Stain::in_lane(Lane::new("canary")?));
    let from_extensions = send(req).await?;

    println!("task-local pins    -> {from_task}");
    println!("request extensions -> {from_extensions}");
    assert_eq!(
        from_task,
        r#"lane=- route={"all":"v2","custom":{"svc-b":"v3"}}"#
    );
    assert_eq!(from_extensions, "lane=canary route=-");
    Ok(())
}
