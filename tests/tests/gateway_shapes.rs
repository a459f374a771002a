//! What a reverse proxy carries, tried with the shapes users bring (issue 31): real
//! servers and clients on loopback, raw sockets where the shape is a byte sequence.
//!
//! - requests the gateway refuses or fixes before routing: HTTP/1.1 without `Host` (400),
//!   an absolute-form target (its authority is the `Host` the instance gets), `CONNECT`
//!   (405), `OPTIONS *` (the gateway's own 204);
//! - clients that abandon their uploads, after `100 Continue` and mid-body, 20 times in a
//!   row each and while other clients keep asking: no other client sees anything but 200,
//!   the instance is never ejected, the aborts are counted as 499;
//! - an instance that closes an idle keep-alive connection just as the gateway reuses it:
//!   an idempotent request without a body goes again on a new connection (0 errors), a
//!   POST with a body does not;
//! - HTTP/1.1 trailers both ways, with `TE: trailers` and `Trailer:`;
//! - a gRPC call whose instance fails mid-stream ends with `grpc-status: 14`
//!   (`UNAVAILABLE`) in trailers, not a reset stream;
//! - an idle HTTP/2 connection whose client sends keep-alive PINGs is judged by
//!   `idle_timeout_ms`, not by the request-head timeout;
//! - an HTTP/2 instance that refuses its streams (`REFUSED_STREAM`): every request, POSTs
//!   included, is served by the other instance.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use gray_test_support::TempDir;
use gray_tests::{loopback_listener, reqwest_builder, start_gateway, until};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const WAIT: Duration = Duration::from_secs(20);

/// A gateway routing `svc` to `upstream` (one instance), with `keys` added to the
/// `[services.svc]` table and `top` at the top of the configuration.
async fn gateway(
    tag: &str,
    upstream: SocketAddr,
    top: &str,
    keys: &str,
) -> (gray_gateway::Gateway, TempDir) {
    let dir = TempDir::new(tag);
    std::fs::write(
        dir.path().join("instances.toml"),
        format!("[[services.svc]]\nid = \"svc-1\"\naddress = \"{upstream}\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\n{top}\n\
             [services.svc]\n{keys}\n"
        ),
    )
    .unwrap();
    (start_gateway(dir.path()).await, dir)
}

/// Writes `raw` to the gateway on a connection of its own and reads the answer until the
/// gateway closes it (each request says `Connection: close`), within [`WAIT`].
async fn raw(gw: SocketAddr, raw: &str) -> String {
    let mut stream = TcpStream::connect(gw).await.unwrap();
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut out))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// The status line's code of a raw answer.
fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or("")
}

/// An instance answering every request with the `Host` it received.
async fn host_echo() -> gray_tests::Server {
    gray_tests::serve(
        axum::Router::new().fallback(|headers: HeaderMap| async move {
            headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_the_gateway_refuses_or_fixes_before_routing() {
    let instance = host_echo().await;
    let (gw, _dir) = gateway("shapes-targets", instance.addr(), "", "").await;
    let gw = gw.addr();

    let no_host = raw(gw, "GET /svc/x HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status(&no_host), "400", "{no_host}");
    assert!(no_host.contains("needs a Host header"), "{no_host}");
    let two = raw(
        gw,
        "GET /svc/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&two), "400", "{two}");
    // HTTP/1.0 needs no Host
    let old = raw(gw, "GET /svc/x HTTP/1.0\r\n\r\n").await;
    assert_eq!(status(&old), "200", "{old}");

    // absolute form: the target's authority, not the Host header, is what the instance gets
    let absolute = raw(
        gw,
        "GET http://orders.example:8080/svc/x HTTP/1.1\r\nHost: elsewhere\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status(&absolute), "200", "{absolute}");
    assert!(absolute.ends_with("orders.example:8080"), "{absolute}");

    // refused, and answered by the gateway itself, each with `Allow`
    for (request, code) in [
        (
            "CONNECT orders.example:443 HTTP/1.1\r\nHost: orders.example:443\r\nConnection: close\r\n\r\n",
            "405",
        ),
        (
            "OPTIONS * HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
            "204",
        ),
    ] {
        let answer = raw(gw, request).await;
        assert_eq!(status(&answer), code, "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("allow: get, head, post"), "{answer}");
    }
}

// === clients that give up ===

/// An instance that counts the requests it began, reads each body whole, and answers 200.
async fn counting_sink(started: Arc<AtomicU64>) -> gray_tests::Server {
    gray_tests::serve(
        axum::Router::new().fallback(move |req: Request<axum::body::Body>| {
            let started = started.clone();
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                match req.into_body().collect().await {
                    Ok(body) => (
                        http::StatusCode::OK,
                        format!("{} bytes", body.to_bytes().len()),
                    ),
                    Err(_) => (http::StatusCode::BAD_REQUEST, "cut".to_owned()),
                }
            }
        }),
    )
    .await
}

/// Starts an upload of 100,000 bytes, sends 1,000 of them (after `100 Continue` when
/// `expect`), waits until the instance began the request, and closes the connection.
async fn abandon_upload(gw: SocketAddr, expect: bool, started: &AtomicU64) {
    let before = started.load(Ordering::SeqCst);
    let mut stream = TcpStream::connect(gw).await.unwrap();
    let expect_line = if expect {
        "Expect: 100-continue\r\n"
    } else {
        ""
    };
    stream
        .write_all(
            format!(
                "POST /svc/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 100000\r\n{expect_line}\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    if expect {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .expect("100 Continue in time")
            .unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    stream.write_all(&[b'x'; 1000]).await.unwrap();
    until(WAIT, "the instance began the upload", || {
        started.load(Ordering::SeqCst) > before
    })
    .await;
    drop(stream);
}

/// `GET /svc/x` through the gateway: the status.
async fn get(client: &reqwest::Client, gw: SocketAddr) -> u16 {
    client
        .get(format!("http://{gw}/svc/x"))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn metrics(admin: SocketAddr) -> String {
    gray_tests::admin_text(admin, "/metrics").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_abandoning_their_uploads_never_take_the_instance_out() {
    let started = Arc::new(AtomicU64::new(0));
    let instance = counting_sink(started.clone()).await;
    let (gw, _dir) = gateway("shapes-aborts", instance.addr(), "", "").await;
    let (addr, admin) = (gw.addr(), gw.admin_addr().unwrap());
    let client = reqwest_builder().build().unwrap();

    // Other clients keep asking the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let others = {
        let (stop, client) = (stop.clone(), client.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                statuses.push(get(&client, addr).await);
            }
            statuses
        })
    };
    // 20 in a row of each shape: more than the 6 connection errors in a row that eject
    for expect in [true, false] {
        for _ in 0..20 {
            abandon_upload(addr, expect, &started).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let statuses = others.await.unwrap();
    assert!(!statuses.is_empty());
    assert!(
        statuses.iter().all(|s| *s == 200),
        "other clients saw {:?}",
        statuses.iter().filter(|s| **s != 200).collect::<Vec<_>>()
    );
    // and afterwards, the instance still serves
    for _ in 0..10 {
        assert_eq!(get(&client, addr).await, 200);
    }
    // counted as the client's (499), never as the instance's 502
    let m = metrics(admin).await;
    let aborted: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("gray_gateway_requests_total") && l.contains("status=\"499\""))
        .collect();
    assert!(!aborted.is_empty(), "no 499 in {m}");
    let count: f64 = aborted
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(count >= 40.0, "{count} aborts counted: {aborted:?}");
    assert!(
        !m.lines()
            .any(|l| l.starts_with("gray_gateway_requests_total") && l.contains("status=\"502\"")),
        "{m}"
    );
}

// === stale keep-alive connections ===

/// An HTTP/1.1 instance that answers the first request of each connection (keep-alive) and
/// closes the connection, unanswered, when a second request arrives on it: the race of an
/// instance's keep-alive timeout with the gateway's reuse, every time. Counts requests.
async fn closes_on_reuse(requests: Arc<AtomicU64>) -> SocketAddr {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut answered = false;
                loop {
                    let mut chunk = [0u8; 4096];
                    let Ok(n) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    requests.fetch_add(1, Ordering::SeqCst);
                    if answered {
                        // the second request on this connection: closed under it
                        return;
                    }
                    buf.drain(..end + 4);
                    answered = true;
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_idle_connection_is_no_error_for_an_idempotent_request() {
    let requests = Arc::new(AtomicU64::new(0));
    let instance = closes_on_reuse(requests.clone()).await;
    // idle connections kept long, so that every request but the first reuses one
    let (gw, _dir) = gateway(
        "shapes-stale",
        instance,
        "upstream_idle_timeout_ms = 60000",
        "",
    )
    .await;
    let client = reqwest_builder().build().unwrap();
    for i in 0..20 {
        // each request after a pause (the idle connection is what the scenario is about;
        // the copy is kept for connections idle 100 ms or more)
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        assert_eq!(get(&client, gw.addr()).await, 200, "request {i}");
    }
    // each request after the first met a closed connection once, and went again
    assert_eq!(requests.load(Ordering::SeqCst), 1 + 2 * 19);

    // a POST with a body is not sent twice: the instance may have acted on it
    tokio::time::sleep(Duration::from_millis(150)).await;
    let before = requests.load(Ordering::SeqCst);
    let status = client
        .post(format!("http://{}/svc/x", gw.addr()))
        .body("order #1")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 502);
    assert_eq!(requests.load(Ordering::SeqCst), before + 1, "sent once");
}

// === HTTP/1.1 trailers ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_1_trailers_go_through_both_ways() {
    // An HTTP/1.1 instance that answers with its request's `x-sum` trailer as its own
    // `x-echo-sum` trailer, and the request body's length.
    let listener = loopback_listener().await;
    let instance = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let got = req.into_body().collect().await.unwrap();
                    let sum = got
                        .trailers()
                        .and_then(|t| t.get("x-sum"))
                        .cloned()
                        .unwrap_or(HeaderValue::from_static("none"));
                    let len = got.to_bytes().len();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("x-echo-sum", sum);
                    let frames = vec![
                        Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{len} bytes")))),
                        Ok(Frame::trailers(trailers)),
                    ];
                    let mut res =
                        Response::new(StreamBody::new(futures_util::stream::iter(frames)));
                    res.headers_mut().insert(
                        http::header::TRAILER,
                        HeaderValue::from_static("x-echo-sum"),
                    );
                    Ok::<_, Infallible>(res)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let (gw, _dir) = gateway("shapes-trailers", instance, "", "").await;

    // An HTTP/1.1 client that sends trailers and asks for them.
    let stream = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-sum", HeaderValue::from_static("1234"));
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"abcdef"))),
        Ok(Frame::trailers(trailers)),
    ];
    let req = Request::post("/svc/sum")
        .header(http::header::HOST, "gw")
        .header(http::header::TE, "trailers")
        .header(http::header::TRAILER, "x-sum")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    let res = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()[http::header::TRAILER], "x-echo-sum");
    let body = res.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().expect("response trailers");
    assert_eq!(&body.to_bytes()[..], b"6 bytes");
    // the request's trailer reached the instance, and the instance's reached the client
    assert_eq!(trailers["x-echo-sum"], "1234");
}

// === gRPC, mid-stream ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_instance_failing_mid_stream_is_unavailable_to_the_client() {
    // An HTTP/2 instance whose streaming answer sends one message, then, once the client
    // has it, fails: hyper resets the stream, as a killed server's connection ends it.
    let listener = loopback_listener().await;
    let instance = listener.local_addr().unwrap();
    let fail = Arc::new(tokio::sync::Notify::new());
    {
        let fail = fail.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let fail = fail.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                        let fail = fail.clone();
                        async move {
                            let frames = futures_util::stream::unfold(0, move |step| {
                                let fail = fail.clone();
                                async move {
                                    let frame: Result<Frame<Bytes>, std::io::Error> = match step {
                                        0 => Ok(Frame::data(Bytes::from_static(&[
                                            0, 0, 0, 0, 2, 8, 1,
                                        ]))),
                                        1 => {
                                            fail.notified().await;
                                            Err(std::io::Error::other("the server was killed"))
                                        }
                                        _ => return None,
                                    };
                                    Some((frame, step + 1))
                                }
                            });
                            let mut res = Response::new(StreamBody::new(frames));
                            res.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                HeaderValue::from_static("application/grpc"),
                            );
                            Ok::<_, Infallible>(res)
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    }
    let (gw, _dir) = gateway(
        "shapes-grpc",
        instance,
        "",
        "strip_prefix = false\nprotocol = \"h2c\"",
    )
    .await;
    // grpcio and tonic read the status from the trailers: an HTTP/2 client reading them
    let stream = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!("http://{}/svc/Watch", gw.addr()))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let res = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .expect("an answer in time")
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        !res.headers().contains_key("grpc-status"),
        "not trailers-only"
    );
    let mut body = res.into_body();
    let first = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("the first message in time")
        .expect("a frame")
        .expect("not an error");
    assert_eq!(first.into_data().unwrap().len(), 7, "the first message");
    // the instance fails now, mid-stream
    fail.notify_one();
    let rest = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("the call ends in time")
        .expect("ended by trailers, not a reset stream");
    let trailers = rest.trailers().cloned().expect("trailers");
    assert_eq!(trailers["grpc-status"], "14", "{trailers:?}");
    assert!(
        trailers["grpc-message"]
            .to_str()
            .unwrap()
            .contains("mid-stream"),
        "{trailers:?}"
    );
}

// === HTTP/2 for a while ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_sending_pings_lives_until_its_idle_timeout() {
    let instance = host_echo().await;
    // a head must come within 500 ms; a connection may idle 4 s
    let (gw, _dir) = gateway(
        "shapes-h2-idle",
        instance.addr(),
        "header_read_timeout_ms = 500\nidle_timeout_ms = 4000",
        "",
    )
    .await;
    let stream = TcpStream::connect(gw.addr()).await.unwrap();
    // PINGs every 100 ms, as gRPC's keep-alive sends them
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(100))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(conn);
    let request = || {
        Request::get(format!("http://{}/svc/x", gw.addr()))
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap()
    };
    let opened = tokio::time::Instant::now();
    assert_eq!(send.send_request(request()).await.unwrap().status(), 200);
    // Idle with PINGs for three head timeouts (the time passing is the scenario): the
    // same connection still serves.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!connection.is_finished(), "closed while idle with PINGs");
    assert_eq!(send.send_request(request()).await.unwrap().status(), 200);
    // then closed by the idle timeout (4 s, looked at every second), PINGs or not
    tokio::time::timeout(WAIT, connection)
        .await
        .expect("closed by the idle timeout")
        .unwrap()
        .ok();
    let lived = opened.elapsed();
    assert!(lived >= Duration::from_secs(5), "closed after {lived:?}");
}

// === refused HTTP/2 streams ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_an_http2_instance_refuses_go_to_another_whatever_the_method() {
    // One instance refuses every stream it is sent (as a server over its stream limit, or
    // one shutting down, does): never processed, they may go elsewhere.
    let listener = loopback_listener().await;
    let refusing = listener.local_addr().unwrap();
    let refused = Arc::new(AtomicU64::new(0));
    {
        let refused = refused.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let refused = refused.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(stream).await else {
                        return;
                    };
                    while let Some(Ok((_request, mut respond))) = conn.accept().await {
                        refused.fetch_add(1, Ordering::SeqCst);
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                    }
                });
            }
        });
    }
    // the other answers over HTTP/2
    let listener = loopback_listener().await;
    let serving = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    Ok::<_, Infallible>(Response::new(Full::new(body)))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let dir = TempDir::new("shapes-refused");
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"refusing\"\naddress = \"{refusing}\"\n\n\
             [[services.svc]]\nid = \"serving\"\naddress = \"{serving}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\n[services.svc]\nprotocol = \"h2c\"\n",
    )
    .unwrap();
    let gw = start_gateway(dir.path()).await;
    let client = reqwest_builder().build().unwrap();
    for i in 0..40 {
        let res = client
            .post(format!("http://{}/svc/orders", gw.addr()))
            .body(format!("order {i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(
            res.text().await.unwrap(),
            format!("order {i}"),
            "the body, sent again"
        );
    }
    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "the refusing instance was never tried"
    );
}
