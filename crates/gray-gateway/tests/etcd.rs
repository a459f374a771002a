//! The gateway on a real etcd (feature `etcd`): instances under the `[etcd]` prefix and the
//! rule set under `rules_key`, both followed live, and discovery's freshness (revision,
//! cluster ID) in `/metrics` and `/explain`.

use std::time::Duration;

use gray_gateway::{Gateway, config::Config};
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// An instance that answers `id` to anything, on a loopback port.
async fn instance(id: &'static str) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if gray_test_support::net::read_head(&mut stream).await {
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{id}",
                        id.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    addr
}

/// `GET path` with `headers`: status and body.
async fn get(addr: std::net::SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n{headers}\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

async fn eventually(mut check: impl AsyncFnMut() -> bool) -> bool {
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
async fn instances_and_rules_from_etcd() {
    let etcd = Etcd::start().await;
    let base = instance("orders-base").await;
    let gray = instance("orders-gray").await;
    etcd.put(
        "/apps/orders/orders-base",
        format!(r#"{{"address": "{base}"}}"#),
    )
    .await;
    etcd.put(
        "/gray-rules/gateway.toml",
        "[[rules]]\nname = \"testers\"\nwhen = { header = { name = \"x-tester\", present = true } }\nlane = \"gray\"\n",
    )
    .await;
    let dir = TempDir::new("gateway-etcd");
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            r#"listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[etcd]
endpoints = ["{}"]
prefix = "/apps"
rules_key = "/gray-rules/gateway.toml"
request_timeout_ms = 2000

[services.orders]
fallback = "baseline"
"#,
            etcd.endpoint()
        ),
    )
    .unwrap();
    let gateway = Gateway::start(Config::load(&dir.path().join("gateway.toml")).unwrap())
        .await
        .expect("gateway starts");
    let (gw, admin) = (gateway.addr(), gateway.admin_addr().unwrap());

    // A tester is gray by the rule from etcd, but no gray instance exists yet: baseline.
    assert_eq!(
        get(gw, "/orders/x", "x-tester: 1\r\n").await,
        (200, "orders-base".into())
    );
    // The gray instance is put: testers reach it, others stay on baseline.
    etcd.put(
        "/apps/orders/orders-gray",
        format!(r#"{{"address": "{gray}", "labels": {{"gray": "true"}}}}"#),
    )
    .await;
    assert!(
        eventually(async || get(gw, "/orders/x", "x-tester: 1\r\n").await.1 == "orders-gray").await,
        "the gray instance never served"
    );
    assert_eq!(get(gw, "/orders/x", "").await.1, "orders-base");
    // A new rule set: nobody is gray any more.
    let revision = etcd.put("/gray-rules/gateway.toml", "rules = []\n").await;
    assert!(
        eventually(async || get(gw, "/orders/x", "x-tester: 1\r\n").await.1 == "orders-base").await,
        "the new rules never applied"
    );

    // Discovery's freshness: connected, the revision applied, the cluster ID.
    let (status, metrics) = get(admin, "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l == "gray_gateway_discovery_connected 1"),
        "{metrics}"
    );
    let applied: i64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gray_gateway_discovery_revision "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        applied > 0 && applied <= revision,
        "{applied} vs {revision}"
    );
    let info = metrics
        .lines()
        .find(|l| l.starts_with("gray_gateway_discovery_info{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        !info.contains(r#"cluster_id="""#) && info.contains("/apps/"),
        "{info}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == "gray_gateway_rules_generation 2"),
        "{metrics}"
    );

    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"POST /explain HTTP/1.1\r\nhost: gw\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let body = raw.split_once("\r\n\r\n").unwrap().1;
    let explained: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(explained["discovery"]["connected"], true, "{explained}");
    assert!(explained["discovery"]["cluster_id"].is_u64(), "{explained}");
    assert!(
        explained["discovery"]["revision"].as_i64() >= Some(applied),
        "{explained}"
    );
    gateway.shutdown().await;
}
