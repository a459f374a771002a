//! The gateway on real loopback ports: routing by stain with the prefix stripped,
//! the 503 that names service, lane and policy, stripping of untrusted stains, hop-by-hop
//! headers, streamed bodies, upstream timeouts, uploads answered early, live rule and
//! instance reloads (seen by the admin endpoint with no traffic), and the admin endpoint.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Uri},
    routing::{any, get},
};
use gray_gateway::{Gateway, config::Config};
use gray_test_support::WAIT;
use gray_tests::{Server, serve};
use tokio::sync::Notify;

/// A request an upstream holds until the test lets it go: `/hold` says it arrived, then
/// waits to be released.
#[derive(Debug, Clone, Default)]
struct Hold {
    arrived: Arc<Notify>,
    release: Arc<Notify>,
}

/// An upstream instance: answers `id path?query lane=… secret=…` and echoes POST bodies'
/// length; `/slow` never answers, `/hold` answers `held` once `hold` releases it.
async fn upstream(id: &'static str, hold: Hold) -> Server {
    async fn answer(
        State((id, _)): State<(&'static str, Hold)>,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> String {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        format!(
            "{id} {uri} lane={} secret={} body={}",
            header("x-gray-lane"),
            header("x-secret"),
            body.len()
        )
    }
    async fn slow() -> &'static str {
        std::future::pending().await
    }
    async fn held(State((_, hold)): State<(&'static str, Hold)>) -> &'static str {
        hold.arrived.notify_one();
        hold.release.notified().await;
        "held"
    }
    serve(
        Router::new()
            .route("/slow", get(slow))
            .route("/hold", get(held))
            .fallback(any(answer))
            .with_state((id, hold))
            .layer(axum::extract::DefaultBodyLimit::disable()),
    )
    .await
}

struct Setup {
    gateway: Gateway,
    dir: TempDir,
    /// What `/hold` on every upstream waits for.
    hold: Hold,
    _upstreams: Vec<Server>,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn instance(service: &str, id: &str, addr: SocketAddr, gray: bool) -> String {
    format!(
        "[[services.{service}]]\nid = \"{id}\"\naddress = \"{addr}\"\n{}\n",
        if gray {
            "labels = { gray = \"true\" }"
        } else {
            ""
        }
    )
}

async fn setup(name: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!("gray-gateway-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let hold = Hold::default();
    let base = upstream("orders-base", hold.clone()).await;
    let gray = upstream("orders-gray", hold.clone()).await;
    let stock = upstream("stock-base", hold.clone()).await;
    let instances = [
        instance("orders", "orders-base", base.addr(), false),
        instance("orders", "orders-gray", gray.addr(), true),
        instance("stock", "stock-base", stock.addr(), false),
    ]
    .concat();
    std::fs::write(dir.join("instances.toml"), instances).expect("write instances");
    std::fs::write(
        dir.join("rules.toml"),
        "[[rules]]\nname = \"beta\"\nwhen = { cookie = { name = \"beta\", exact = \"1\" } }\nlane = \"gray\"\n",
    )
    .expect("write rules");
    std::fs::write(
        dir.join("gateway.toml"),
        r#"
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
trusted_clients = ["127.0.0.1/32"]
rules = "rules.toml"
instances = "instances.toml"
upstream_timeout_ms = 500

[services.orders]
fallback = "baseline"

[services.stock]
fallback = "none"
"#,
    )
    .expect("write config");
    let config = Config::load(&dir.join("gateway.toml")).expect("valid config");
    let gateway = Gateway::start(config).await.expect("gateway starts");
    Setup {
        gateway,
        dir: TempDir(dir),
        hold,
        _upstreams: vec![base, gray, stock],
    }
}

fn client(from: [u8; 4]) -> reqwest::Client {
    gray_tests::reqwest_builder()
        .local_address(std::net::IpAddr::from(from))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn text(res: reqwest::Response) -> (u16, String) {
    let status = res.status().as_u16();
    (status, res.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_stain_with_the_prefix_stripped() {
    let s = setup("route").await;
    let gw = s.gateway.addr();
    let trusted = client([127, 0, 0, 1]);
    let (status, body) = text(
        trusted
            .get(format!("http://{gw}/orders/items/7?x=1"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, "orders-base /items/7?x=1 lane=- secret=- body=0");

    let res = trusted
        .get(format!("http://{gw}/orders/items"))
        .header("x-gray-lane", "gray")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["x-gray-instance"], "orders-gray");
    let (_, body) = text(res).await;
    assert_eq!(body, "orders-gray /items lane=gray secret=- body=0");

    // The rule fires for anyone, trusted or not.
    let untrusted = client([127, 0, 0, 2]);
    let (_, body) = text(
        untrusted
            .get(format!("http://{gw}/orders/"))
            .header("cookie", "beta=1")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body, "orders-gray / lane=gray secret=- body=0");

    let (status, body) = text(
        trusted
            .get(format!("http://{gw}/nope/x"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(body.contains("unknown service"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_are_served_over_http1_upstreams() {
    let s = setup("h2").await;
    let gw = s.gateway.addr();
    let h2 = gray_tests::reqwest_builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    for (lane, expected) in [(None, "orders-base"), (Some("gray"), "orders-gray")] {
        let mut request = h2.post(format!("http://{gw}/orders/items?x=1")).body("abc");
        if let Some(lane) = lane {
            request = request.header("x-gray-lane", lane);
        }
        let res = request.send().await.unwrap();
        assert_eq!(res.version(), reqwest::Version::HTTP_2);
        assert_eq!(res.headers()["x-gray-instance"], expected);
        let (status, body) = text(res).await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            format!(
                "{expected} /items?x=1 lane={} secret=- body=3",
                lane.unwrap_or("-")
            )
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_stain_is_stripped() {
    let s = setup("strip").await;
    let gw = s.gateway.addr();
    let untrusted = client([127, 0, 0, 2]);
    for _ in 0..10 {
        let (_, body) = text(
            untrusted
                .get(format!("http://{gw}/orders/a"))
                .header("x-gray-lane", "gray")
                .header("x-forwarded-for", "127.0.0.1")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(body, "orders-base /a lane=- secret=- body=0");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_fits_is_a_503_naming_service_lane_and_policy() {
    let s = setup("503").await;
    let gw = s.gateway.addr();
    let res = client([127, 0, 0, 1])
        .get(format!("http://{gw}/stock/x"))
        .header("x-gray-lane", "gray")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["service"], "stock");
    assert_eq!(body["lane"], "gray");
    assert_eq!(body["policy"], "default");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_go_and_bodies_stream() {
    let s = setup("hop").await;
    let gw = s.gateway.addr();
    let body = vec![b'x'; 3 * 1024 * 1024];
    let (status, answer) = text(
        client([127, 0, 0, 1])
            .post(format!("http://{gw}/orders/upload"))
            .header("connection", "x-secret")
            .header("x-secret", "hop-only")
            .body(body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer, "orders-base /upload lane=- secret=- body=3145728");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_times_out_with_504() {
    let s = setup("timeout").await;
    let gw = s.gateway.addr();
    let res = client([127, 0, 0, 1])
        .get(format!("http://{gw}/orders/slow"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 504);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let Setup {
        gateway,
        dir: _dir,
        hold,
        _upstreams,
    } = setup("shutdown").await;
    let gw = gateway.addr();
    let client = client([127, 0, 0, 1]);
    // A keep-alive connection left idle, and a request in flight.
    let (status, _) = text(
        client
            .get(format!("http://{gw}/orders/x"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move {
            text(
                client
                    .get(format!("http://{gw}/orders/hold"))
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    });
    tokio::time::timeout(WAIT, hold.arrived.notified())
        .await
        .expect("the request reaches the upstream");
    // The request is in flight, held by the upstream: shut down now.
    let shutdown = tokio::spawn(gateway.shutdown());
    // The gateway stops accepting at once (nothing listens any more) ...
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(gw).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ... but does not return while a request is in flight.
    assert!(
        !shutdown.is_finished(),
        "shutdown cut the request in flight"
    );
    assert!(!in_flight.is_finished());
    hold.release.notify_one();
    // Returns once the in-flight request is answered and the idle connection closed.
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown returns")
        .unwrap();
    let (status, body) = in_flight.await.unwrap();
    assert_eq!((status, body.as_str()), (200, "held"));
    assert!(tokio::net::TcpStream::connect(gw).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sent_nothing_does_not_hold_a_shutdown() {
    use tokio::io::AsyncReadExt;
    let Setup {
        gateway,
        dir: _dir,
        hold: _hold,
        _upstreams,
    } = setup("shutdown-silent").await;
    let gw = gateway.addr();
    // What a client's pool leaves behind when two connects race: connections opened and
    // never used (they have sent no byte), and an idle keep-alive one.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(tokio::net::TcpStream::connect(gw).await.unwrap());
    }
    let client = client([127, 0, 0, 1]);
    let (status, _) = text(
        client
            .get(format!("http://{gw}/orders/x"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    // Idle connections are closed at once: the shutdown returns well before the 10 s
    // grace it gives requests in flight.
    tokio::time::timeout(Duration::from_secs(5), gateway.shutdown())
        .await
        .expect("shutdown returns without waiting for connections that sent nothing");
    for mut stream in silent {
        let mut byte = [0; 1];
        let read = tokio::time::timeout(WAIT, stream.read(&mut byte))
            .await
            .expect("the gateway closes the connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_instances_answers_503_at_once_then_serves_when_one_comes() {
    let dir = TempDir(
        std::env::temp_dir().join(format!("gray-gateway-test-late-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let late = upstream("late-1", Hold::default()).await;
    // No instance yet, said explicitly (an empty file is rejected: a file caught half-written
    // must never empty a service).
    std::fs::write(dir.0.join("instances.toml"), "services = {}\n").expect("write instances");
    std::fs::write(
        dir.0.join("gateway.toml"),
        r#"
listen = "127.0.0.1:0"
trusted_clients = ["127.0.0.1/32"]
instances = "instances.toml"
upstream_timeout_ms = 10000

[services.late]
fallback = "baseline"
"#,
    )
    .expect("write config");
    let config = Config::load(&dir.0.join("gateway.toml")).expect("valid config");
    let gateway = Gateway::start(config).await.expect("gateway starts");
    let gw = gateway.addr();
    // No instance: every request is answered 503 at once, naming the service, the lane and
    // the policy. The client gives up after 4 s, so a request that waited for the 10 s
    // upstream timeout (a 504) would fail here.
    let c = gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(4))
        .build()
        .expect("client");
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut req = c.get(format!("http://{gw}/late/{i}"));
                if i % 2 == 0 {
                    req = req.header("x-gray-lane", "gray");
                }
                let res = req.send().await.unwrap();
                let status = res.status().as_u16();
                (status, res.json::<serde_json::Value>().await.unwrap())
            })
        })
        .collect();
    for (i, answer) in waiting.into_iter().enumerate() {
        let (status, body) = answer.await.unwrap();
        assert_eq!(status, 503, "request {i}: {body}");
        assert_eq!(body["service"], "late");
        assert_eq!(body["policy"], "default");
        if i % 2 == 0 {
            assert_eq!(body["lane"], "gray");
        } else {
            assert!(body["lane"].is_null(), "{body}");
        }
    }
    // The instance comes: requests are served by it.
    std::fs::write(
        dir.0.join("instances.toml"),
        instance("late", "late-1", late.addr(), false),
    )
    .expect("write instances");
    let url = format!("http://{gw}/late/x");
    assert!(
        wait_until(async || {
            let (status, body) = text(c.get(&url).send().await.unwrap()).await;
            status == 200 && body.starts_with("late-1 /x ")
        })
        .await,
        "served once the instance is registered"
    );
    gateway.shutdown().await;
}

/// Polls `check` every 50 ms until it holds; `false` after [`WAIT`].
async fn wait_until(mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_instances_reload_live() {
    let s = setup("reload").await;
    let gw = s.gateway.addr();
    let c = client([127, 0, 0, 2]);
    let generation = s.gateway.rules().status().generation;

    // A new rule: every request under /orders/canary goes gray.
    std::fs::write(
        s.dir.0.join("rules.toml"),
        "[[rules]]\nname = \"canary path\"\nwhen = { path = { prefix = \"/orders/canary\" } }\nlane = \"gray\"\n",
    )
    .unwrap();
    let url = format!("http://{gw}/orders/canary");
    assert!(
        wait_until(async || {
            let (_, body) = text(c.get(&url).send().await.unwrap()).await;
            body.starts_with("orders-gray")
        })
        .await,
        "the new rule took effect"
    );
    assert!(s.gateway.rules().status().generation > generation);

    // An invalid edit is rejected (the status counts it); the rule in force stays.
    let mut status = s.gateway.rules().subscribe();
    let rejected = status.borrow().rejected;
    std::fs::write(s.dir.0.join("rules.toml"), "[[rules]]\nname = 3\n").unwrap();
    tokio::time::timeout(WAIT, status.wait_for(|s| s.rejected > rejected))
        .await
        .expect("the invalid edit is read and rejected")
        .unwrap();
    let (_, body) = text(c.get(&url).send().await.unwrap()).await;
    assert!(body.starts_with("orders-gray"), "{body}");

    // The gray instance leaves: gray requests fall back to baseline (policy `baseline`).
    let instances = std::fs::read_to_string(s.dir.0.join("instances.toml")).unwrap();
    let without_gray: String = instances
        .split("[[services.")
        .filter(|block| !block.contains("orders-gray"))
        .collect::<Vec<_>>()
        .join("[[services.");
    std::fs::write(s.dir.0.join("instances.toml"), without_gray).unwrap();
    assert!(
        wait_until(async || {
            let (_, body) = text(c.get(&url).send().await.unwrap()).await;
            body.starts_with("orders-base")
        })
        .await,
        "the fallback took over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_explains_and_counts() {
    let s = setup("admin").await;
    let gw = s.gateway.addr();
    let admin = s.gateway.admin_addr().expect("admin address");
    let c = client([127, 0, 0, 1]);
    let _ = c
        .get(format!("http://{gw}/orders/x"))
        .header("x-gray-lane", "gray")
        .send()
        .await
        .unwrap();
    // No `canary` instance: served by baseline, as a fallback (twice).
    for _ in 0..2 {
        let res = c
            .get(format!("http://{gw}/orders/x"))
            .header("x-gray-lane", "canary")
            .send()
            .await
            .unwrap();
        assert_eq!(res.headers()["x-gray-instance"], "orders-base");
    }

    let explained: serde_json::Value = c
        .post(format!("http://{admin}/explain"))
        .body(r#"{"path": "/orders/x", "client_ip": "127.0.0.9", "cookies": {"beta": "1"}}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(explained["edge"]["rule_name"], "beta", "{explained}");
    assert_eq!(explained["lane"], "gray", "{explained}");
    let orders = explained["services"]["orders"].to_string();
    assert!(
        orders.contains("orders-gray") && !orders.contains("orders-base"),
        "{orders}"
    );

    let metrics = metrics(admin).await;
    assert!(
        metrics.contains(
            r#"gray_gateway_requests_total{service="orders",lane="gray",instance="orders-gray",status="200"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"gray_gateway_requests_total{service="orders",lane="canary",instance="orders-base",status="200"} 2"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"gray_gateway_fallbacks_total{service="orders",lane="canary",subset="baseline"} 2"#
        ),
        "{metrics}"
    );
    // Requests served by their own lane's instances are no fallbacks.
    assert_eq!(
        metrics.matches("gray_gateway_fallbacks_total{").count(),
        1,
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gray_gateway_rules_generation ")),
        "{metrics}"
    );
}

async fn metrics(admin: SocketAddr) -> String {
    client([127, 0, 0, 1])
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn explain(admin: SocketAddr) -> serde_json::Value {
    client([127, 0, 0, 1])
        .post(format!("http://{admin}/explain"))
        .body(r#"{"path": "/orders/x", "headers": {"x-gray-lane": "gray"}}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_follows_the_instances_with_no_traffic_at_all() {
    let s = setup("fresh").await;
    let admin = s.gateway.admin_addr().expect("admin address");
    let explained = explain(admin).await;
    let orders = explained["services"]["orders"].to_string();
    assert!(orders.contains("orders-gray"), "{orders}");
    assert_eq!(explained["discovery"]["connected"], true, "{explained}");
    assert!(
        explained["discovery"]["source"]
            .as_str()
            .is_some_and(|s| s.contains("instances.toml")),
        "{explained}"
    );

    // The gray instance leaves, a canary comes: no request goes through the proxy, yet
    // the explanation follows (the registry runs on its own; how fast is measured by
    // `cargo bench -p gray-tests --bench freshness`).
    let instances = std::fs::read_to_string(s.dir.0.join("instances.toml")).unwrap();
    let edited: String = instances
        .split("[[services.")
        .filter(|block| !block.contains("orders-gray"))
        .collect::<Vec<_>>()
        .join("[[services.");
    let canary = "[[services.orders]]\nid = \"orders-canary\"\naddress = \"127.0.0.1:9\"\nlabels = { lane = \"canary\" }\n";
    std::fs::write(s.dir.0.join("instances.toml"), edited + canary).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let orders = explain(admin).await["services"]["orders"].to_string();
        if !orders.contains("orders-gray") && orders.contains("orders-base") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {orders}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let names: Vec<String> = s
        .gateway
        .registry()
        .service("orders")
        .unwrap()
        .instances()
        .iter()
        .map(|i| i.id().to_string())
        .collect();
    assert_eq!(names, ["orders-base", "orders-canary"]);

    let metrics = metrics(admin).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "gray_gateway_discovery_connected 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gray_gateway_discovery_seconds_since_contact ")),
        "{metrics}"
    );
    // What discovery follows, as an info metric (a file: no etcd cluster ID).
    let info = metrics
        .lines()
        .find(|l| l.starts_with("gray_gateway_discovery_info{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        info.contains("instances.toml")
            && info.contains(r#"cluster_id="""#)
            && info.ends_with(" 1"),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_answered_early_all_end_without_other_traffic() {
    let dir = TempDir(
        std::env::temp_dir().join(format!("gray-gateway-test-early-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    // It answers as soon as it has read a request's head, and closes 5 ms later.
    let (early, _) = gray_test_support::net::answers_early(Duration::from_millis(5)).await;
    std::fs::write(
        dir.0.join("instances.toml"),
        instance("early", "early-1", early, false),
    )
    .expect("write instances");
    std::fs::write(
        dir.0.join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\nupstream_timeout_ms = 5000\n\n[services.early]\n",
    )
    .expect("write config");
    let gateway = Gateway::start(Config::load(&dir.0.join("gateway.toml")).expect("config"))
        .await
        .expect("gateway starts");
    let gw = gateway.addr();
    // One client, twenty 10 MiB uploads one after the other, nothing else: each ends (its
    // answer, or an error) by itself. Before, a connection parked with the upload still in
    // flight held the client's connection until another request took it.
    let c = gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let bound = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    for i in 0..20 {
        let upload = async {
            match c
                .post(format!("http://{gw}/early/up"))
                .body(vec![b'x'; 10 << 20])
                .send()
                .await
            {
                Ok(res) => {
                    let status = res.status();
                    (status, res.text().await.unwrap_or_default())
                }
                Err(_) => (reqwest::StatusCode::BAD_GATEWAY, String::new()),
            }
        };
        let (status, body) = tokio::time::timeout_at(bound, upload)
            .await
            .unwrap_or_else(|_| panic!("upload {i} still waiting"));
        if status == 200 {
            assert_eq!(body, "ok");
            answered += 1;
        }
    }
    assert!(answered > 0, "no upload was answered");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_leaves_takes_its_series_with_it() {
    let s = setup("series").await;
    let gw = s.gateway.addr();
    let admin = s.gateway.admin_addr().expect("admin address");
    let c = client([127, 0, 0, 1]);
    for lane in [None, Some("gray")] {
        let mut req = c.get(format!("http://{gw}/orders/x"));
        if let Some(lane) = lane {
            req = req.header("x-gray-lane", lane);
        }
        assert_eq!(req.send().await.unwrap().status(), 200);
    }
    let before = metrics(admin).await;
    assert!(before.contains(r#"instance="orders-gray""#), "{before}");
    assert!(before.contains(r#"instance="orders-base""#), "{before}");

    // orders-gray leaves the instances file: its series leave /metrics, the others stay.
    let instances = std::fs::read_to_string(s.dir.0.join("instances.toml")).unwrap();
    let without_gray: String = instances
        .split("[[services.")
        .filter(|block| !block.contains("orders-gray"))
        .collect::<Vec<_>>()
        .join("[[services.");
    std::fs::write(s.dir.0.join("instances.toml"), without_gray).unwrap();
    let mut after = String::new();
    assert!(
        wait_until(async || {
            after = metrics(admin).await;
            !after.contains("orders-gray")
        })
        .await,
        "still there: {after}"
    );
    assert!(
        after.contains(
            r#"gray_gateway_requests_total{service="orders",lane="baseline",instance="orders-base",status="200"} 1"#
        ),
        "{after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_instances_go_answers_503_at_once_and_an_empty_file_changes_nothing() {
    let dir = TempDir(
        std::env::temp_dir().join(format!("gray-gateway-test-emptied-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let b1 = upstream("b-1", Hold::default()).await;
    let file = dir.0.join("instances.toml");
    std::fs::write(&file, instance("b", "b-1", b1.addr(), false)).expect("write instances");
    std::fs::write(
        dir.0.join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\nupstream_timeout_ms = 10000\n[services.b]\npreset = \"seed-000\"\n",
    )
    .expect("write config");
    let logs = gray_test_support::logs::capture_process();
    let gateway = Gateway::start(Config::load(&dir.0.join("gateway.toml")).expect("config"))
        .await
        .expect("gateway starts");
    let url = format!("http://{}/b/x", gateway.addr());
    // A 504 after the 10 s upstream timeout would fail here first: the client waits 4 s.
    let c = gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(4))
        .build()
        .expect("client");
    let (status, _) = text(c.get(&url).send().await.unwrap()).await;
    assert_eq!(status, 200);

    // A 0-byte file (a write caught half-way) is rejected, which the log says: b-1 keeps
    // serving.
    std::fs::write(&file, "").unwrap();
    let file_name = file.display().to_string();
    let line = logs
        .line_with(&["instance file rejected", &file_name], WAIT)
        .await;
    assert!(line.contains("ERROR") && line.contains("empty"), "{line}");
    let (status, body) = text(c.get(&url).send().await.unwrap()).await;
    assert_eq!((status, body.starts_with("b-1 ")), (200, true), "{body}");

    // An explicit "no instance": every request gets its 503 at once.
    std::fs::write(&file, "services = { b = [] }\n").unwrap();
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(async || {
            let res = c.get(&url).send().await.unwrap();
            if res.status() != 503 {
                return false;
            }
            last = res.json().await.unwrap();
            true
        })
        .await,
        "never answered 503"
    );
    assert_eq!(last["service"], "b", "{last}");
    assert_eq!(last["policy"], "seed-000", "{last}");
    assert!(last["lane"].is_null(), "{last}");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_balancers_live_view_of_each_instance() {
    let dir = TempDir(
        std::env::temp_dir().join(format!("gray-gateway-test-ejected-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let base = upstream("orders-base", Hold::default()).await;
    // A gray instance nobody listens on: its connections are refused.
    let dead = gray_test_support::net::closed_port();
    std::fs::write(
        dir.0.join("instances.toml"),
        [
            instance("orders", "orders-base", base.addr(), false),
            instance("orders", "orders-dead", dead.addr(), true),
        ]
        .concat(),
    )
    .expect("write instances");
    std::fs::write(
        dir.0.join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ntrusted_clients = [\"127.0.0.1/32\"]\ninstances = \"instances.toml\"\n[services.orders]\nfallback = \"baseline\"\n",
    )
    .expect("write config");
    let gateway = Gateway::start(Config::load(&dir.0.join("gateway.toml")).expect("config"))
        .await
        .expect("gateway starts");
    let (gw, admin) = (gateway.addr(), gateway.admin_addr().expect("admin"));
    let c = client([127, 0, 0, 1]);
    let gray_route =
        async || explain(admin).await["services"]["orders"]["outcome"]["routed"].clone();
    assert_eq!(
        gray_route().await["candidates"],
        serde_json::json!(["orders-dead"])
    );

    // Gray requests fail to connect until the balancer ejects the dead instance; then the
    // explanation says what requests meet: the fallback to baseline.
    let mut routed = serde_json::Value::Null;
    assert!(
        wait_until(async || {
            let _ = c
                .get(format!("http://{gw}/orders/x"))
                .header("x-gray-lane", "gray")
                .send()
                .await
                .unwrap();
            routed = gray_route().await;
            routed["fallback"] == true
        })
        .await,
        "never ejected: {routed}"
    );
    assert_eq!(
        routed["candidates"],
        serde_json::json!(["orders-base"]),
        "{routed}"
    );
    let explained = explain(admin).await;
    assert_eq!(explained["rules"]["generation"], 1, "{explained}");
    gateway.shutdown().await;
}
