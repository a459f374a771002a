//! Upstream faults in the middle of an exchange, through the real gateway with a reqwest
//! client: an instance that dies halfway through its response body, and one that answers
//! something that is not HTTP. The client must learn of the fault at once (a truncated body
//! is an error, never a short success), and the gateway must go on serving: the broken
//! connection is not reused, and the next request gets a whole answer.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicUsize, Ordering},
};

use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT, net};
use gray_tests::one_instance_gateway;
use tokio::io::AsyncWriteExt;

/// A whole answer, used once the fault has happened.
const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nwhole";

/// The gateway of `gray_tests::one_instance_gateway`.
async fn gateway(upstream: SocketAddr) -> (Gateway, TempDir) {
    one_instance_gateway("gateway-faults", upstream, false).await
}

/// An instance whose first connection answers `first` and closes; every later connection
/// answers [`WHOLE`] to each request.
async fn faulty(first: &'static [u8]) -> SocketAddr {
    let connections = std::sync::Arc::new(AtomicUsize::new(0));
    let (addr, _) = net::serve(move |mut stream| {
        let nth = connections.fetch_add(1, Ordering::SeqCst);
        async move {
            if nth == 0 {
                if net::read_head(&mut stream).await {
                    let _ = stream.write_all(first).await;
                }
                return;
            }
            while net::read_head(&mut stream).await {
                if stream.write_all(WHOLE).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    addr
}

/// `GET /svc/x` through the gateway: the status and the whole body, or the error that
/// ended the exchange (before or after the response head).
async fn get(client: &reqwest::Client, gw: SocketAddr) -> Result<(u16, String), reqwest::Error> {
    tokio::time::timeout(WAIT, async {
        let res = client.get(format!("http://{gw}/svc/x")).send().await?;
        let status = res.status().as_u16();
        Ok((status, res.text().await?))
    })
    .await
    .expect("the exchange ends or fails in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_dying_mid_body_truncates_that_response_only() {
    // 1,000 bytes announced, 100 sent, then the connection closes.
    static TRUNCATED: &[u8] = concat!(
        "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n",
        "0123456789012345678901234567890123456789012345678901234567890123456789",
        "012345678901234567890123456789"
    )
    .as_bytes();
    let upstream = faulty(TRUNCATED).await;
    let (gateway, _dir) = gateway(upstream).await;
    let client = gray_tests::reqwest_client();

    // The client sees an error: the gateway's connection closes before the head (when the
    // upstream failed before the head was flushed) or within the body, never a short body
    // that looks whole.
    let first = get(&client, gateway.addr()).await;
    assert!(first.is_err(), "a body cut short must fail: got {first:?}");

    // The gateway goes on: the next request gets a whole answer, from a fresh upstream
    // connection (the broken one is not reused).
    let next = get(&client, gateway.addr()).await.expect("served");
    assert_eq!(next, (200, "whole".to_owned()));
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answering_garbage_gets_a_502_and_the_next_request_is_served() {
    let upstream = faulty(b"SSH-2.0-OpenSSH_9.2\r\n").await;
    let (gateway, _dir) = gateway(upstream).await;
    let client = gray_tests::reqwest_client();

    let (status, _) = get(&client, gateway.addr()).await.expect("an answer");
    assert_eq!(status, 502, "not HTTP from the upstream is a bad gateway");

    let next = get(&client, gateway.addr()).await.expect("served");
    assert_eq!(next, (200, "whole".to_owned()));
    gateway.shutdown().await;
}
