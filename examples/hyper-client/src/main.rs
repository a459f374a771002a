//! Run with: cargo run -p example-hyper-client
//!
//! Routing by the stain with hyper, or any tower client: one client for the service
//! `stock`, built from three pieces,
//!
//! - `HttpEndpoints` (gray-discovery): every instance of `stock` in the registry becomes an
//!   HTTP/1.1 client service on hyper, with its own keep-alive connections and the
//!   instance's labels beside it;
//! - `Balance` (gray-balance): one shared, cloneable balancer over those endpoints, which
//!   picks per request, in the caller's task, among the instances whose labels fit the
//!   stain (no `Buffer`, no mutex);
//! - `PropagateStainLayer` (gray-tower): writes the stain onto the request, so the instance
//!   receives it too.
//!
//! `stock` runs a baseline and a gray instance on loopback ports; each answers with its id
//! and the `x-gray-lane` header it received. The program sends unstained requests, stained
//! ones (the task-local stain, as inside a server behind `ExtractStainLayer`), a request
//! whose own stain wins over the task-local one, and 200 concurrent requests from spawned
//! tasks; it checks every answer and exits.

use axum::{Router, extract::State, http::HeaderMap, routing::get};
use bytes::Bytes;
use gray_balance::BalanceLayer;
use gray_core::{Labels, Lane, Stain};
use gray_discovery::{Instance, Registry, http::HttpEndpoints};
use gray_policy::Policy;
use gray_tower::{PropagateStainLayer, StainExt};
use http::Request;
use http_body_util::{BodyExt, Empty};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An instance of `stock`: its id and the lane header it received.
async fn stock(State(id): State<&'static str>, headers: HeaderMap) -> String {
    let lane = headers.get("x-gray-lane").and_then(|v| v.to_str().ok());
    format!("{id} x-gray-lane={}", lane.unwrap_or("-"))
}

/// Starts an instance of `stock` on a loopback port.
async fn instance(id: &'static str, labels: Labels) -> Result<Instance, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = Router::new().route("/items", get(stock)).with_state(id);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(Instance::new(
        id.parse()?,
        addr.to_string().parse()?,
        labels,
    ))
}

/// Sends `req` with `client` and reads the answer.
async fn send<C>(client: C, req: Request<Empty<Bytes>>) -> Result<String, BoxError>
where
    C: Service<
            Request<Empty<Bytes>>,
            Response = http::Response<gray_discovery::http::ResponseBody>,
        >,
    C::Error: Into<BoxError>,
{
    let res = client.oneshot(req).await.map_err(Into::into)?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

fn items() -> Request<Empty<Bytes>> {
    // Only the path matters: the endpoint sends it to its instance.
    Request::get("/items")
        .body(Empty::new())
        .expect("a valid request")
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The registry: a fixed list here; a file or etcd in a deployment (gray_discovery).
    let registry = Registry::from_static([(
        "stock",
        [
            instance("stock-base", Labels::new()).await?,
            instance("stock-gray", Labels::from_iter([("gray", "true")])).await?,
        ],
    )])?;

    // The client of `stock`. Policy::new(): the `gray` label puts an instance in lane
    // `gray`; unlabelled instances are baseline; no fallback.
    let endpoints = registry.service("stock")?.endpoints(HttpEndpoints::new());
    let balance = BalanceLayer::new("stock", Policy::new()).build(endpoints);
    let client = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(balance.clone());

    let gray = Stain::in_lane(Lane::new("gray")?);
    let unstained = send(client.clone(), items()).await?;
    // The task-local stain, as a handler behind `ExtractStainLayer` has it.
    let stained = send(client.clone(), items())
        .with_stain(gray.clone())
        .await?;
    // A stain in the request's extensions wins over the task-local one.
    let mut req = items();
    req.extensions_mut().insert(Stain::baseline());
    let own = send(client.clone(), req).with_stain(gray.clone()).await?;

    // 200 concurrent callers, each in its own task, share the one balancer; every other
    // one is gray.
    let callers: Vec<_> = (0..200)
        .map(|i| {
            let stain = if i % 2 == 0 {
                gray.clone()
            } else {
                Stain::baseline()
            };
            tokio::spawn(send(client.clone(), items()).with_stain(stain))
        })
        .collect();
    let mut astray = 0;
    for (i, caller) in callers.into_iter().enumerate() {
        let expected = if i % 2 == 0 {
            "stock-gray x-gray-lane=gray"
        } else {
            "stock-base x-gray-lane=-"
        };
        astray += usize::from(caller.await?? != expected);
    }

    // What the balancer would do for a gray request, as a value (an admin endpoint's view).
    let decision = balance.explain(Some(&gray));
    let candidates: Vec<String> = decision
        .candidates()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect();

    println!("unstained                    -> {unstained}");
    println!("task-local lane gray         -> {stained}");
    println!("request's own stain wins     -> {own}");
    println!("200 concurrent, half gray    -> {astray} astray");
    println!("explain(gray)                -> {candidates:?}");
    assert_eq!(unstained, "stock-base x-gray-lane=-");
    assert_eq!(stained, "stock-gray x-gray-lane=gray");
    assert_eq!(own, "stock-base x-gray-lane=-");
    assert_eq!(astray, 0);
    assert_eq!(candidates, ["stock-gray"]);
    Ok(())
}
