//! The gateway in front of HTTPS and HTTP/2 instances: real rustls servers on loopback with
//! certificates from test CAs, a real reqwest client.
//!
//! The right CA routes (baseline and gray by stain); the wrong CA or the wrong server name
//! gives a 502, a log line naming the instance and the reason, and the instance's
//! ejection (in `/explain`); mutual TLS routes with the client certificate and fails
//! without; one HTTP/2 connection (h2c, and h2 over TLS by ALPN) carries 1,000 concurrent
//! requests; a black-holed HTTP/2 instance is ejected once its keep-alive PING goes
//! unanswered.

use std::net::SocketAddr;

use futures_util::future::join_all;
use gray_gateway::Gateway;
use gray_test_support::{
    TempDir,
    https::{Upstream, server_config},
    tls::{Ca, Leaf},
};
use gray_tests::reqwest_builder;

/// Writes `instances.toml` (`gray-1` labelled gray, `base-1`; addresses as given), a rule
/// that stains `x-tester` requests gray, and `gateway.toml` with `service` as the
/// `[services.svc]` keys; starts the gateway.
async fn gateway(dir: &TempDir, gray: &str, base: &str, service: &str) -> Gateway {
    gateway_with(dir, gray, base, "", service).await
}

/// [`gateway`] with the top-level keys `top` too.
async fn gateway_with(dir: &TempDir, gray: &str, base: &str, top: &str, service: &str) -> Gateway {
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"gray-1\"\naddress = \"{gray}\"\nlabels = {{ gray = true }}\n\n\
             [[services.svc]]\nid = \"base-1\"\naddress = \"{base}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules.toml"), gray_tests::TESTERS_RULES).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\
             instances = \"instances.toml\"\n{top}\n[services.svc]\npreset = \"seed-000\"\n{service}\n"
        ),
    )
    .unwrap();
    gray_tests::start_gateway(dir.path()).await
}

/// `GET /svc/item` through the gateway (stained gray with `gray`): status, body.
async fn get(gw: SocketAddr, gray: bool) -> (u16, String) {
    let client = reqwest_builder().build().unwrap();
    let mut request = client.get(format!("http://{gw}/svc/item"));
    if gray {
        request = request.header("x-tester", "1");
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The availability `/explain` shows for a gray request's candidates.
async fn explained(admin: SocketAddr) -> String {
    reqwest_builder()
        .build()
        .unwrap()
        .post(format!("http://{admin}/explain"))
        .body(r#"{"path": "/svc/item", "headers": {"x-tester": "1"}}"#)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_with_the_right_ca_are_routed_by_stain() {
    let dir = TempDir::new("up-tls-ok");
    let ca = Ca::new("upstream CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let gray = Upstream::start("gray-1", Some(server_config(&cert, None))).await;
    let base = Upstream::start("base-1", Some(server_config(&cert, None))).await;
    ca.write(dir.path(), "ca");
    // One instance by an `https://` address, one by `host:port`: the table makes both TLS.
    let gw = gateway(
        &dir,
        &format!("https://{}", gray.addr()),
        &base.addr().to_string(),
        "[services.svc.tls]\nca_file = \"ca.pem\"\n",
    )
    .await;
    for _ in 0..3 {
        assert_eq!(
            get(gw.addr(), true).await,
            (200, "gray-1 HTTP/1.1 /item lane=gray".into())
        );
        assert_eq!(
            get(gw.addr(), false).await,
            (200, "base-1 HTTP/1.1 /item lane=-".into())
        );
    }
    assert_eq!(
        gray.handshakes() + base.handshakes(),
        2,
        "connections are kept"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_a_wrong_name_is_a_502_logged_and_ejects_the_instance() {
    let logs = gray_test_support::logs::capture_process();
    let ca = Ca::new("upstream CA");
    let other = Ca::new("another CA");
    let by_ip = ca.issue(&Leaf::server(&["127.0.0.1"]));
    let by_name = ca.issue(&Leaf::server(&["orders.internal"]));
    for (tag, cert, trusted, reason) in [
        ("up-tls-ca", &by_ip, &other, "UnknownIssuer"),
        ("up-tls-name", &by_name, &ca, "not valid for name"),
    ] {
        let dir = TempDir::new(tag);
        let gray = Upstream::start("gray-1", Some(server_config(cert, None))).await;
        let base = Upstream::start("base-1", Some(server_config(cert, None))).await;
        trusted.write(dir.path(), "ca");
        // One connection error ejects; the probe waits long; no retry hides the error.
        let gw = gateway(
            &dir,
            &gray.addr().to_string(),
            &base.addr().to_string(),
            "retry = { enabled = false }\n\
             health_check = { max_fails = 1, interval_ms = 60000, max_interval_ms = 60000 }\n\
             [services.svc.tls]\nca_file = \"ca.pem\"\n",
        )
        .await;
        let admin = gw.admin_addr().expect("admin");
        let before = explained(admin).await;
        assert!(before.contains(r#""candidates":["gray-1"]"#), "{before}");
        let (status, body) = get(gw.addr(), true).await;
        assert_eq!(status, 502, "{body}");
        assert!(body.contains("TLS handshake failed"), "{body}");
        let address = format!("https://{}", gray.addr());
        let line = logs
            .line_with(
                &[
                    "TLS handshake with the instance failed",
                    "gray-1",
                    &address,
                    reason,
                ],
                gray_test_support::WAIT,
            )
            .await;
        assert!(line.contains("WARN"), "{line}");
        assert_eq!(gray.handshakes(), 0);
        // Ejected: the gray subset has no ready instance, gray requests fall back.
        // (The balancer's task applies the ejection: wait for it, bounded.)
        let deadline = tokio::time::Instant::now() + gray_test_support::WAIT;
        loop {
            let after = explained(admin).await;
            if after.contains(r#"{"present":0,"ready":0,"subset":{"lane":"gray"}}"#)
                && after.contains(r#""candidates":["base-1"],"fallback":true"#)
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not ejected: {after}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_routes_with_the_client_certificate_only() {
    let dir = TempDir::new("up-mtls");
    let ca = Ca::new("upstream CA");
    let cert = ca.issue(&Leaf::server(&["svc.internal"]));
    let client = ca.issue(&Leaf::client("the gateway"));
    let gray = Upstream::start("gray-1", Some(server_config(&cert, Some(&ca)))).await;
    let base = Upstream::start("base-1", Some(server_config(&cert, Some(&ca)))).await;
    ca.write(dir.path(), "ca");
    client.write(dir.path(), "client");
    let gw = gateway(
        &dir,
        &gray.addr().to_string(),
        &base.addr().to_string(),
        "[services.svc.tls]\nca_file = \"ca.pem\"\nserver_name = \"svc.internal\"\n\
         cert_file = \"client.pem\"\nkey_file = \"client-key.pem\"\n",
    )
    .await;
    assert_eq!(
        get(gw.addr(), true).await,
        (200, "gray-1 HTTP/1.1 /item lane=gray".into())
    );
    assert_eq!(
        get(gw.addr(), false).await,
        (200, "base-1 HTTP/1.1 /item lane=-".into())
    );
    gw.shutdown().await;

    // The same without the client certificate: the instances refuse the handshake.
    let gw = gateway(
        &dir,
        &gray.addr().to_string(),
        &base.addr().to_string(),
        "retry = { enabled = false }\n\
         [services.svc.tls]\nca_file = \"ca.pem\"\nserver_name = \"svc.internal\"\n",
    )
    .await;
    let (status, body) = get(gw.addr(), false).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(
        gray.handshakes() + base.handshakes(),
        2,
        "only the gateway with the certificate"
    );
    gw.shutdown().await;
}

/// 1,000 concurrent requests through the gateway, over one HTTP/2 client connection;
/// every answer says `HTTP/2.0`.
async fn a_thousand(gw: SocketAddr) {
    let client = reqwest_builder().http2_prior_knowledge().build().unwrap();
    let answers = join_all((0..1_000).map(|i| {
        let client = client.clone();
        async move {
            let mut request = client.get(format!("http://{gw}/svc/item"));
            if i % 2 == 0 {
                request = request.header("x-tester", "1");
            }
            let response = request.send().await.unwrap();
            (
                i,
                response.status().as_u16(),
                response.text().await.unwrap(),
            )
        }
    }))
    .await;
    for (i, status, body) in answers {
        let want = if i % 2 == 0 {
            "gray-1 HTTP/2.0 /item lane=gray"
        } else {
            "base-1 HTTP/2.0 /item lane=-"
        };
        assert_eq!((status, body.as_str()), (200, want));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http2_connection_per_instance_carries_a_thousand_concurrent_requests() {
    // h2c: HTTP/2 in cleartext, by prior knowledge.
    let dir = TempDir::new("up-h2c");
    let gray = Upstream::start("gray-1", None).await;
    let base = Upstream::start("base-1", None).await;
    let gw = gateway(
        &dir,
        &gray.addr().to_string(),
        &base.addr().to_string(),
        "protocol = \"h2c\"\n",
    )
    .await;
    a_thousand(gw.addr()).await;
    assert_eq!(
        (gray.accepted(), base.accepted()),
        (1, 1),
        "one connection each"
    );
    gw.shutdown().await;

    // h2 over TLS, chosen by ALPN.
    let dir = TempDir::new("up-h2-tls");
    let ca = Ca::new("upstream CA");
    let cert = ca.issue(&Leaf::server(&["127.0.0.1"]));
    ca.write(dir.path(), "ca");
    let gray = Upstream::start("gray-1", Some(server_config(&cert, None))).await;
    let base = Upstream::start("base-1", Some(server_config(&cert, None))).await;
    let gw = gateway(
        &dir,
        &format!("https://{}", gray.addr()),
        &format!("https://{}", base.addr()),
        "protocol = \"auto\"\n[services.svc.tls]\nca_file = \"ca.pem\"\n",
    )
    .await;
    a_thousand(gw.addr()).await;
    // ALPN's answer is learned on a first connection, which then carries the requests.
    assert_eq!(
        (gray.handshakes(), base.handshakes()),
        (1, 1),
        "one connection each"
    );
    gw.shutdown().await;
}

/// A black-holed HTTP/2 instance: it accepts, then answers nothing, not even a PING (a
/// host behind a dead route keeps the connection open). With keep-alive PINGs, the first
/// gray request on it fails once the PING goes unanswered, the instance is ejected at
/// once, and that request (a GET, retried) and every later one fall back to baseline:
/// no 504 after the upstream timeout, no wait for TCP to give up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_http2_instance_is_ejected_when_its_ping_goes_unanswered() {
    let dir = TempDir::new("up-h2-black-hole");
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_addr = hole.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hole.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            held.push(socket);
        }
    });
    let base = Upstream::start("base-1", None).await;
    let gw = gateway_with(
        &dir,
        &hole_addr.to_string(),
        &base.addr().to_string(),
        "upstream_timeout_ms = 60000\nupstream_http2_keep_alive_interval_ms = 300\n\
         upstream_http2_keep_alive_timeout_ms = 300\n",
        "protocol = \"h2c\"\nhealth_check = { interval_ms = 60000, max_interval_ms = 60000 }\n",
    )
    .await;
    let started = std::time::Instant::now();
    let (status, body) = get(gw.addr(), true).await;
    let first = started.elapsed();
    assert_eq!(
        (status, body.as_str()),
        (200, "base-1 HTTP/2.0 /item lane=gray")
    );
    assert_eq!(accepted.load(std::sync::atomic::Ordering::Relaxed), 1);
    eprintln!("the first gray request, on the black hole: answered by baseline after {first:?}");
    let admin = gw.admin_addr().expect("admin");
    let deadline = tokio::time::Instant::now() + gray_test_support::WAIT;
    loop {
        let after = explained(admin).await;
        if after.contains(r#"{"present":0,"ready":0,"subset":{"lane":"gray"}}"#) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ejected: {after}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for _ in 0..20 {
        assert_eq!(get(gw.addr(), true).await.0, 200);
    }
    gw.shutdown().await;
}
