//! Run with: cargo run -p example-rollout
//!
//! A rollout through the gray gateway, run as a library: the program starts a baseline and
//! a gray instance of `orders`, a gateway in front of them whose rules have a sticky
//! percentage (`canary`, by the `x-user` header) and whose `orders` service has a rollout
//! (steps 10, 25, 50, 100 %, short holds), and a load of 300 sticky users. It starts the
//! rollout through the admin API (`POST /rollouts/orders`), lets it advance while gray is
//! healthy, then makes gray fail 5 % of its requests, and prints the timeline (time,
//! weight, evidence, transition) as the gateway rolls gray back by itself.
//!
//! It checks its own output: rolled back, weight 0, for an alarm or the kill switch, and
//! no baseline user ever got an error; it exits non-zero otherwise.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{extract::State, http::StatusCode};
use gray_gateway::{Gateway, config::Config};
use serde_json::Value;

/// An instance: fails `per_mille` of its requests (every request whose count modulo 1000
/// is below it).
#[derive(Clone, Default)]
struct Instance {
    per_mille: Arc<AtomicU32>,
    count: Arc<AtomicU64>,
}

async fn instance(name: &'static str) -> (SocketAddr, Instance) {
    let state = Instance::default();
    let app = axum::Router::new()
        .fallback(move |State(i): State<Instance>| async move {
            let n = i.count.fetch_add(1, Ordering::Relaxed);
            let fail = n % 1000 < u64::from(i.per_mille.load(Ordering::Relaxed));
            let status = if fail {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            };
            (status, [("x-served-by", name)], name)
        })
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, state)
}

const RULES: &str = r#"
[[rules]]
name = "canary"
when = { sticky = { by = { header = "x-user" }, percent = 0 } }
lane = "gray"
"#;

async fn gateway(dir: &std::path::Path, gray: SocketAddr, base: SocketAddr) -> Gateway {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    std::fs::write(
        dir.join("instances.toml"),
        format!(
            "[[services.orders]]\nid = \"orders-gray\"\naddress = \"{gray}\"\nlabels = {{ gray = true }}\n\n\
             [[services.orders]]\nid = \"orders-1\"\naddress = \"{base}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\
         instances = \"instances.toml\"\n\n[rollouts]\ninterval_ms = 200\n\n\
         [services.orders]\npreset = \"seed-000\"\n\n\
         [services.orders.rollout]\nrule = \"canary\"\nsteps = [10, 25, 50, 100]\n\
         hold_ms = 1500\nmin_users = 20\nalpha = 0.01\n\
         detect = { min_rate = 0.5 }\n",
    )
    .unwrap();
    let config = Config::load(&dir.join("gateway.toml")).expect("a valid configuration");
    Gateway::start(config).await.expect("the gateway starts")
}

/// The admin API's JSON answer to `req`.
async fn json(req: reqwest::RequestBuilder) -> Value {
    let body = req
        .send()
        .await
        .expect("the admin answers")
        .bytes()
        .await
        .unwrap();
    serde_json::from_slice(&body).expect("JSON")
}

/// One line of the timeline.
fn line(t: Duration, v: &Value, transition: &str) -> String {
    let e = &v["evidence"];
    format!(
        "{:>6.1}s  weight {:>5}%  {:<11}  gray {:>5} req {:>3} err  baseline {:>5} req {:>3} err  errors ln M {:>6.2} / {:.2}  {transition}",
        t.as_secs_f64(),
        v["weight"].as_f64().unwrap_or(f64::NAN),
        v["phase"].as_str().unwrap_or("?"),
        e["requests"]["gray"],
        e["errors"]["gray"],
        e["requests"]["baseline"],
        e["errors"]["baseline"],
        e["streams"]["errors"]["log_m"].as_f64().unwrap_or(0.0),
        e["streams"]["errors"]["alarm_at"].as_f64().unwrap_or(0.0),
    )
}

#[tokio::main]
async fn main() {
    let (gray_addr, gray) = instance("orders-gray").await;
    let (base_addr, _base) = instance("orders-1").await;
    let dir = std::env::temp_dir().join(format!("example-rollout-{}", std::process::id()));
    let gw = gateway(&dir, gray_addr, base_addr).await;
    let admin = format!("http://{}", gw.admin_addr().unwrap());
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    // 300 sticky users, 8 requests at a time; a baseline user who gets an error is counted
    let stop = Arc::new(AtomicBool::new(false));
    let baseline_errors = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for c in 0..8u32 {
        let (client, stop, errors) = (client.clone(), stop.clone(), baseline_errors.clone());
        let url = format!("http://{}/orders/items", gw.addr());
        load.push(tokio::spawn(async move {
            let mut user = c;
            while !stop.load(Ordering::Relaxed) {
                user = (user + 8) % 300;
                let Ok(res) = client
                    .get(&url)
                    .header("x-user", format!("u{user}"))
                    .send()
                    .await
                else {
                    continue;
                };
                let baseline = res
                    .headers()
                    .get("x-served-by")
                    .is_some_and(|v| v == "orders-1");
                if baseline && !res.status().is_success() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                let _ = res.bytes().await;
            }
        }));
    }

    let start = Instant::now();
    let started: Value = json(client.post(format!("{admin}/rollouts/orders"))).await;
    println!("{}", line(start.elapsed(), &started, "start"));

    // the timeline: a line per transition; gray goes bad once the rollout reached 25 %
    let (mut seen, mut fault_at) = (1, None);
    let deadline = start + Duration::from_secs(90);
    let view = loop {
        let v: Value = json(client.get(format!("{admin}/rollouts/orders"))).await;
        let transitions = v["transitions"].as_array().cloned().unwrap_or_default();
        for t in transitions.iter().skip(seen) {
            let why = format!(
                "{} → {}: {}",
                t["from"].as_str().unwrap_or("?"),
                t["to"].as_str().unwrap_or("?"),
                t["reason"]
            );
            println!("{}", line(start.elapsed(), &v, &why));
        }
        seen = transitions.len();
        if fault_at.is_none() && v["weight"].as_f64() >= Some(25.0) {
            gray.per_mille.store(50, Ordering::Relaxed);
            fault_at = Some(Instant::now());
            println!(
                "{}",
                line(
                    start.elapsed(),
                    &v,
                    "** gray starts failing 5 % of its requests **"
                )
            );
        }
        let phase = v["phase"].as_str().unwrap_or("");
        if phase == "rolled_back" || phase == "promoted" || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    if let Some(at) = fault_at {
        println!(
            "\nfrom the fault to weight 0: {:.1} s",
            at.elapsed().as_secs_f64()
        );
    }

    let reason = view["last_transition"]["reason"]["kind"]
        .as_str()
        .unwrap_or("");
    let checks = [
        ("rolled back", view["phase"] == "rolled_back"),
        ("weight 0", view["weight"].as_f64() == Some(0.0)),
        (
            "for an alarm or the kill switch",
            reason == "alarm" || reason == "kill_switch",
        ),
        (
            "no baseline user got an error",
            baseline_errors.load(Ordering::Relaxed) == 0,
        ),
    ];
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    let mut ok = true;
    for (what, passed) in checks {
        println!("{} {what}", if passed { "ok:  " } else { "FAIL:" });
        ok &= passed;
    }
    if !ok {
        std::process::exit(1);
    }
}
