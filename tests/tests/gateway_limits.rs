//! Limits on the gateway's clients (issue 13): slow request heads, idle keep-alive
//! connections, oversized heads, the connection cap, the cap of requests in flight to one
//! instance, and idle connections parked without their buffers (issue 23), on real
//! loopback connections.
//! Timeouts are short here (1 to 2 s: long enough that a loaded machine never cuts a
//! client that sends at once); nothing asserts a time beyond "before a generous deadline",
//! and nothing waits for a fixed time.

use std::net::SocketAddr;

use axum::{Router, routing::any};
use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{Server, serve};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

async fn start(limits: &str) -> (Gateway, TempDir, Server) {
    let upstream = serve(Router::new().fallback(any(|| async { "ok" }))).await;
    start_with(limits, upstream).await
}

/// A gateway with `limits` routing `svc` to its one instance, `upstream`.
async fn start_with(limits: &str, upstream: Server) -> (Gateway, TempDir, Server) {
    let dir = TempDir::new("gateway-limits");
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"svc-1\"\naddress = \"{}\"\n",
            upstream.addr()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\n{limits}\n[services.svc]\n"
        ),
    )
    .unwrap();
    let gateway = gray_tests::start_gateway(dir.path()).await;
    (gateway, dir, upstream)
}

/// Sends one keep-alive request on `stream` and reads its answer (status and body `ok`).
async fn request(stream: &mut TcpStream) -> u16 {
    stream
        .write_all(b"GET /svc/x HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    answer(stream).await
}

/// Reads the answer to a request sent on `stream`: its status (the body is `ok`).
async fn answer(stream: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("answered in time")
            .unwrap();
        assert!(
            n > 0,
            "closed before the answer: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|l| l.trim().parse().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return head[9..12].parse().unwrap();
            }
        }
    }
}

/// Whether the gateway closes `stream` (EOF or reset) before the generous deadline.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn one_answer(gw: SocketAddr) -> u16 {
    let mut c = TcpStream::connect(gw).await.unwrap();
    request(&mut c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_head_is_cut_off_while_others_are_served() {
    let (gateway, _dir, _upstream) =
        start("header_read_timeout_ms = 1000\nidle_timeout_ms = 60000").await;
    let gw = gateway.addr();
    // Half a head, then nothing; and a connection that sends nothing at all.
    let mut slow = TcpStream::connect(gw).await.unwrap();
    slow.write_all(b"GET /svc/x HTTP/1.1\r\nhost: gw\r\nx-slow: ")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(gw).await.unwrap();
    // Meanwhile, other clients are served.
    for _ in 0..5 {
        assert_eq!(one_answer(gw).await, 200);
    }
    assert!(
        closed(&mut slow).await,
        "a half-sent head kept its connection"
    );
    assert!(closed(&mut silent).await, "a silent connection stayed open");
    // A keep-alive client that starts its next head and stalls is cut off too.
    let mut keep = TcpStream::connect(gw).await.unwrap();
    assert_eq!(request(&mut keep).await, 200);
    keep.write_all(b"GET /svc/x HT").await.unwrap();
    assert!(closed(&mut keep).await);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let (gateway, _dir, _upstream) =
        start("idle_timeout_ms = 2000\nheader_read_timeout_ms = 0").await;
    let mut c = TcpStream::connect(gateway.addr()).await.unwrap();
    assert_eq!(request(&mut c).await, 200);
    assert_eq!(request(&mut c).await, 200);
    assert!(closed(&mut c).await, "an idle connection stayed open");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_gets_431() {
    let (gateway, _dir, _upstream) = start("max_header_bytes = 8192").await;
    let mut c = TcpStream::connect(gateway.addr()).await.unwrap();
    let big = "a".repeat(16 * 1024);
    c.write_all(format!("GET /svc/x HTTP/1.1\r\nhost: gw\r\nx-big: {big}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(WAIT, c.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A head within the limit is served.
    assert_eq!(one_answer(gateway.addr()).await, 200);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_until_one_closes() {
    let (gateway, _dir, _upstream) = start("max_connections = 2").await;
    let gw = gateway.addr();
    let mut first = TcpStream::connect(gw).await.unwrap();
    let mut second = TcpStream::connect(gw).await.unwrap();
    assert_eq!(request(&mut first).await, 200);
    assert_eq!(request(&mut second).await, 200);
    // The third connects (the kernel's backlog) and sends its request, but is not served
    // while two are open.
    let (sent, sent_rx) = tokio::sync::oneshot::channel();
    let third = tokio::spawn(async move {
        let mut third = TcpStream::connect(gw).await.unwrap();
        third
            .write_all(b"GET /svc/x HTTP/1.1\r\nhost: gw\r\n\r\n")
            .await
            .unwrap();
        let _ = sent.send(());
        answer(&mut third).await
    });
    tokio::time::timeout(WAIT, sent_rx)
        .await
        .expect("the third request is sent")
        .unwrap();
    // Proof of progress rather than a pause: the gateway answers twenty more requests, each
    // a round trip to the upstream, on the open connections while the third waits.
    for _ in 0..10 {
        assert_eq!(request(&mut first).await, 200);
        assert_eq!(request(&mut second).await, 200);
    }
    assert!(!third.is_finished(), "served past the cap");
    drop(first);
    let status = tokio::time::timeout(WAIT, third)
        .await
        .expect("served once one closed")
        .unwrap();
    assert_eq!(status, 200);
    drop(second);
    gateway.shutdown().await;
}

/// `max_in_flight_per_instance`: with its one instance holding two requests, a third gets
/// 503 at once, naming the limit, and is never sent to it; once one is answered, the next
/// request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_at_its_in_flight_cap_is_sent_nothing_more() {
    let (arrived_tx, mut arrived) = tokio::sync::mpsc::unbounded_channel::<()>();
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = {
        let release = release.clone();
        serve(Router::new().fallback(any(move || {
            let (arrived, release) = (arrived_tx.clone(), release.clone());
            async move {
                let _ = arrived.send(());
                release.acquire().await.unwrap().forget();
                "ok"
            }
        })))
        .await
    };
    let (gateway, _dir, _upstream) = start_with("max_in_flight_per_instance = 2", held).await;
    let url = format!("http://{}/svc/x", gateway.addr());
    let client = gray_tests::reqwest_client();
    let get = |client: reqwest::Client, url: String| {
        tokio::spawn(async move { client.get(url).send().await.unwrap().status().as_u16() })
    };
    let first = get(client.clone(), url.clone());
    let second = get(client.clone(), url.clone());
    for _ in 0..2 {
        tokio::time::timeout(WAIT, arrived.recv())
            .await
            .expect("the instance holds two requests")
            .unwrap();
    }
    let third = client.get(&url).send().await.unwrap();
    assert_eq!(third.status(), 503);
    let body = third.text().await.unwrap();
    assert!(
        body.contains("at its limit of 2 requests in flight"),
        "{body}"
    );
    assert!(
        arrived.try_recv().is_err(),
        "the refused request reached the instance"
    );
    // One answer frees a place.
    release.add_permits(1);
    let done = tokio::time::timeout(WAIT, async {
        loop {
            if first.is_finished() || second.is_finished() {
                return;
            }
            tokio::task::yield_now().await;
        }
    });
    done.await.expect("one held request is answered");
    let fourth = get(client.clone(), url.clone());
    tokio::time::timeout(WAIT, arrived.recv())
        .await
        .expect("the next request reaches the instance")
        .unwrap();
    release.add_permits(2);
    for call in [first, second, fourth] {
        assert_eq!(
            tokio::time::timeout(WAIT, call).await.unwrap().unwrap(),
            200
        );
    }
    gateway.shutdown().await;
}

/// The statuses of `n` answers read from `stream`.
async fn answers(stream: &mut TcpStream, n: usize) -> Vec<u16> {
    let answers = gray_test_support::net::read_answers(stream, n).await;
    answers.into_iter().map(|a| a.status).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_keep_alive_connections_serve_what_their_clients_send_next() {
    // Every idle connection parked at once: its buffers dropped between requests. The
    // upstream reads each request body whole (hyper closes a connection whose request body
    // nobody read and that has not all arrived).
    let upstream = serve(Router::new().fallback(any(|_: axum::body::Bytes| async { "ok" }))).await;
    let (gateway, _dir, _upstream) = start_with("release_buffers_above = 0", upstream).await;
    let gw = gateway.addr();
    let get = b"GET /svc/x HTTP/1.1\r\nhost: gw\r\n\r\n";
    let mut c = TcpStream::connect(gw).await.unwrap();
    assert_eq!(request(&mut c).await, 200);
    // Pipelined requests and the start of one more, then its end.
    let mut batch = get.repeat(3);
    batch.extend_from_slice(b"GET /svc/x HTTP/1.1\r\nho");
    c.write_all(&batch).await.unwrap();
    assert_eq!(answers(&mut c, 3).await, [200, 200, 200]);
    c.write_all(b"st: gw\r\n\r\n").await.unwrap();
    assert_eq!(answers(&mut c, 1).await, [200]);
    // A body sent in two writes, a chunked one, then a request without one.
    c.write_all(b"POST /svc/x HTTP/1.1\r\nhost: gw\r\ncontent-length: 6\r\n\r\nabc")
        .await
        .unwrap();
    c.write_all(b"def").await.unwrap();
    assert_eq!(answers(&mut c, 1).await, [200]);
    c.write_all(b"POST /svc/x HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(answers(&mut c, 1).await, [200]);
    assert_eq!(request(&mut c).await, 200);

    // A pooled client reusing its connections across parks.
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for i in 0..40 {
        let url = format!("http://{gw}/svc/x");
        let response = if i % 2 == 0 {
            client.get(&url).send().await
        } else {
            client.post(&url).body(vec![b'x'; 10_000]).send().await
        }
        .unwrap();
        assert_eq!(response.status(), 200, "request {i}");
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    gateway.shutdown().await;
}

/// A client that reads nothing of a large response: `send_timeout_ms` closes its
/// connection, and the cut is logged (WARN) with the service and the instance, where it
/// was a DEBUG line naming the peer only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cut_by_the_send_timeout_is_logged_with_its_service_and_instance() {
    let logs = gray_test_support::logs::capture_process();
    // 64 MiB: more than the sockets' buffers hold for a client that reads nothing
    let big = || async { vec![b'x'; 64 << 20] };
    let upstream = serve(Router::new().fallback(any(big))).await;
    let (gw, _dir, _up) = start_with("send_timeout_ms = 1000\n", upstream).await;
    let mut stream = TcpStream::connect(gw.addr()).await.unwrap();
    stream
        .write_all(b"GET /svc/big HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let line = logs
        .line_with(
            &["a response was cut", "svc", "svc-1", "send_timeout_ms"],
            WAIT,
        )
        .await;
    assert!(line.contains("WARN"), "{line}");
    assert!(closed(&mut stream).await, "the connection is closed");
    gw.shutdown().await;
}
