//! Spoofing the real gateway (issue 13): real loopback peers on several 127.x source
//! addresses (a trusted proxy, a trusted client, an untrusted client), raw HTTP/1.1 so that
//! paths and duplicate headers reach the gateway exactly as written, and an upstream that
//! echoes what it received. Each case asserts the route (which instance) and what the
//! upstream saw.

use std::net::SocketAddr;

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, http::Uri, routing::any};
use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{Server, serve};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
};

const PROXY: [u8; 4] = [127, 0, 0, 2];
const TRUSTED: [u8; 4] = [127, 0, 0, 3];
const UNTRUSTED: [u8; 4] = [127, 0, 0, 4];

/// An instance that answers with its id, the URI and every header it received, in order.
async fn echo(id: &'static str) -> Server {
    async fn answer(
        State(id): State<&'static str>,
        uri: Uri,
        headers: HeaderMap,
        body: Bytes,
    ) -> String {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        serde_json::json!({"id": id, "uri": uri.to_string(), "headers": headers, "body": body.len()})
            .to_string()
    }
    serve(Router::new().fallback(any(answer)).with_state(id)).await
}

struct Setup {
    gateway: Gateway,
    _dir: TempDir,
    _upstreams: Vec<Server>,
}

async fn setup() -> Setup {
    let dir = TempDir::new("gateway-spoofing");
    let base = echo("svc-base").await;
    let gray = echo("svc-gray").await;
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"svc-base\"\naddress = \"{}\"\n\n[[services.svc]]\nid = \"svc-gray\"\naddress = \"{}\"\nlabels = {{ gray = \"true\" }}\n",
            base.addr(),
            gray.addr()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("rules.toml"),
        r#"
[[rules]]
name = "internal paths stay on baseline"
when = { path = { prefix = "/svc/internal" } }
baseline = true

[[rules]]
name = "office network (seed 003)"
when = { ip = ["10.9.0.0/16"] }
lane = "gray"

[[rules]]
name = "canary header"
when = { header = { name = "x-canary", exact = "yes" } }
lane = "gray"
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        r#"
listen = "127.0.0.1:0"
trusted_proxies = ["127.0.0.2/32"]
trusted_clients = ["127.0.0.3/32"]
rules = "rules.toml"
instances = "instances.toml"
seed003_headers = true
carriers = [{ kind = "lane" }, { kind = "flag" }, { kind = "baggage" }]
strip = ["x-internal-user"]

[services.svc]
fallback = "baseline"
"#,
    )
    .unwrap();
    let gateway = gray_tests::start_gateway(dir.path()).await;
    Setup {
        gateway,
        _dir: dir,
        _upstreams: vec![base, gray],
    }
}

/// A response as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn echoed(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Connects from `from` (a loopback address of its own, bound before connecting).
async fn connect(from: [u8; 4], gateway: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind the client's address");
    socket.connect(gateway).await.expect("connect")
}

/// Parses every response in `raw`, skipping `1xx` ones.
fn parse(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw).into_owned();
    let mut rest = text.as_str();
    loop {
        let (head, body) = rest
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no head in {text:?}"));
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {text:?}"));
        if (100..200).contains(&status) {
            rest = body;
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        return Answer {
            status,
            headers,
            body: body.to_owned(),
        };
    }
}

/// Sends `GET path` with `headers` from `from`, and reads the whole answer.
async fn get(gateway: SocketAddr, from: [u8; 4], path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut stream = connect(from, gateway).await;
    let mut request = format!("GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    parse(&raw)
}

/// What the upstream must (not) have seen.
enum Saw {
    Header(&'static str, &'static str),
    HeaderContaining(&'static str, &'static str),
    NoHeader(&'static str),
}

struct Case {
    what: &'static str,
    from: [u8; 4],
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    /// The instance that serves it; `None`: the gateway answers `status` itself.
    instance: Option<&'static str>,
    status: u16,
    upstream_uri: &'static str,
    saw: &'static [Saw],
}

const fn served(
    what: &'static str,
    from: [u8; 4],
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    instance: &'static str,
    upstream_uri: &'static str,
    saw: &'static [Saw],
) -> Case {
    Case {
        what,
        from,
        path,
        headers,
        instance: Some(instance),
        status: 200,
        upstream_uri,
        saw,
    }
}

const fn refused(what: &'static str, path: &'static str) -> Case {
    Case {
        what,
        from: TRUSTED,
        path,
        headers: &[("x-gray-lane", "gray")],
        instance: None,
        status: 400,
        upstream_uri: "",
        saw: &[],
    }
}

const CASES: &[Case] = &[
    // Forged carriers from an untrusted client: stripped, never routed by.
    served(
        "forged seed-000 flag",
        UNTRUSTED,
        "/svc/a",
        &[("gray", "true")],
        "svc-base",
        "/a",
        &[Saw::NoHeader("gray"), Saw::NoHeader("x-gray-lane")],
    ),
    served(
        "forged seed-001 version",
        UNTRUSTED,
        "/svc/a",
        &[("version", "2.0")],
        "svc-base",
        "/a",
        &[Saw::NoHeader("version")],
    ),
    served(
        "forged baggage member",
        UNTRUSTED,
        "/svc/a",
        &[("baggage", "userId=42,gray.lane=gray,k=v")],
        "svc-base",
        "/a",
        &[
            Saw::HeaderContaining("baggage", "userId=42"),
            Saw::HeaderContaining("baggage", "k=v"),
        ],
    ),
    served(
        "forged lane header",
        UNTRUSTED,
        "/svc/a",
        &[("x-gray-lane", "gray"), ("x-internal-user", "admin")],
        "svc-base",
        "/a",
        &[
            Saw::NoHeader("x-gray-lane"),
            Saw::NoHeader("x-internal-user"),
        ],
    ),
    served(
        "forged seed-003 headers",
        UNTRUSTED,
        "/svc/a",
        &[("x-gray-flag", "true"), ("x-gray-ip", "10.9.1.1")],
        "svc-base",
        "/a",
        &[
            Saw::Header("x-gray-flag", "false"),
            Saw::Header("x-gray-ip", "127.0.0.4"),
        ],
    ),
    served(
        "forged X-Forwarded-For",
        UNTRUSTED,
        "/svc/a",
        &[("x-forwarded-for", "10.9.1.1")],
        "svc-base",
        "/a",
        &[Saw::Header("x-gray-flag", "false")],
    ),
    // Trusted peers.
    served(
        "trusted client's flag",
        TRUSTED,
        "/svc/a",
        &[("gray", "TRUE")],
        "svc-gray",
        "/a",
        &[
            Saw::Header("x-gray-lane", "gray"),
            Saw::Header("gray", "true"),
            Saw::HeaderContaining("baggage", "gray.lane=gray"),
        ],
    ),
    served(
        "whitelisted client through the trusted proxy",
        PROXY,
        "/svc/a",
        &[("x-forwarded-for", "10.9.1.1")],
        "svc-gray",
        "/a",
        &[
            Saw::Header("x-gray-flag", "true"),
            Saw::Header("x-gray-ip", "10.9.1.1"),
            Saw::Header("x-gray-lane", "gray"),
        ],
    ),
    // `Connection` cannot remove what the gateway writes.
    served(
        "Connection names the lane header",
        PROXY,
        "/svc/a",
        &[
            ("x-forwarded-for", "10.9.1.1"),
            ("connection", "x-gray-lane"),
        ],
        "svc-gray",
        "/a",
        &[
            Saw::Header("x-gray-lane", "gray"),
            Saw::NoHeader("connection"),
        ],
    ),
    served(
        "Connection names seed 003's headers",
        PROXY,
        "/svc/a",
        &[
            ("x-forwarded-for", "10.9.1.1"),
            ("connection", "x-gray-flag, x-gray-ip"),
        ],
        "svc-gray",
        "/a",
        &[
            Saw::Header("x-gray-flag", "true"),
            Saw::Header("x-gray-ip", "10.9.1.1"),
        ],
    ),
    // Paths are normalised before rules see them and before they are forwarded: the guard
    // rule holds whatever the spelling.
    served(
        "control: a public path goes gray",
        TRUSTED,
        "/svc/public/x",
        &[("x-gray-lane", "gray")],
        "svc-gray",
        "/public/x",
        &[],
    ),
    served(
        "double slash",
        TRUSTED,
        "/svc//internal/x",
        &[("x-gray-lane", "gray")],
        "svc-base",
        "/internal/x",
        &[],
    ),
    served(
        "dot-dot inside the service",
        TRUSTED,
        "/svc/x/../internal/x",
        &[("x-gray-lane", "gray")],
        "svc-base",
        "/internal/x",
        &[],
    ),
    served(
        "dot segment",
        TRUSTED,
        "/svc/./internal/x",
        &[("x-gray-lane", "gray")],
        "svc-base",
        "/internal/x",
        &[],
    ),
    served(
        "encoded unreserved letter",
        TRUSTED,
        "/svc/%69nternal/x",
        &[("x-gray-lane", "gray")],
        "svc-base",
        "/internal/x",
        &[],
    ),
    refused("encoded slash", "/svc/a%2Finternal/x"),
    refused("prefix escape", "/svc/../other/x"),
    refused("prefix escape into the service", "/other/../svc/internal/x"),
    refused("above the root", "/svc/../../x"),
    // Duplicates: the first value decides, for rules and carriers alike.
    served(
        "duplicate rule header, first value no",
        UNTRUSTED,
        "/svc/a",
        &[("x-canary", "no"), ("x-canary", "yes")],
        "svc-base",
        "/a",
        &[],
    ),
    served(
        "control: the rule header alone",
        UNTRUSTED,
        "/svc/a",
        &[("x-canary", "yes")],
        "svc-gray",
        "/a",
        &[],
    ),
    served(
        "duplicate flag carrier, first value false",
        TRUSTED,
        "/svc/a",
        &[("gray", "false"), ("gray", "true")],
        "svc-base",
        "/a",
        &[Saw::NoHeader("x-gray-lane")],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stains_paths_and_duplicates() {
    let s = setup().await;
    let gw = s.gateway.addr();
    let mut failures = Vec::new();
    for case in CASES {
        let answer = get(gw, case.from, case.path, case.headers).await;
        let what = case.what;
        if answer.status != case.status {
            failures.push(format!(
                "{what}: status {} ({})",
                answer.status, answer.body
            ));
            continue;
        }
        let Some(instance) = case.instance else {
            let body: serde_json::Value = answer.echoed();
            if body["error"] != "invalid path" {
                failures.push(format!("{what}: {body}"));
            }
            continue;
        };
        if answer.header("x-gray-instance") != Some(instance) {
            failures.push(format!(
                "{what}: served by {:?}, expected {instance}",
                answer.header("x-gray-instance")
            ));
        }
        let echoed = answer.echoed();
        if echoed["uri"] != case.upstream_uri {
            failures.push(format!(
                "{what}: upstream saw {}, expected {}",
                echoed["uri"], case.upstream_uri
            ));
        }
        let seen: Vec<(String, String)> =
            serde_json::from_value(echoed["headers"].clone()).unwrap();
        let values = |name: &str| -> Vec<&str> {
            seen.iter()
                .filter(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        for saw in case.saw {
            let ok = match saw {
                Saw::Header(name, value) => values(name) == [*value],
                Saw::HeaderContaining(name, part) => {
                    values(name).len() == 1 && values(name)[0].split(',').any(|m| m.trim() == *part)
                }
                Saw::NoHeader(name) => values(name).is_empty(),
            };
            if !ok {
                let name = match saw {
                    Saw::Header(n, _) | Saw::HeaderContaining(n, _) | Saw::NoHeader(n) => n,
                };
                failures.push(format!("{what}: upstream's {name}: {:?}", values(name)));
            }
        }
        // No stain an untrusted client forged reaches the upstream (a gray decision of the
        // rules writes its own member).
        if case.from == UNTRUSTED
            && instance == "svc-base"
            && let Some(baggage) = values("baggage").first()
            && baggage.contains("gray.lane=gray")
        {
            failures.push(format!(
                "{what}: forged baggage member forwarded: {baggage}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_by_the_gateway_and_not_forwarded() {
    let s = setup().await;
    let mut stream = connect(TRUSTED, s.gateway.addr()).await;
    stream
        .write_all(
            b"POST /svc/upload HTTP/1.1\r\nhost: gw\r\nconnection: close\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    // The gateway says `100 Continue` before the client sends a byte of the body.
    let mut interim = [0u8; 25];
    tokio::time::timeout(WAIT, stream.read_exact(&mut interim))
        .await
        .expect("100 Continue in time")
        .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"hello").await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut raw))
        .await
        .expect("answered in time")
        .unwrap();
    let answer = parse(&raw);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let echoed = answer.echoed();
    assert_eq!(echoed["body"], 5, "{echoed}");
    let headers = echoed["headers"].to_string();
    assert!(!headers.contains("expect"), "the upstream saw {headers}");
}
