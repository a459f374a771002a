//! The gateway holds an upstream's response head until the first frame of its body, so
//! that an upstream that sends a head and then fails gets the client a 502 it can act on,
//! not a closed connection; and it holds it no longer than its bound, so that a streaming
//! response (server-sent events) is not held back until its first event.
//!
//! Real gateway, reqwest clients, raw TCP upstreams on loopback. The runtime is the test's
//! current thread, so the gateway's events reach the subscriber set for it.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT, net};
use gray_tests::one_instance_gateway;
use tokio::{io::AsyncWriteExt, sync::Notify};
use tracing::field::{Field, Visit};
use tracing_subscriber::{layer::SubscriberExt, registry::LookupSpan};

/// The gateway of `gray_tests::one_instance_gateway`.
async fn gateway(upstream: SocketAddr) -> (Gateway, TempDir) {
    one_instance_gateway("gateway-head", upstream, true).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client")
}

/// The fields of the WARN events of the gateway, as `name=value` text.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0 += &format!("{}={value:?} ", field.name());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0 += &format!("{}={value} ", field.name());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().expect("not poisoned").push(fields.0);
        }
    }
}

#[tokio::test]
async fn an_upstream_that_resets_after_its_head_gets_the_client_a_502() {
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    // Every connection: a head that announces 100 bytes, then a reset (no byte of body).
    let (upstream, _) = net::serve(|mut stream| async move {
        if net::read_head(&mut stream).await {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
                .await;
            let _ = stream.flush().await;
            let _ = stream.set_zero_linger();
        }
    })
    .await;
    let (gateway, _dir) = gateway(upstream).await;

    let res = tokio::time::timeout(
        WAIT,
        client()
            .get(format!("http://{}/svc/x", gateway.addr()))
            .send(),
    )
    .await
    .expect("answered in time")
    .expect("an answer, not a closed connection");
    assert_eq!(res.status(), 502);
    let body: serde_json::Value = res.json().await.expect("a JSON body");
    assert_eq!(body["service"], "svc");
    assert_eq!(
        body["instance"], "svc-1",
        "the answer names the instance: {body}"
    );

    // Counted as the instance's failure, and logged with it.
    let admin = gateway.admin_addr().expect("admin");
    let metrics = client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains(r#"gray_gateway_requests_total{service="svc",lane="baseline",instance="svc-1",status="502"} 1"#),
        "{metrics}"
    );
    assert!(
        !metrics.contains(r#"instance="svc-1",status="200""#),
        "the head's status is not counted: {metrics}"
    );
    let logged = warnings.0.lock().expect("not poisoned").clone();
    assert!(
        logged
            .iter()
            .any(|w| w.contains("instance=svc-1") && w.contains("502")),
        "a WARN names the instance: {logged:?}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_streaming_response_gets_its_head_before_its_first_event() {
    // A server-sent-events upstream: the head at once, the first event only when the test
    // says so, after the client has the head.
    let first_event = Arc::new(Notify::new());
    let (upstream, _) = net::serve({
        let first_event = first_event.clone();
        move |mut stream| {
            let first_event = first_event.clone();
            async move {
                if !net::read_head(&mut stream).await {
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                first_event.notified().await;
                let _ = stream
                    .write_all(b"d\r\ndata: first\n\n\r\n0\r\n\r\n")
                    .await;
            }
        }
    })
    .await;
    let (gateway, _dir) = gateway(upstream).await;

    // The head arrives although no event was sent: the hold is bounded.
    let mut res = tokio::time::timeout(
        WAIT,
        client()
            .get(format!("http://{}/svc/events", gateway.addr()))
            .send(),
    )
    .await
    .expect("the head arrives before the first event")
    .expect("an answer");
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    first_event.notify_one();
    let chunk = tokio::time::timeout(WAIT, res.chunk())
        .await
        .expect("the event arrives in time")
        .expect("a chunk")
        .expect("not the end");
    assert_eq!(&chunk[..], b"data: first\n\n");
    gateway.shutdown().await;
}
