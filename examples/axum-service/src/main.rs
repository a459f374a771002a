//! Run with: cargo run -p example-axum-service
//!
//! Two axum services on loopback ports. `orders` reads the stain of each request with
//! `ExtractStainLayer` and calls `stock` with a reqwest client that carries
//! `PropagateMiddleware`; the handler never touches the stain. `stock` answers with the lane
//! it saw. The program sends one unstained and one stained request, prints what `stock`
//! saw, and exits.

use axum::{Router, extract::State, routing::get};
use gray_tower::{ExtractStainLayer, reqwest::PropagateMiddleware};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `stock`: reports the lane of the request it is handling.
async fn stock() -> String {
    match gray_tower::current().and_then(|ctx| ctx.lane().cloned()) {
        Some(lane) => format!("stock served lane `{lane}`"),
        None => "stock served baseline".to_string(),
    }
}

/// `orders`: calls `stock`; the stain travels without being passed around.
async fn orders(State((client, stock_url)): State<(ClientWithMiddleware, String)>) -> String {
    match client.get(&stock_url).send().await {
        Ok(res) => res.text().await.unwrap_or_else(|e| e.to_string()),
        Err(e) => format!("stock unreachable: {e}"),
    }
}

async fn serve(router: Router) -> Result<String, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let stock_url = serve(
        Router::new()
            .route("/", get(stock))
            .layer(ExtractStainLayer::new()),
    )
    .await?;

    let client = ClientBuilder::new(reqwest::Client::new())
        .with(PropagateMiddleware::new())
        .build();
    let orders_url = serve(
        Router::new()
            .route("/", get(orders))
            .with_state((client, stock_url))
            .layer(ExtractStainLayer::new()),
    )
    .await?;

    let plain = reqwest::Client::new();
    let unstained = plain.get(&orders_url).send().await?.text().await?;
    let stained = plain
        .get(&orders_url)
        .header("x-gray-lane", "canary")
        .send()
        .await?
        .text()
        .await?;
    println!("GET /                      -> {unstained}");
    println!("GET / x-gray-lane: canary  -> {stained}");
    assert_eq!(unstained, "stock served baseline");
    assert_eq!(stained, "stock served lane `canary`");
    Ok(())
}
