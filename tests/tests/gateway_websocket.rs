//! WebSocket through the gateway, with the ecosystem's client and server
//! (tokio-tungstenite) on loopback: unstained and stained connections reach their lanes
//! (1,000 echoes each), over the TLS listener to an `https://` instance too; a connection
//! that pings is held past the upgraded idle timeout, one that is silent is closed with
//! 1001; `max_upgraded` refuses with 503; a rollback closes the gray lane's connections
//! with 1012, paced, while baseline's stay open; a shutdown closes them with 1001.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use futures_util::{SinkExt, StreamExt};
use gray_gateway::Gateway;
use gray_test_support::{
    TempDir, WAIT,
    https::{client_config, server_config},
    tls::{Ca, Leaf},
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
};
use tokio_rustls::{TlsAcceptor, TlsConnector, rustls};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        client::IntoClientRequest,
        protocol::{CloseFrame, frame::coding::CloseCode},
    },
};

/// A WebSocket instance that answers each text message `m` with `{id}:{m}`, over TLS with
/// `tls` (ALPN `http/1.1`).
async fn instance(id: &'static str, tls: Option<Arc<rustls::ServerConfig>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tls.map(|config| {
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    });
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    Some(acceptor) => {
                        if let Ok(tls) = acceptor.accept(tcp).await {
                            echo(id, tls).await;
                        }
                    }
                    None => echo(id, tcp).await,
                }
            });
        }
    });
    addr
}

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(id: &'static str, io: S) {
    let Ok(mut ws) = tokio_tungstenite::accept_async(io).await else {
        return;
    };
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Text(text) = message
            && ws
                .send(Message::text(format!("{id}:{}", text.as_str())))
                .await
                .is_err()
        {
            return;
        }
    }
}

const RULES: &str = r#"
[[rules]]
name = "testers"
when = { header = { name = "x-tester", present = true } }
lane = "gray"

[[rules]]
name = "canary"
when = { sticky = { by = { header = "x-user" }, percent = 0 } }
lane = "gray"
"#;

/// A gateway in `dir` over `gray` (labelled gray) and `base`, with the top-level keys `top`
/// and the `[services.svc]` keys `service`.
async fn gateway(dir: &TempDir, gray: &str, base: &str, top: &str, service: &str) -> Gateway {
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"gray-1\"\naddress = \"{gray}\"\nlabels = {{ gray = true }}\n\n\
             [[services.svc]]\nid = \"base-1\"\naddress = \"{base}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules.toml"), RULES).unwrap();
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

/// A gateway over two plaintext instances, `gray-1` and `base-1`, with the top-level keys
/// `top` and the `[services.svc]` keys `service`.
async fn plain(tag: &str, top: &str, service: &str) -> (TempDir, Gateway) {
    let dir = TempDir::new(tag);
    let gray = instance("gray-1", None).await.to_string();
    let base = instance("base-1", None).await.to_string();
    let gw = gateway(&dir, &gray, &base, top, service).await;
    (dir, gw)
}

/// A WebSocket to `/svc/ws` over `io`, stained gray by the testers' header with `gray`.
async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    io: S,
    url: &str,
    gray: bool,
) -> WebSocketStream<S> {
    let mut request = url.into_client_request().unwrap();
    if gray {
        request
            .headers_mut()
            .insert("x-tester", "1".parse().unwrap());
    }
    let (ws, response) = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, io))
        .await
        .expect("the handshake within the bound")
        .expect("the gateway switches protocols");
    assert_eq!(response.status(), 101);
    ws
}

async fn connect(gw: SocketAddr, gray: bool) -> WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(gw).await.unwrap();
    open(tcp, &format!("ws://{gw}/svc/ws"), gray).await
}

/// Sends `text` and returns the answer.
async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    text: &str,
) -> String {
    ws.send(Message::text(text)).await.expect("sent");
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return t.as_str().to_owned(),
            Ok(Some(Ok(Message::Pong(_) | Message::Ping(_)))) => {}
            other => panic!("no echo of {text}: {other:?}"),
        }
    }
}

/// The close frame the connection receives next (within `bound`), skipping messages.
async fn closed_with<S: AsyncRead + AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<S>,
    bound: Duration,
) -> Option<CloseFrame> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => return frame,
            Ok(Some(Ok(_))) => {}
            other => panic!("no close frame: {other:?}"),
        }
    }
}

async fn metrics(gw: &Gateway) -> String {
    gray_tests::admin_text(gw.admin_addr().unwrap(), "/metrics").await
}

/// `/metrics` once it shows `line`, within [`WAIT`].
async fn metrics_with(gw: &Gateway, line: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = metrics(gw).await;
        if text.contains(line) {
            return text;
        }
        assert!(Instant::now() < deadline, "{line} not in {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_reach_their_lane_and_echo_a_thousand_messages() {
    let (_dir, gw) = plain("ws-lanes", "", "").await;
    for (stained, id) in [(false, "base-1"), (true, "gray-1")] {
        let mut ws = connect(gw.addr(), stained).await;
        for i in 0..1000 {
            assert_eq!(
                round_trip(&mut ws, &format!("m{i}")).await,
                format!("{id}:m{i}")
            );
        }
        ws.close(None).await.unwrap();
        // The close handshake goes through: the instance's answer ends the stream.
        while let Some(Ok(_)) = tokio::time::timeout(WAIT, ws.next()).await.unwrap() {}
    }
    // A forged stain is stripped on the upgrade as on any request: baseline.
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let mut request = format!("ws://{}/svc/ws", gw.addr())
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-gray-lane", "gray".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(round_trip(&mut ws, "forged").await, "base-1:forged");
    drop(ws);

    let text = metrics_with(
        &gw,
        r#"gray_gateway_upgraded_open{service="svc",lane="baseline"} 0"#,
    )
    .await;
    for line in [
        r#"gray_gateway_upgraded_opened_total{service="svc",lane="gray"} 1"#,
        r#"gray_gateway_upgraded_opened_total{service="svc",lane="baseline"} 2"#,
        r#"gray_gateway_upgraded_closed_total{service="svc",lane="gray",reason="peer"} 1"#,
        r#"gray_gateway_requests_total{service="svc",lane="gray",instance="gray-1",status="101"} 1"#,
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // Every byte counted, frames included: 1,000 masked frames of "m0" … "m999" up (6
    // bytes of header and mask each) and the client's close (6); down, the echoes with
    // "gray-1:" (2 bytes of header each) and the instance's close (2).
    let payload: u64 = (0..1000).map(|i| format!("m{i}").len() as u64).sum();
    let bytes = |direction: &str| {
        let series = format!(
            r#"gray_gateway_upgraded_bytes_total{{service="svc",lane="gray",direction="{direction}"}} "#
        );
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{series} in {text}"))
    };
    assert_eq!(bytes("up"), payload + 1000 * 6 + 6);
    assert_eq!(bytes("down"), payload + 1000 * (7 + 2) + 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_the_tls_listener_to_an_https_instance() {
    let dir = TempDir::new("ws-tls");
    let ca = Ca::new("websocket test CA");
    ca.write(dir.path(), "ca");
    let cert = ca.issue(&Leaf::server(&["localhost", "127.0.0.1"]));
    let (cert_file, key_file) = cert.write(dir.path(), "gateway");
    let gray = instance("gray-1", Some(server_config(&cert, None))).await;
    let base = instance("base-1", Some(server_config(&cert, None))).await;
    let gw = gateway(
        &dir,
        &format!("https://{gray}"),
        &format!("https://{base}"),
        &format!(
            "[tls]\nlisten = \"127.0.0.1:0\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
            cert_file.display(),
            key_file.display()
        ),
        "[services.svc.tls]\nca_file = \"ca.pem\"\n",
    )
    .await;
    let mut config = client_config(&ca, None);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    for (stained, id) in [(false, "base-1"), (true, "gray-1")] {
        let tcp = TcpStream::connect(gw.tls_addr().unwrap()).await.unwrap();
        let tls = connector
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("TLS to the gateway");
        let url = format!("wss://localhost:{}/svc/ws", gw.tls_addr().unwrap().port());
        let mut ws = open(tls, &url, stained).await;
        for i in 0..100 {
            assert_eq!(
                round_trip(&mut ws, &format!("t{i}")).await,
                format!("{id}:t{i}")
            );
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinging_websocket_outlives_the_idle_timeout_and_a_silent_one_gets_1001() {
    let (_dir, gw) = plain("ws-idle", "upgraded_idle_timeout_ms = 3000\n", "").await;
    let mut silent = connect(gw.addr(), false).await;
    let mut pinging = connect(gw.addr(), true).await;
    // A minute with a ping every second: never idle for the timeout.
    let started = Instant::now();
    let mut pings = 0;
    let silent_closed =
        tokio::spawn(async move { closed_with(&mut silent, Duration::from_secs(30)).await });
    while started.elapsed() < Duration::from_secs(60) {
        pinging
            .send(Message::Ping(vec![pings as u8].into()))
            .await
            .unwrap();
        pings += 1;
        // Waits for the pong, which the instance's WebSocket sends by itself.
        match tokio::time::timeout(WAIT, pinging.next()).await {
            Ok(Some(Ok(Message::Pong(_)))) => {}
            other => panic!("no pong after {:?}: {other:?}", started.elapsed()),
        }
        // The client's pace (the scenario), not a synchronisation.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        round_trip(&mut pinging, "still here").await,
        "gray-1:still here"
    );
    let frame = silent_closed.await.unwrap().expect("a close frame");
    assert_eq!(frame.code, CloseCode::Away, "{frame:?}");
    let text = metrics(&gw).await;
    assert!(
        text.contains(
            r#"gray_gateway_upgraded_closed_total{service="svc",lane="baseline",reason="idle"} 1"#
        ),
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_upgraded_refuses_with_503_and_a_shutdown_closes_with_1001() {
    let (_dir, gw) = plain("ws-cap", "max_upgraded = 2\n", "").await;
    let mut a = connect(gw.addr(), false).await;
    let mut b = connect(gw.addr(), true).await;
    let tcp = TcpStream::connect(gw.addr()).await.unwrap();
    let request = format!("ws://{}/svc/ws", gw.addr())
        .into_client_request()
        .unwrap();
    match tokio_tungstenite::client_async(request, tcp).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned();
            assert!(body.contains("max_upgraded"), "{body}");
        }
        other => panic!("expected a 503, got {other:?}"),
    }
    // Plain requests still go.
    let status = gray_tests::reqwest_builder()
        .build()
        .unwrap()
        .get(format!("http://{}/svc/x", gw.addr()))
        .send()
        .await;
    assert!(status.is_ok());
    assert_eq!(round_trip(&mut a, "a").await, "base-1:a");
    let shutdown = tokio::spawn(gw.shutdown());
    for ws in [&mut a, &mut b] {
        let frame = closed_with(ws, WAIT).await.expect("a close frame");
        assert_eq!(frame.code, CloseCode::Away, "{frame:?}");
    }
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("the shutdown ends")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_closes_the_gray_lanes_websockets_with_1012_paced_and_keeps_baselines() {
    let (_dir, gw) = plain(
        "ws-rollback",
        "upgraded_close_per_second = 5\n[rollouts]\ninterval_ms = 100\n",
        "[services.svc.rollout]\nrule = \"canary\"\nsteps = [20, 50, 100]\nhold_ms = 600000\n\
         min_users = 10\n",
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let client = gray_tests::reqwest_builder().build().unwrap();
    let started = client
        .post(format!("http://{admin}/rollouts/svc"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
    let mut grays = Vec::new();
    for _ in 0..10 {
        grays.push(connect(gw.addr(), true).await);
    }
    let mut bases = Vec::new();
    for _ in 0..3 {
        bases.push(connect(gw.addr(), false).await);
    }
    let aborted = client
        .post(format!("http://{admin}/rollouts/svc/abort"))
        .send()
        .await
        .unwrap();
    assert_eq!(aborted.status(), 200);
    let closes = futures_util::future::join_all(grays.iter_mut().map(|ws| async move {
        let frame = closed_with(ws, Duration::from_secs(30))
            .await
            .expect("a close frame");
        (frame.code, Instant::now())
    }))
    .await;
    assert!(
        closes.iter().all(|(code, _)| *code == CloseCode::Restart),
        "{closes:?}"
    );
    // Paced: 10 closes at 5 a second are at least 1.8 s apart from first to last (the
    // pacing's ticks never come early); half that leaves room for a delayed first one.
    let first = closes.iter().map(|(_, at)| *at).min().unwrap();
    let last = closes.iter().map(|(_, at)| *at).max().unwrap();
    assert!(
        last - first >= Duration::from_millis(900),
        "all closed within {:?}",
        last - first
    );
    // Baseline's connections stay open and echo.
    for ws in &mut bases {
        assert_eq!(round_trip(ws, "after").await, "base-1:after");
    }
    let text = metrics_with(
        &gw,
        r#"gray_gateway_upgraded_closed_total{service="svc",lane="gray",reason="rollback"} 10"#,
    )
    .await;
    assert!(
        text.contains(r#"gray_gateway_upgraded_open{service="svc",lane="baseline"} 3"#),
        "{text}"
    );
    gw.shutdown().await;
}
