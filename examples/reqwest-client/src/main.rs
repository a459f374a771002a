//! Run with: cargo run -p example-reqwest-client
//!
//! A reqwest client with `PropagateMiddleware`, used outside any server: a batch job that
//! stains its own calls. The stain comes from the task-local (set here with
//! `StainExt::with_stain`), or from the middleware extensions of one request. A small
//! axum server on a loopback port answers with the lane it received. To also *route* by
//! the stain (`http://stock/…` to a gray instance), see `example-reqwest-routing`.

use axum::{Router, http::HeaderMap, routing::get};
use gray_tower::{
    Lane, Stain, StainExt,
    reqwest::{ClientBuilder, PropagateMiddleware},
    task,
};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn lane_header(headers: HeaderMap) -> String {
    headers
        .get("x-gray-lane")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("baseline")
        .to_owned()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    tokio::spawn(
        async move { axum::serve(listener, Router::new().route("/", get(lane_header))).await },
    );

    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(PropagateMiddleware::new())
        .build();

    // 1. No stain anywhere: the request goes out unstained.
    let plain = client.get(&url).send().await?.text().await?;

    // 2. The job runs in the `canary` lane: every call it makes, in this task or in tasks
    //    it starts with `task::spawn`, carries the lane.
    let canary = Stain::in_lane(Lane::new("canary")?);
    let (direct, spawned) = async {
        let direct = client.get(&url).send().await?.text().await?;
        let client = client.clone();
        let url = url.clone();
        let spawned = task::spawn(async move {
            let res = client.get(&url).send().await?;
            Ok::<_, BoxError>(res.text().await?)
        })
        .await??;
        Ok::<_, BoxError>((direct, spawned))
    }
    .with_stain(canary)
    .await?;

    // 3. One request with its own stain, in the middleware extensions: it wins over the
    //    task-local stain.
    let blue = Stain::in_lane(Lane::new("blue")?);
    let explicit = client
        .get(&url)
        .with_extension(blue)
        .send()
        .await?
        .text()
        .await?;

    println!("no stain             -> {plain}");
    println!("job in lane canary   -> {direct}");
    println!("task::spawn from job -> {spawned}");
    println!("request extension    -> {explicit}");
    assert_eq!(
        (
            plain.as_str(),
            direct.as_str(),
            spawned.as_str(),
            explicit.as_str()
        ),
        ("baseline", "canary", "canary", "blue")
    );
    Ok(())
}
