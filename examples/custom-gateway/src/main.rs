//! Run with: cargo run -p example-custom-gateway
//!
//! A custom gray gateway in one axum program, composed from gray-tower alone (with its
//! features `axum`, `balance`, `discovery` and `toml`):
//!
//! - the **edge**: rules decide each request's lane (`x-beta: 1` is gray), a stain an
//!   untrusted client sends is stripped, paths are normalised and `/api/../web/x` is
//!   refused, the peer goes into `X-Forwarded-For`. It wraps the router, so it runs
//!   before routing; the server gives it the client IP (`ConnectInfo`);
//! - `/api/**` and `/web/**` go to a **balancer** each, which picks, per request, an
//!   instance whose labels fit the lane, from an instance file a `Registry` follows live;
//!   failures become statuses (`status_of`: 503 when nothing fits, 504, 502);
//! - `/healthz` is answered locally;
//! - **WebSocket** (any HTTP/1.1 upgrade) goes through the same balancer: the upgrade is
//!   noted before the edge strips `Upgrade` as a hop-by-hop header, put back on the
//!   request to the instance, and on the instance's `101` the client's connection and the
//!   instance's (`discovery::http::upgraded`) are joined.
//!
//! The program starts two upstreams per service (baseline and gray; `web-gray` listed
//! only later), checks what the gateway does with each kind of request, edits the instance
//! file, and exits: non-zero if any check fails.

use std::{net::SocketAddr, path::Path, time::Duration};

use axum::{
    Router, ServiceExt,
    extract::{
        Request, State,
        ws::{Message, WebSocket, WebSocketUpgrade},
    },
    http::{
        HeaderMap, HeaderValue, StatusCode, Uri,
        header::{CONNECTION, EXPECT, UPGRADE},
    },
    middleware::{Next, from_fn, map_request, map_response},
    response::Response,
    routing::{MethodRouter, any_service, get},
};
use gray_tower::{
    Layer, Policy,
    balance::{BalanceLayer, error::status_of},
    discovery::{
        Registry,
        http::{HttpEndpoints, is_upgrade_request, upgraded},
        source::file::FileSource,
    },
    edge::{EdgeLayer, Format, RuleSet, hop},
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The edge's rules: beta testers are gray.
const RULES: &str = r#"
[[rules]]
name = "beta testers"
when = { header = { name = "x-beta", exact = "1" } }
lane = "gray"
"#;

/// An upstream instance: says who it is, the path it got and the stain headers it saw.
async fn upstream(State(id): State<&'static str>, uri: Uri, headers: HeaderMap) -> String {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let (lane, forwarded) = (header("x-gray-lane"), header("x-forwarded-for"));
    format!("{id} {} lane={lane} xff={forwarded}", uri.path())
}

/// An upstream's WebSocket: answers each text message `m` with `{id}: m`.
async fn chat(State(id): State<&'static str>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |mut socket: WebSocket| async move {
        while let Some(Ok(Message::Text(text))) = socket.recv().await {
            let answer = Message::Text(format!("{id}: {}", text.as_str()).into());
            if socket.send(answer).await.is_err() {
                return;
            }
        }
    })
}

async fn serve_upstream(id: &'static str) -> Result<SocketAddr, BoxError> {
    let app = Router::new()
        .route("/chat", get(chat))
        .fallback(upstream)
        .with_state(id);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Writes the instance file (atomically: a whole file or the previous one).
fn write_instances(
    path: &Path,
    instances: &[(&str, &str, SocketAddr, bool)],
) -> std::io::Result<()> {
    let mut toml = String::new();
    for (service, id, address, gray) in instances {
        let labels = if *gray {
            "labels = { gray = true }\n"
        } else {
            ""
        };
        toml +=
            &format!("[[services.{service}]]\nid = \"{id}\"\naddress = \"{address}\"\n{labels}\n");
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, toml)?;
    std::fs::rename(tmp, path)
}

/// One balanced service, as a route: the balancer over the service's instances, its
/// failures turned into statuses.
fn balanced(registry: &Registry, service: &str) -> Result<MethodRouter, BoxError> {
    let endpoints = HttpEndpoints::new().with_response_timeout(Duration::from_secs(5));
    let instances = registry.service(service)?.endpoints(endpoints);
    let balance = BalanceLayer::new(service, Policy::new()).build(instances);
    // 503 when no instance fits (the error names service, lane and policy), 504, 502.
    let answered = ServiceExt::<Request>::handle_error(balance, |e: BoxError| async move {
        (status_of(&*e), e.to_string())
    });
    Ok(any_service(answered))
}

/// The `Upgrade` a client asked for, noted before the edge strips it (hop-by-hop).
#[derive(Clone)]
struct Upgrading(HeaderValue);

/// Before the edge: notes an upgrade request.
async fn note_upgrade(mut req: Request) -> Request {
    if is_upgrade_request(req.headers())
        && let Some(protocol) = req.headers().get(UPGRADE).cloned()
    {
        req.extensions_mut().insert(Upgrading(protocol));
    }
    req
}

/// After the edge, around a balanced route: an upgrade's headers go back on, and on the
/// instance's `101` the client's connection and the instance's are joined.
async fn join_upgrade(mut req: Request, next: Next) -> Response {
    let Some(Upgrading(protocol)) = req.extensions_mut().remove::<Upgrading>() else {
        return next.run(req).await;
    };
    req.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    req.headers_mut().insert(UPGRADE, protocol);
    let client = hyper::upgrade::on(&mut req);
    let mut res = next.run(req).await;
    if res.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(instance) = upgraded(&mut res)
    {
        tokio::spawn(async move {
            if let Ok(client) = client.await {
                let (mut client, mut instance) = (TokioIo::new(client), TokioIo::new(instance));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut instance).await;
            }
        });
    }
    res
}

/// The gateway: the edge, then the routes. Returns its address.
async fn serve_gateway(registry: &Registry) -> Result<SocketAddr, BoxError> {
    let rules = RuleSet::parse(RULES, Format::Toml, "RULES")?;
    let edge = EdgeLayer::new(rules)
        .with_reject_prefix_escape(true)
        .with_forwarded_for(true);
    let routes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .nest_service("/api", balanced(registry, "api")?)
        .nest_service("/web", balanced(registry, "web")?)
        // The proxy's own chores: `Expect` is answered here, and responses lose their
        // hop-by-hop headers (the edge removed the request's).
        .layer(from_fn(join_upgrade))
        .layer(map_request(|mut req: Request| async move {
            req.headers_mut().remove(EXPECT);
            req
        }))
        // A `101` keeps its `Connection` and `Upgrade`, which the client needs.
        .layer(map_response(|mut res: Response| async move {
            if res.status() != StatusCode::SWITCHING_PROTOCOLS {
                hop::strip(res.headers_mut());
            }
            res
        }));
    // The edge wraps the routes, so it runs before routing; the result is a router again.
    // An upgrade is noted before it.
    let app = Router::new()
        .fallback_service(edge.layer(routes))
        .layer(map_request(note_upgrade));

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    Ok(addr)
}

/// `GET path` through the gateway with `headers`: the status and the body.
async fn get_with(
    client: &reqwest::Client,
    gateway: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), BoxError> {
    let mut req = client.get(format!("http://{gateway}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = req.send().await?;
    Ok((res.status().as_u16(), res.text().await?))
}

/// `GET path` sent as is over TCP (reqwest would resolve `..` before sending): the status.
async fn get_raw(gateway: SocketAddr, path: &str) -> Result<String, BoxError> {
    let mut stream = TcpStream::connect(gateway).await?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

/// A WebSocket to `path` through the gateway, spoken by hand (a beta tester with `beta`):
/// the status line of the answer, and the answer to one text message.
async fn websocket(
    gateway: SocketAddr,
    path: &str,
    beta: bool,
) -> Result<(String, String), BoxError> {
    let mut stream = TcpStream::connect(gateway).await?;
    let beta = if beta { "x-beta: 1\r\n" } else { "" };
    let handshake = format!(
        "GET {path} HTTP/1.1\r\nhost: gateway\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n{beta}\r\n"
    );
    stream.write_all(handshake.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(stream.read_u8().await?);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.lines().next().unwrap_or("").to_owned();
    if !status.contains(" 101 ") {
        return Ok((status, String::new()));
    }
    // A masked text frame "hi" (RFC 6455 §5.2), and the unmasked one that answers it.
    let mask = [1, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 2];
    frame.extend_from_slice(&mask);
    frame.extend(b"hi".iter().zip(mask).map(|(b, m)| b ^ m));
    stream.write_all(&frame).await?;
    let (_, len) = (stream.read_u8().await?, stream.read_u8().await?);
    let mut payload = vec![0; usize::from(len & 0x7f)];
    stream.read_exact(&mut payload).await?;
    Ok((status, String::from_utf8_lossy(&payload).into_owned()))
}

fn check(ok: bool, what: &str, got: &str) -> Result<(), BoxError> {
    if ok {
        println!("ok   {what}: {got}");
        Ok(())
    } else {
        Err(format!("FAIL {what}: {got}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (api_base, api_gray) = (
        serve_upstream("api-base").await?,
        serve_upstream("api-gray").await?,
    );
    let (web_base, web_gray) = (
        serve_upstream("web-base").await?,
        serve_upstream("web-gray").await?,
    );
    let dir = std::env::temp_dir().join(format!("example-custom-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("instances.toml");
    let mut instances = vec![
        ("api", "api-base", api_base, false),
        ("api", "api-gray", api_gray, true),
        ("web", "web-base", web_base, false),
    ];
    write_instances(&path, &instances)?;

    // The instances: followed live by the registry, on its own task.
    let source = FileSource::new(&path).with_interval(Duration::from_millis(50));
    let registry = Registry::start(source).await?;
    let gateway = serve_gateway(&registry).await?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let result = run_checks(&client, gateway, &path, &mut instances, web_gray).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_checks(
    client: &reqwest::Client,
    gateway: SocketAddr,
    path: &Path,
    instances: &mut Vec<(&str, &str, SocketAddr, bool)>,
    web_gray: SocketAddr,
) -> Result<(), BoxError> {
    let (status, body) = get_with(client, gateway, "/healthz", &[]).await?;
    check(status == 200 && body == "ok", "local route", &body)?;

    let (status, body) = get_with(client, gateway, "/api/items", &[("x-beta", "1")]).await?;
    let gray = status == 200 && body.starts_with("api-gray /items lane=gray xff=127.0.0.1");
    check(gray, "a beta tester reaches api's gray instance", &body)?;

    let (status, body) = get_with(client, gateway, "/api/items", &[]).await?;
    check(
        status == 200 && body.starts_with("api-base /items lane=-"),
        "unstained: baseline",
        &body,
    )?;

    let (_, body) = get_with(client, gateway, "/api/items", &[("x-gray-lane", "gray")]).await?;
    check(
        body.starts_with("api-base /items lane=-"),
        "a forged x-gray-lane is stripped",
        &body,
    )?;

    let (status, echo) = websocket(gateway, "/api/chat", true).await?;
    check(
        status.contains("101") && echo == "api-gray: hi",
        "a beta tester's WebSocket reaches api's gray instance",
        &echo,
    )?;
    let (_, echo) = websocket(gateway, "/api/chat", false).await?;
    check(
        echo == "api-base: hi",
        "an unstained WebSocket: baseline",
        &echo,
    )?;

    let answer = get_raw(gateway, "/api/../web/x").await?;
    let refused = answer.starts_with("HTTP/1.1 400") && answer.contains("prefix_escape");
    check(
        refused,
        "/api/../web/x is refused, not routed",
        answer.lines().next().unwrap_or(""),
    )?;

    let (status, body) = get_with(client, gateway, "/web/home", &[("x-beta", "1")]).await?;
    check(
        status == 503 && body.contains("no instance of `web` fits"),
        "web has no gray instance: 503",
        &body,
    )?;

    // A gray instance of web joins: the file is edited, nothing restarts.
    instances.push(("web", "web-gray", web_gray, true));
    write_instances(path, instances)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (_, body) = get_with(client, gateway, "/web/home", &[("x-beta", "1")]).await?;
        if body.starts_with("web-gray") || tokio::time::Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    check(
        body.starts_with("web-gray /home lane=gray"),
        "the edited instance file routes the beta tester",
        &body,
    )?;
    Ok(())
}
