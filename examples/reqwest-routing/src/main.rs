//! Run with: cargo run -p example-reqwest-routing
//!
//! reqwest routing by the stain, the way Spring's `@LoadBalanced RestTemplate` resolves a
//! service name: `http://stock/items` goes to an instance of `stock` picked per request by
//! the stain.
//!
//! - `stock` runs two instances on loopback ports, `stock-base` and `stock-gray` (label
//!   `gray = true`), listed in an instance file that a `Registry` follows on its own;
//! - `orders` is an axum service whose handler calls `http://stock/items` with one reqwest
//!   client: `PropagateMiddleware` writes the stain onto the request, `RouteMiddleware`
//!   picks the instance and rewrites the URL to it (reqwest keeps its own connection pool).
//!   The handler never touches the stain;
//! - the program calls `orders` unstained and with `x-gray-lane: gray`, then removes the
//!   gray instance from the file: with no fallback in the policy, a gray request now fails,
//!   naming the service, the lane and the policy, until the instance is back.
//!
//! It checks every answer and exits.

use std::{net::SocketAddr, path::Path, time::Duration};

use axum::{Router, extract::State, http::StatusCode, routing::get};
use gray_balance::{BalanceLayer, reqwest::RouteMiddleware};
use gray_discovery::{Registry, source::file::FileSource};
use gray_tower::{
    ExtractStainLayer, Policy,
    reqwest::{ClientBuilder, ClientWithMiddleware, PropagateMiddleware},
};
use tokio::net::TcpListener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An instance of `stock`: says who it is and which lane it was called in.
async fn stock(State(id): State<&'static str>) -> String {
    let lane = gray_tower::current().and_then(|stain| stain.lane().cloned());
    match lane {
        Some(lane) => format!("{id} served lane {lane}"),
        None => format!("{id} served baseline"),
    }
}

/// `orders`: calls `http://stock/items`; which instance answers depends on the stain of
/// the request being handled.
async fn orders(State(client): State<ClientWithMiddleware>) -> (StatusCode, String) {
    match client.get("http://stock/items").send().await {
        Ok(res) => match res.text().await {
            Ok(body) => (StatusCode::OK, body),
            Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()),
        },
        // Nothing fits the stain: the error names the service, the lane and the policy.
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn serve(app: Router) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

async fn stock_instance(id: &'static str) -> Result<SocketAddr, BoxError> {
    let app = Router::new()
        .route("/items", get(stock))
        .with_state(id)
        .layer(ExtractStainLayer::new());
    serve(app).await
}

/// Writes the instance file (atomically: a temporary file renamed over it).
fn write_instances(path: &Path, base: SocketAddr, gray: Option<SocketAddr>) -> std::io::Result<()> {
    let mut toml = format!("[[services.stock]]\nid = \"stock-base\"\naddress = \"{base}\"\n");
    if let Some(gray) = gray {
        toml += &format!(
            "\n[[services.stock]]\nid = \"stock-gray\"\naddress = \"{gray}\"\nlabels = {{ gray = true }}\n"
        );
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, toml)?;
    std::fs::rename(&tmp, path)
}

/// Calls `orders` (stained with `lane` when given), prints the answer and checks it.
async fn check(
    orders: SocketAddr,
    lane: Option<&str>,
    expected: (u16, &str),
) -> Result<(), BoxError> {
    let plain = reqwest::Client::builder().no_proxy().build()?;
    let mut req = plain.get(format!("http://{orders}/"));
    if let Some(lane) = lane {
        req = req.header("x-gray-lane", lane);
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    let body = res.text().await?;
    println!("x-gray-lane: {:<5} -> {status} {body}", lane.unwrap_or("-"));
    assert_eq!((status, body.as_str()), expected);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let base = stock_instance("stock-base").await?;
    let gray = stock_instance("stock-gray").await?;
    let path = std::env::temp_dir().join(format!(
        "example-reqwest-routing-{}.toml",
        std::process::id()
    ));
    write_instances(&path, base, Some(gray))?;

    // Discovery: a registry that follows the file (polled here every 50 ms), and one
    // balancer for `stock` over it. Policy::new(): lanes from the `lane` and `gray` labels,
    // unlabelled instances are baseline, no fallback.
    let source = FileSource::new(&path).with_interval(Duration::from_millis(50));
    let registry = Registry::start(source).await?;
    let instances = registry.service("stock")?.discover();
    let stock = BalanceLayer::new("stock", Policy::new()).build(instances);

    // The client: propagation and routing; URLs of other hosts are sent as they are.
    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(PropagateMiddleware::new())
        .with(RouteMiddleware::new().route("stock", stock.clone()))
        .build();
    let orders = serve(
        Router::new()
            .route("/", get(orders))
            .with_state(client)
            .layer(ExtractStainLayer::new()),
    )
    .await?;

    check(orders, None, (200, "stock-base served baseline")).await?;
    check(orders, Some("gray"), (200, "stock-gray served lane gray")).await?;

    // The gray instance goes away: the balancer follows the file, with no request needed.
    write_instances(&path, base, None)?;
    wait_for(|| stock.len() == 1).await?;
    let unroutable = "no instance of `stock` fits lane `gray` (policy `default`, fallback `none`)";
    check(orders, Some("gray"), (503, unroutable)).await?;
    check(orders, None, (200, "stock-base served baseline")).await?;

    // ... and comes back.
    write_instances(&path, base, Some(gray))?;
    wait_for(|| stock.len() == 2).await?;
    check(orders, Some("gray"), (200, "stock-gray served lane gray")).await?;
    std::fs::remove_file(&path)?;
    Ok(())
}

/// Polls `check` every 10 ms for at most 5 s.
async fn wait_for(check: impl Fn() -> bool) -> Result<(), BoxError> {
    for _ in 0..500 {
        if check() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err("the balancer did not follow the instance file within 5 s".into())
}
