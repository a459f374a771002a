//! Smuggling the stain past the edge (issue 22): an untrusted client spells the stain's
//! `baggage` key or header another way, hoping that a service behind the edge decodes it to
//! the real thing.
//!
//! ```text
//! client ──► gray-gateway ──► b (Python, OpenTelemetry) ──► c (Rust, gray) ──► d (base / gray)
//! ```
//!
//! `b` is a real Python process (`tests/python/otel_hop.py`, served by `wsgiref`): it reads
//! `baggage` with OpenTelemetry's W3C propagator (`unquote_plus` and `strip` on every key)
//! and forwards the `x-gray-lane` it reads from the WSGI environ (`HTTP_X_GRAY_LANE`,
//! which `x_gray_lane` maps to as well). `c` reads the stain with gray's layer and routes
//! to `d` by it. Sent to `b` directly, every spelling makes some service read `gray`;
//! through the gateway, none does, while a lane the gateway's rules decide still arrives.

use std::{process::Stdio, time::Duration};

use axum::{Router, extract::State, routing::get};
use gray_core::Carriers;
use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{
    Server,
    route::{Lines, RoutedClient, current_lane, get_root, instances, routed_client},
    serve,
};
use gray_tower::ExtractStainLayer;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tower::ServiceExt;

/// `c`: reports the lane it read, and which instance of `d` its balancer picked.
async fn c(State(d): State<RoutedClient>) -> Result<String, String> {
    let seen = d.oneshot(get_root()).await.map_err(|e| e.to_string())?;
    Ok(format!(
        "rust_lane={}\n{}",
        current_lane(),
        seen.prefixed("d_")
    ))
}

/// The Python hop, stopped when dropped.
struct Python {
    _child: Child,
    url: String,
}

/// Starts `tests/python/otel_hop.py` in front of `next`; waits for the port it prints.
async fn python_hop(next: &str) -> Python {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/otel_hop.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(next)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs (scripts/test installs opentelemetry-api)");
    let stdout = child.stdout.take().expect("piped stdout");
    let line = tokio::time::timeout(WAIT, BufReader::new(stdout).lines().next_line())
        .await
        .expect("the Python hop prints its port in time")
        .expect("stdout readable")
        .expect(
            "the Python hop printed its port (is opentelemetry-api installed? scripts/test \
             installs it)",
        );
    let port: u16 = line.trim().parse().expect("a port");
    Python {
        _child: child,
        url: format!("http://127.0.0.1:{port}/"),
    }
}

/// The whole chain, with the gateway configured with `carriers`; stopped when dropped.
struct Chain {
    gateway: Gateway,
    python: Python,
    _c: Server,
    _d: gray_tests::route::Instances,
    _dir: TempDir,
    driver: reqwest::Client,
}

async fn chain(carriers: &str) -> Chain {
    let rust_carriers = Carriers::default().with_baggage();
    let d = instances(&rust_carriers).await;
    let c = serve(
        Router::new()
            .route("/", get(c))
            .with_state(routed_client(&d, &rust_carriers, true))
            .layer(ExtractStainLayer::new().with_carriers(rust_carriers)),
    )
    .await;
    let python = python_hop(&c.url("/")).await;
    let dir = TempDir::new("baggage-smuggling");
    let python_addr = python
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    std::fs::write(
        dir.path().join("instances.toml"),
        format!("[[services.b]]\nid = \"b-1\"\naddress = \"{python_addr}\"\n"),
    )
    .expect("instances written");
    std::fs::write(
        dir.path().join("rules.toml"),
        "[[rules]]\nname = \"testers\"\nwhen = { header = { name = \"x-canary\", exact = \"yes\" } }\nlane = \"gray\"\n",
    )
    .expect("rules written");
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nrules = \"rules.toml\"\ninstances = \"instances.toml\"\n{carriers}\n\n[services.b]\nfallback = \"baseline\"\n"
        ),
    )
    .expect("config written");
    let gateway = gray_tests::start_gateway(dir.path()).await;
    let driver = gray_tests::reqwest_builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("a client");
    Chain {
        gateway,
        python,
        _c: c,
        _d: d,
        _dir: dir,
        driver,
    }
}

impl Chain {
    /// Sends `headers` to `url`; what each hop read.
    async fn send(&self, url: &str, headers: &[(&str, &str)]) -> Lines {
        let mut req = self.driver.get(url);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = req.send().await.expect("a response");
        assert_eq!(res.status(), 200, "{headers:?}");
        Lines::parse(&res.text().await.expect("a body"))
    }

    async fn through_gateway(&self, headers: &[(&str, &str)]) -> Lines {
        let url = format!("http://{}/b/", self.gateway.addr());
        self.send(&url, headers).await
    }

    async fn direct(&self, headers: &[(&str, &str)]) -> Lines {
        self.send(&self.python.url, headers).await
    }
}

/// Keys a lenient decoder reads as `gray.lane`: percent-encoded, with `+` or spaces, in
/// another case, encoded twice.
const KEYS: [&str; 12] = [
    "gray%2Elane",
    "gray%2elane",
    "%67ray.lane",
    "gray%2Elan%65",
    "gray.lane+",
    "+gray.lane",
    "gray.lane%20",
    "%20gray.lane",
    "gray.lane%09",
    "gray.lane%C2%A0",
    "Gray.Lane",
    "GRAY.LANE",
];

/// Every way of sending one spelling: alone, beside other members, on a second line.
fn cases(key: &str) -> Vec<Vec<(&'static str, String)>> {
    vec![
        vec![("baggage", format!("{key}=gray"))],
        vec![("baggage", format!("userId=42;ttl=5,{key}=gray,tenant=acme"))],
        vec![
            ("baggage", "userId=42".to_owned()),
            ("baggage", format!("{key} = gray")),
        ],
    ]
}

fn as_pairs<'a>(case: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    case.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// `true` when some hop read the lane `gray`, or `d`'s gray instance served the request.
fn anyone_gray(seen: &Lines) -> bool {
    seen.get("python_lane") == "gray"
        || seen.get("python_x_gray_lane") == "gray"
        || seen.get("rust_lane") == "gray"
        || seen.get("d_id") == "d-gray"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_the_stain_gets_past_the_gateway() {
    let gateway_carriers = [
        // The gateway's default carriers: the `gray.lane` member is stripped as a known one.
        "",
        // The baggage carrier configured: the client's other members travel on.
        "carriers = [{ kind = \"lane\" }, { kind = \"baggage\" }]",
    ];
    for carriers in gateway_carriers {
        let chain = chain(carriers).await;

        // The chain carries a lane the gateway decides, to every hop.
        let seen = chain.through_gateway(&[("x-canary", "yes")]).await;
        assert_eq!(seen.get("rust_lane"), "gray", "{carriers}: {seen:?}");
        assert_eq!(seen.get("d_id"), "d-gray", "{carriers}");
        if !carriers.is_empty() {
            assert_eq!(seen.get("python_lane"), "gray", "{carriers}: {seen:?}");
        }

        let mut matrix: Vec<Vec<(&'static str, String)>> =
            KEYS.iter().flat_map(|key| cases(key)).collect();
        // Header names a WSGI server maps to `HTTP_X_GRAY_LANE`.
        matrix.push(vec![("x_gray_lane", "gray".to_owned())]);
        matrix.push(vec![("x_gray-lane", "gray".to_owned())]);
        matrix.push(vec![("X_Gray_Lane", "gray".to_owned())]);
        for case in &matrix {
            let headers = as_pairs(case);
            // Sent past the gateway, each one is read as `gray` somewhere behind it...
            let direct = chain.direct(&headers).await;
            assert!(
                anyone_gray(&direct),
                "{headers:?} is not a smuggling attempt: {direct:?}"
            );
            // ...through it, nowhere.
            let seen = chain.through_gateway(&headers).await;
            assert!(!anyone_gray(&seen), "{carriers}: {headers:?}: {seen:?}");
            assert_eq!(seen.get("d_id"), "d-base", "{carriers}: {headers:?}");
            if case.iter().any(|(_, v)| v.contains("userId=42")) {
                assert!(
                    seen.get("python_sent_baggage").contains("userId=42"),
                    "{carriers}: the other members travel on: {seen:?}"
                );
            }
        }
    }
}
