//! Run with: cargo run -p example-axum-service
//!
//! Two axum services on loopback ports, with gray-tower as their only gray dependency.
//! `orders` reads the stain of each request with `ExtractStainLayer` and calls `stock` with
//! a reqwest client that carries `PropagateMiddleware`; the handler never touches the
//! stain. Both sides use the same carriers: the default ones (`x-gray-lane`,
//! `x-gray-info`) plus the `gray.lane` member of W3C `baggage`, so that a stain set by a
//! service in another language arrives too, with the other baggage members it carries.
//! `stock` answers with the lane it saw and the `baggage` it received. The program sends an
//! unstained request, one with `x-gray-lane`, and one with `baggage`, checks what `stock`
//! saw, and exits.

use axum::{Router, extract::State, http::HeaderMap, routing::get};
use gray_tower::{
    Carriers, ExtractStainLayer,
    reqwest::{ClientBuilder, ClientWithMiddleware, PropagateMiddleware},
};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `stock`: reports the lane of the request it is handling, and its `baggage`.
async fn stock(headers: HeaderMap) -> String {
    let lane = match gray_tower::current().and_then(|stain| stain.lane().cloned()) {
        Some(lane) => format!("lane `{lane}`"),
        None => "baseline".to_owned(),
    };
    let baggage = headers.get("baggage").and_then(|v| v.to_str().ok());
    format!("stock served {lane}, baggage: {}", baggage.unwrap_or("-"))
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
    // The same carriers on every layer and client of the chain.
    let carriers = Carriers::default().with_baggage();
    let stock_url = serve(
        Router::new()
            .route("/", get(stock))
            .layer(ExtractStainLayer::new().with_carriers(carriers.clone())),
    )
    .await?;

    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(PropagateMiddleware::new().with_carriers(carriers.clone()))
        .build();
    let orders_url = serve(
        Router::new()
            .route("/", get(orders))
            .with_state((client, stock_url))
            .layer(ExtractStainLayer::new().with_carriers(carriers)),
    )
    .await?;

    let plain = reqwest::Client::builder().no_proxy().build()?;
    let send = async |header: Option<(&str, &str)>| {
        let mut req = plain.get(&orders_url);
        if let Some((name, value)) = header {
            req = req.header(name, value);
        }
        req.send().await?.text().await
    };
    let unstained = send(None).await?;
    let lane = send(Some(("x-gray-lane", "canary"))).await?;
    let baggage = send(Some(("baggage", "userId=42,gray.lane=canary"))).await?;
    println!("GET /                                       -> {unstained}");
    println!("GET / x-gray-lane: canary                   -> {lane}");
    println!("GET / baggage: userId=42,gray.lane=canary   -> {baggage}");
    assert_eq!(unstained, "stock served baseline, baggage: -");
    assert_eq!(
        lane,
        "stock served lane `canary`, baggage: gray.lane=canary"
    );
    // The client's other member travels on, before the stain's.
    assert_eq!(
        baggage,
        "stock served lane `canary`, baggage: userId=42,gray.lane=canary"
    );
    Ok(())
}
