//! Run with: cargo run -p example-dark-launch
//!
//! A dark launch through the gray gateway, run as a library: before any user meets a new
//! version, the gateway copies baseline's requests to it, compares each copy's answer with
//! the answer the user got (JSON field by field), learns which fields differ anyway (two
//! baseline instances' timestamps) and judges the rest with an anytime-valid test. The
//! rollout of `orders` starts in its shadow phase (weight 0, copies only): an alarm rolls
//! it back, a clean hold enters its first step.
//!
//! Two runs, each with two baseline instances of `orders` that stamp every answer with
//! their own clock, a gray instance, a gateway, and a load of users (none of them gray):
//!
//! 1. gray computes the total of one order in 50 wrong: it is rolled back from the shadow
//!    phase (`shadow_alarm`), and no user was ever answered by gray;
//! 2. gray differs from baseline only in its timestamps: it goes on to its first step
//!    (`shadow_passed`).
//!
//! Each run prints its timeline from `GET /rollouts/orders`: time, phase, the pairs judged
//! (a copy and its control) with their mismatches, the ln M of the test's two streams
//! (mismatches, slow answers) against the alarm line, and the transitions. Run 1 also
//! prints the latest mismatches as the API shows them. The program checks its own output
//! and exits non-zero when a check fails.

use std::{
    net::SocketAddr,
    path::Path,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{Json, extract, routing::get};
use gray_gateway::{Gateway, X_GRAY_INSTANCE, config::Config};
use serde_json::{Value, json};
use tokio::{task::JoinHandle, time::MissedTickBehavior};

/// The gateway's configuration; the rules and the instances are files beside it.
const GATEWAY: &str = r#"
# The load, the instances and the gateway share one process and one runtime here, so the
# gateway's own shedding of copies under load (`mirror_max_busy`, default 0.75) would
# judge this example's load generator; a real gateway keeps the defaults.
mirror_priority = "normal"
mirror_max_busy = 1

listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
rules = "rules.toml"
instances = "instances.toml"

[rollouts]
interval_ms = 200

[services.orders]
preset = "seed-000"

[services.orders.mirror]
lane = "gray"          # copies of baseline's GETs go to gray's instances
control_percent = 100  # each also to a second baseline instance (20 % by default)

[services.orders.rollout]
rule = "canary"
steps = [10, 50, 100]
hold_ms = 60000
min_users = 100
alpha = 0.01
shadow = { hold_ms = 10000, min_requests = 2000 }  # copies only, judged, then the first step
"#;

const RULES: &str = r#"
[[rules]]
name = "canary"
when = { sticky = { by = { header = "x-user" }, percent = 0 } }
lane = "gray"
"#;

/// The users' requests a second, and how long a run may take at most.
const RATE: u64 = 200;
const DEADLINE: Duration = Duration::from_secs(60);

/// How long an instance takes to answer (a database, say). It keeps the judge's `slow`
/// stream (an answer more than twice the user's, and 10 ms beyond it) about the service:
/// with answers in a fraction of a millisecond, any 10 ms pause of a busy machine would
/// make a copy slow.
const LOOKUP: Duration = Duration::from_millis(20);

/// An instance of `orders`: `GET /{id}` answers the order, stamped with the instance's
/// own clock; with `wrong_every`, the total of one order in that many is off by one.
fn instance(listener: tokio::net::TcpListener, wrong_every: Option<u64>) -> JoinHandle<()> {
    let order = move |extract::Path(id): extract::Path<u64>| async move {
        tokio::time::sleep(LOOKUP).await;
        let wrong = wrong_every.is_some_and(|every| id % every == 0);
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let total = 42 + id % 7 + u64::from(wrong);
        Json(json!({"id": id, "total": total, "ts": ts.as_nanos() as u64}))
    };
    let app = axum::Router::new().route("/{id}", get(order));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// What the users saw: their answers, those gray gave, and those that were not a 200.
#[derive(Default)]
struct Answers {
    total: AtomicU64,
    by_gray: AtomicU64,
    failed: AtomicU64,
}

impl Answers {
    /// Counts a user's answer (read whole).
    async fn count(&self, answer: reqwest::Result<reqwest::Response>) {
        let ok = match answer {
            Ok(res) => {
                let by = res.headers().get(X_GRAY_INSTANCE);
                let gray = by.is_some_and(|v| v == "gray");
                self.by_gray.fetch_add(u64::from(gray), Ordering::Relaxed);
                res.status() == 200 && res.bytes().await.is_ok()
            }
            Err(_) => false,
        };
        self.failed.fetch_add(u64::from(!ok), Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
    }
}

/// [`RATE`] requests a second through the gateway at `url` from eight tasks, until
/// `stop`: each asks for a new order, as one of 500 users outside the canary's percentage.
fn load(url: String, stop: Arc<AtomicBool>, answers: Arc<Answers>) -> Vec<JoinHandle<()>> {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let orders = Arc::new(AtomicU64::new(0));
    let task = move |_| {
        let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
        let (orders, answers) = (orders.clone(), answers.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(8_000_000 / RATE));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let id = orders.fetch_add(1, Ordering::Relaxed);
                let order = client.get(format!("{url}/orders/{id}"));
                let answer = order
                    .header("x-user", format!("u{}", id % 500))
                    .send()
                    .await;
                answers.count(answer).await;
            }
        })
    };
    (0..8).map(task).collect()
}

/// The JSON the admin API answers `request` with (`null` when it does not answer).
async fn admin(request: reqwest::RequestBuilder) -> Value {
    let Ok(res) = request.send().await else {
        return Value::Null;
    };
    serde_json::from_slice(&res.bytes().await.unwrap_or_default()).unwrap_or_default()
}

/// A string of the admin API's JSON, `?` where it has none.
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}

/// Prints a line of the timeline: the time, and what a view of `/rollouts/orders` shows.
fn line(t: Duration, view: &Value, event: &str) {
    let (shadow, n) = (&view["shadow"], |v: &Value| v.as_u64().unwrap_or(0));
    let (counts, ln_m) = (&shadow["counts"], |v: &Value| v.as_f64().unwrap_or(0.0));
    println!(
        "{:>5.1}s  {:<11}  {:>6} {:>10}  {:>8} {:>10}  {:>8.2} {:>5.2} / {:.2}  {event}",
        t.as_secs_f64(),
        text(&view["phase"]),
        n(&counts["copies"]),
        n(&counts["copy_mismatches"]),
        n(&counts["controls"]),
        n(&counts["control_mismatches"]),
        ln_m(&shadow["mismatch_log_m"]),
        ln_m(&shadow["slow_log_m"]),
        ln_m(&shadow["alarm_at"]),
    );
}

/// What a run ends with: the rollout's last view; the users' answers by gray, those by
/// gray before a view that still showed the shadow phase, and those that were not a 200.
struct Outcome {
    view: Value,
    by_gray: u64,
    by_gray_in_shadow: u64,
    failed: u64,
}

/// Starts the rollout at `url` (`/rollouts/orders`) and prints its timeline (a line
/// every two seconds, one when the noise is learned, one per transition) until it leaves its
/// shadow phase, or [`DEADLINE`].
async fn timeline(url: &str, answers: &Answers) -> (Value, u64) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    println!(
        "  time  phase        copies mismatched  controls mismatched  ln M: mismatch  slow / alarm"
    );
    let start = Instant::now();
    line(start.elapsed(), &admin(client.post(url)).await, "start");
    let (mut printed, mut seen, mut noise) = (Duration::ZERO, 1, false);
    let mut by_gray_in_shadow = 0;
    loop {
        let by_gray = answers.by_gray.load(Ordering::Relaxed);
        let view = admin(client.get(url)).await;
        let t = start.elapsed();
        let phase = view["phase"].as_str();
        if phase == Some("shadow") {
            by_gray_in_shadow = by_gray;
        }
        let learned = &view["shadow"]["noise"];
        if !noise && learned.as_array().is_some_and(|n| !n.is_empty()) {
            noise = true;
            line(t, &view, &format!("noise learned: {learned}"));
        }
        let transitions = view["transitions"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        for tr in transitions.iter().skip(seen) {
            let (reason, stream) = (&tr["reason"], tr["reason"]["stream"].as_str());
            let mut why = format!(
                "{} → {}: {}",
                text(&tr["from"]),
                text(&tr["to"]),
                text(&reason["kind"])
            );
            why += &stream.map(|s| format!(" ({s})")).unwrap_or_default();
            line(t, &view, &why);
            printed = t;
        }
        seen = seen.max(transitions.len());
        if phase.is_some_and(|p| p != "shadow") || t > DEADLINE {
            return (view, by_gray_in_shadow);
        }
        if t >= printed + Duration::from_secs(2) {
            line(t, &view, "");
            printed = t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A dark launch of a gray instance with `wrong_every` (see [`instance`]), its files in a
/// folder of `tag`: the instances, the gateway, the load, the timeline.
async fn dark_launch(tag: &str, wrong_every: Option<u64>) -> Result<Outcome, String> {
    let (mut addrs, mut servers) = (Vec::new(), Vec::new());
    for wrong_every in [None, None, wrong_every] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        servers.push(instance(listener, wrong_every));
    }
    let dir =
        std::env::temp_dir().join(format!("example-dark-launch-{tag}-{}", std::process::id()));
    let gateway = start(&dir, &addrs).await?;
    let url = format!("http://{}/rollouts/orders", gateway.admin_addr().unwrap());
    let (stop, answers) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Answers::default()),
    );
    let users = load(
        format!("http://{}", gateway.addr()),
        stop.clone(),
        answers.clone(),
    );
    let started = Instant::now();
    let (view, by_gray_in_shadow) = timeline(&url, &answers).await;
    stop.store(true, Ordering::Relaxed);
    for task in users {
        let _ = task.await;
    }
    let (total, by_gray) = (
        answers.total.load(Ordering::Relaxed),
        answers.by_gray.load(Ordering::Relaxed),
    );
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "  {total} users' requests in {elapsed:.1} s; answered by gray: {by_gray_in_shadow} in the shadow phase, {by_gray} in all"
    );
    gateway.shutdown().await;
    servers.iter().for_each(JoinHandle::abort);
    let _ = std::fs::remove_dir_all(&dir);
    let failed = answers.failed.load(Ordering::Relaxed);
    Ok(Outcome {
        view,
        by_gray,
        by_gray_in_shadow,
        failed,
    })
}

/// A gateway over two baseline instances and a gray one (`addrs`, in that order), its
/// files in `dir`.
async fn start(dir: &Path, addrs: &[SocketAddr]) -> Result<Gateway, String> {
    let instance = |id: &str, addr: SocketAddr, labels: &str| {
        format!("[[services.orders]]\nid = \"{id}\"\naddress = \"{addr}\"\n{labels}\n")
    };
    let instances = instance("base-1", addrs[0], "")
        + &instance("base-2", addrs[1], "")
        + &instance("gray", addrs[2], "labels = { gray = true }");
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text);
    std::fs::create_dir_all(dir)
        .and_then(|()| write("rules.toml", RULES))
        .and_then(|()| write("instances.toml", &instances))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let config = Config::parse(GATEWAY, &dir.join("gateway.toml")).map_err(|e| e.to_string())?;
    Gateway::start(config).await.map_err(|e| e.to_string())
}

/// Prints each check and whether it passed; `true` when all did.
fn checked(checks: &[(&str, bool)]) -> bool {
    for (what, passed) in checks {
        println!("{} {what}", if *passed { "ok:  " } else { "FAIL:" });
    }
    checks.iter().all(|(_, passed)| *passed)
}

/// Whether the judge of `view` learned the timestamp as noise.
fn ts_is_noise(view: &Value) -> bool {
    let noise = view["shadow"]["noise"].as_array();
    noise.is_some_and(|n| n.contains(&json!("json /ts")))
}

#[tokio::main]
async fn main() -> ExitCode {
    println!("run 1: gray computes the total of one order in 50 wrong");
    let bug = match dark_launch("bug", Some(50)).await {
        Ok(outcome) => outcome,
        Err(e) => return failed(&e),
    };
    let (v, reason) = (&bug.view, &bug.view["last_transition"]["reason"]);
    let recent = v["shadow"]["recent_mismatches"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    println!("  the latest mismatches, newest first, as GET /rollouts/orders shows them:");
    for m in recent.iter().rev().take(3) {
        let ms = |v: &Value| v.as_f64().unwrap_or(0.0);
        println!(
            "    {} {:<6}  user {} in {:.1} ms, gray {} in {:.1} ms  differences {}",
            text(&m["method"]),
            text(&m["path"]),
            m["primary_status"],
            ms(&m["primary_ms"]),
            m["copy_status"],
            ms(&m["copy_ms"]),
            m["differences"]
        );
    }
    let run1 = checked(&[
        ("rolled back", v["phase"] == "rolled_back"),
        (
            "for the judge's mismatch alarm",
            reason["kind"] == "shadow_alarm" && reason["stream"] == "mismatch",
        ),
        ("weight 0", v["weight"].as_f64() == Some(0.0)),
        ("the timestamp learned as noise", ts_is_noise(v)),
        (
            "the latest mismatches name the total",
            recent
                .iter()
                .any(|m| m["differences"] == json!(["json /total"])),
        ),
        ("no user was answered by gray", bug.by_gray == 0),
        ("every user got a 200", bug.failed == 0),
    ]);

    println!("\nrun 2: gray differs from baseline only in its timestamps");
    let clean = match dark_launch("clean", None).await {
        Ok(outcome) => outcome,
        Err(e) => return failed(&e),
    };
    let (v, transition) = (&clean.view, &clean.view["last_transition"]);
    let run2 = checked(&[
        (
            "on to its first step, 10 %",
            v["phase"] == "step" && v["weight"].as_f64() == Some(10.0),
        ),
        (
            "for a clean shadow phase",
            transition["reason"]["kind"] == "shadow_passed",
        ),
        (
            "the timestamp learned as noise, and no mismatch beyond it",
            ts_is_noise(v) && v["shadow"]["counts"]["copy_mismatches"] == 0,
        ),
        (
            "no user was answered by gray in the shadow phase",
            clean.by_gray_in_shadow == 0 && transition["evidence"]["requests"]["gray"] == 0,
        ),
        ("every user got a 200", clean.failed == 0),
    ]);
    if run1 && run2 {
        ExitCode::SUCCESS
    } else {
        failed("a check failed")
    }
}

/// Says why the program fails.
fn failed(why: &str) -> ExitCode {
    eprintln!("example-dark-launch: {why}");
    ExitCode::FAILURE
}
