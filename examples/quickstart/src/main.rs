//! Run with: cargo run -p example-quickstart
//!
//! Starts on loopback ports the gray gateway and two services, A and B, each with a
//! baseline and a gray instance; A calls B through its own label-aware balancer. Sends a
//! few requests through the gateway, prints which lane each one was given and which
//! instances of A and B served it, then removes B's gray instance and shows the fallback.
//! Exits 0 when every request was routed as expected.
//!
//! With `--serve` it keeps everything running and prints `curl` lines to try.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use axum::{Json, Router, extract::State, routing::get};
use bytes::Bytes;
use gray_balance::BalanceLayer;
use gray_discovery::{Registry, http::HttpEndpoints, source::file::FileSource};
use gray_gateway::{Gateway, config::Config};
use gray_policy::Policy;
use gray_rules::sticky_bucket;
use gray_tower::{ExtractStainLayer, PropagateStainLayer};
use http::Request;
use http_body_util::{BodyExt, Empty};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What an instance answers: who it is, the lane it saw, and B's answer when it is an A.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Answer {
    instance: String,
    lane: Option<String>,
    downstream: Option<Box<Answer>>,
}

fn current_lane() -> Option<String> {
    gray_tower::current().and_then(|c| c.lane().map(ToString::to_string))
}

async fn b_handler(State(id): State<&'static str>) -> Json<Answer> {
    Json(Answer {
        instance: id.to_owned(),
        lane: current_lane(),
        downstream: None,
    })
}

/// A's client for B: type-erased, as an example may.
type BClient = tower::util::BoxCloneSyncService<
    Request<Empty<Bytes>>,
    http::Response<gray_discovery::http::ResponseBody>,
    BoxError,
>;

#[derive(Clone)]
struct AState {
    id: &'static str,
    b: BClient,
}

async fn a_handler(State(state): State<AState>) -> Result<Json<Answer>, String> {
    // B's instance is chosen by A's balancer from the stain this request carries.
    let res = state
        .b
        .oneshot(
            Request::get("/")
                .body(Empty::new())
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| format!("B: {e}"))?;
    let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
    let b: Answer = serde_json::from_slice(&body.to_bytes()).map_err(|e| e.to_string())?;
    Ok(Json(Answer {
        instance: state.id.to_owned(),
        lane: current_lane(),
        downstream: Some(Box::new(b)),
    }))
}

async fn listen() -> Result<(TcpListener, SocketAddr), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

fn instances_file(a: &[(&str, SocketAddr, bool)], b: &[(&str, SocketAddr, bool)]) -> String {
    let mut out = String::new();
    for (service, list) in [("a", a), ("b", b)] {
        for (id, addr, gray) in list {
            out.push_str(&format!(
                "[[services.{service}]]\nid = \"{id}\"\naddress = \"{addr}\"\n{}\n",
                if *gray {
                    "labels = { gray = \"true\" }\n"
                } else {
                    ""
                }
            ));
        }
    }
    out
}

/// A user id whose sticky bucket is inside (`inside = true`) or outside 30 %.
fn sticky_user(inside: bool) -> String {
    (1..)
        .map(|i| format!("user-{i}"))
        .find(|u| (sticky_bucket(b"", u.as_bytes()) < 3000) == inside)
        .unwrap_or_default()
}

struct Case {
    what: &'static str,
    from: IpAddr,
    headers: Vec<(&'static str, String)>,
    expect: (&'static str, &'static str, &'static str),
}

async fn send(gateway: SocketAddr, case: &Case) -> Result<Answer, BoxError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .local_address(case.from)
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut req = client.get(format!("http://{gateway}/a/hello"));
    for (k, v) in &case.headers {
        req = req.header(*k, v);
    }
    let res = req.send().await?;
    let status = res.status();
    let text = res.text().await?;
    if !status.is_success() {
        return Err(format!("{status}: {text}").into());
    }
    Ok(serde_json::from_str(&text)?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let serve_forever = std::env::args().any(|a| a == "--serve");
    let dir = std::env::temp_dir().join(format!("gray-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&dir, serve_forever).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(dir: &Path, serve_forever: bool) -> Result<(), BoxError> {
    // 1. Bind every instance first, so the instance file can name the real ports.
    let (a_base_l, a_base) = listen().await?;
    let (a_gray_l, a_gray) = listen().await?;
    let (b_base_l, b_base) = listen().await?;
    let (b_gray_l, b_gray) = listen().await?;
    let a_list = [("a-base", a_base, false), ("a-gray", a_gray, true)];
    let b_list = [("b-base", b_base, false), ("b-gray", b_gray, true)];
    let instances = dir.join("instances.toml");
    std::fs::write(&instances, instances_file(&a_list, &b_list))?;

    // 2. B: two instances that report the lane they saw.
    for (listener, id) in [(b_base_l, "b-base"), (b_gray_l, "b-gray")] {
        let app = Router::new()
            .route("/", get(b_handler))
            .with_state(id)
            .layer(ExtractStainLayer::new());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    // 3. A: two instances; each calls B through a label-aware balancer over one registry of
    // the same file, which follows the file whether or not requests flow.
    let registry = Registry::start(FileSource::new(&instances)).await?;
    for (listener, id) in [(a_base_l, "a-base"), (a_gray_l, "a-gray")] {
        let endpoints = registry
            .service("b")?
            .endpoints(HttpEndpoints::<_, Empty<Bytes>>::new());
        let policy = Policy::new().with_fallback(gray_policy::Fallback::Baseline);
        // One balancer for every request the instance makes: it picks in the handler's
        // task, where it reads the handler's stain (the task-local).
        let balance = BalanceLayer::new("b", policy).build(endpoints);
        let client = ServiceBuilder::new()
            .layer(PropagateStainLayer::new())
            .service(balance);
        let state = AState {
            id,
            b: BClient::new(client),
        };
        let app = Router::new()
            .route("/hello", get(a_handler))
            .with_state(state)
            .layer(ExtractStainLayer::new());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    // 4. The gateway: rules and instances from files, reloaded live.
    std::fs::write(
        dir.join("rules.toml"),
        r#"
[[rules]]
name = "whitelisted office network (seed 003)"
when = { ip = ["10.1.2.0/24"] }
lane = "gray"

[[rules]]
name = "30% of users, sticky by the uid cookie"
when = { sticky = { by = { cookie = "uid" }, percent = 30 } }
lane = "gray"
"#,
    )?;
    let config_path = dir.join("gateway.toml");
    std::fs::write(
        &config_path,
        format!(
            r#"
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
trusted_clients = ["127.0.0.1/32"]
trusted_proxies = ["127.0.0.3/32"]
rules = "rules.toml"
instances = "{}"

[services.a]
fallback = "baseline"
"#,
            instances.display()
        ),
    )?;
    let gateway = Gateway::start(Config::load(&config_path)?).await?;
    let gw = gateway.addr();

    let trusted: IpAddr = [127, 0, 0, 1].into();
    let untrusted: IpAddr = [127, 0, 0, 2].into();
    let proxy: IpAddr = [127, 0, 0, 3].into();
    let gray_header = || vec![("x-gray-lane", "gray".to_owned())];
    let cases = vec![
        Case {
            what: "unstained",
            from: trusted,
            headers: vec![],
            expect: ("baseline", "a-base", "b-base"),
        },
        Case {
            what: "x-gray-lane: gray, trusted client",
            from: trusted,
            headers: gray_header(),
            expect: ("gray", "a-gray", "b-gray"),
        },
        Case {
            what: "x-gray-lane: gray, untrusted client",
            from: untrusted,
            headers: gray_header(),
            expect: ("baseline", "a-base", "b-base"),
        },
        Case {
            what: "whitelisted IP via trusted proxy",
            from: proxy,
            headers: vec![("x-forwarded-for", "10.1.2.3".into())],
            expect: ("gray", "a-gray", "b-gray"),
        },
        Case {
            what: "forged X-Forwarded-For, untrusted",
            from: untrusted,
            headers: vec![("x-forwarded-for", "10.1.2.3".into())],
            expect: ("baseline", "a-base", "b-base"),
        },
        Case {
            what: "sticky user inside 30%",
            from: untrusted,
            headers: vec![("cookie", format!("uid={}", sticky_user(true)))],
            expect: ("gray", "a-gray", "b-gray"),
        },
        Case {
            what: "sticky user outside 30%",
            from: untrusted,
            headers: vec![("cookie", format!("uid={}", sticky_user(false)))],
            expect: ("baseline", "a-base", "b-base"),
        },
    ];

    println!("gateway http://{gw}   A: a-base, a-gray   B: b-base, b-gray\n");
    let mut failures = 0;
    print_header("phase 1: B has a gray instance");
    for case in &cases {
        failures += report(gw, case).await;
    }

    // Phase 2: B's gray instance leaves the registry; gray traffic to B falls back.
    std::fs::write(&instances, instances_file(&a_list, &b_list[..1]))?;
    wait_for_b_without_gray(gw).await;
    println!();
    print_header("phase 2: B has no gray instance (fallback to baseline)");
    let fallback = Case {
        what: "x-gray-lane: gray, trusted client",
        from: trusted,
        headers: gray_header(),
        expect: ("gray", "a-gray", "b-base"),
    };
    failures += report(gw, &fallback).await;

    if serve_forever {
        std::fs::write(&instances, instances_file(&a_list, &b_list))?;
        println!("\nserving; try:");
        println!("  curl -s http://{gw}/a/hello");
        println!("  curl -s -H 'x-gray-lane: gray' http://{gw}/a/hello");
        println!(
            "  curl -s --cookie uid={} http://{gw}/a/hello",
            sticky_user(true)
        );
        if let Some(admin) = gateway.admin_addr() {
            println!(
                "  curl -s http://{admin}/explain -d '{{\"headers\":{{\"x-gray-lane\":\"gray\"}}}}'"
            );
            println!("  curl -s http://{admin}/metrics");
        }
        println!(
            "  (edit {} or {} and watch them reload)",
            dir.join("rules.toml").display(),
            instances.display()
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    gateway.shutdown().await;
    if failures > 0 {
        return Err(format!("{failures} request(s) were not routed as expected").into());
    }
    println!("\nall requests routed as expected");
    Ok(())
}

fn print_header(title: &str) {
    println!("{title}");
    println!("  {:<40} {:<9} {:<7} {:<7}", "request", "lane", "A", "B");
}

async fn report(gateway: SocketAddr, case: &Case) -> usize {
    match send(gateway, case).await {
        Ok(answer) => {
            let lane = answer.lane.clone().unwrap_or_else(|| "baseline".into());
            let b = answer
                .downstream
                .as_ref()
                .map_or("-".to_owned(), |b| b.instance.clone());
            let ok = (lane.as_str(), answer.instance.as_str(), b.as_str()) == case.expect;
            println!(
                "  {:<40} {:<9} {:<7} {:<7} {}",
                case.what,
                lane,
                answer.instance,
                b,
                if ok { "" } else { "  <-- unexpected" }
            );
            usize::from(!ok)
        }
        Err(e) => {
            println!("  {:<40} error: {e}", case.what);
            1
        }
    }
}

/// Waits (bounded) until A's balancer has seen that B's gray instance is gone.
async fn wait_for_b_without_gray(gateway: SocketAddr) {
    let case = Case {
        what: "",
        from: [127, 0, 0, 1].into(),
        headers: vec![("x-gray-lane", "gray".into())],
        expect: ("", "", ""),
    };
    for _ in 0..50 {
        if let Ok(answer) = send(gateway, &case).await
            && answer.downstream.is_some_and(|b| b.instance == "b-base")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
