//! What the rollout tests share: upstream instances that fail on demand, the rules, the
//! admin API's calls and bounded waits on them, and a load of sticky users; for a gateway
//! in this process ([`Gateway`]) or a gateway process (anything with [`Addrs`]).

#![allow(dead_code)] // each test binary uses its part

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{extract::State, http::HeaderMap, response::IntoResponse};
use bytes::Bytes;
use gray_gateway::Gateway;
use gray_test_support::TempDir;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod process;

/// Where a gateway listens: its proxy and its admin API.
pub(crate) trait Addrs {
    /// The proxy's address.
    fn proxy(&self) -> SocketAddr;
    /// The admin API's address.
    fn admin(&self) -> SocketAddr;
}

impl Addrs for Gateway {
    fn proxy(&self) -> SocketAddr {
        self.addr()
    }
    fn admin(&self) -> SocketAddr {
        self.admin_addr().expect("the gateway has an admin address")
    }
}

/// One upstream instance: fails `fail_per_mille` of its requests (every request whose
/// count modulo 1000 is below it), with `fail_testers`, every request with `x-tester`,
/// and every request of the user `fail_user` (`x-user`), if set. It answers with its name
/// (`x-served-by` too), or with the JSON `json(n)` of its `n`th request when set.
#[derive(Clone)]
pub(crate) struct Upstream {
    pub(crate) name: &'static str,
    pub(crate) fail_per_mille: Arc<AtomicU32>,
    pub(crate) fail_testers: Arc<AtomicBool>,
    pub(crate) fail_user: Arc<Mutex<Option<String>>>,
    pub(crate) count: Arc<AtomicU64>,
    pub(crate) json: Option<fn(u64) -> String>,
}

pub(crate) async fn answer(State(up): State<Upstream>, headers: HeaderMap) -> impl IntoResponse {
    let n = up.count.fetch_add(1, Ordering::Relaxed);
    let fail = (n % 1000) < u64::from(up.fail_per_mille.load(Ordering::Relaxed))
        || (up.fail_testers.load(Ordering::Relaxed) && headers.contains_key("x-tester"))
        || up.fail_user.lock().unwrap().as_deref().is_some_and(|user| {
            headers
                .get("x-user")
                .is_some_and(|v| v.as_bytes() == user.as_bytes())
        });
    let status = if fail { 500 } else { 200 };
    let (body, kind) = match up.json {
        Some(json) => (json(n), "application/json"),
        None => (up.name.to_owned(), "text/plain; charset=utf-8"),
    };
    (
        http::StatusCode::from_u16(status).unwrap(),
        [("x-served-by", up.name), ("content-type", kind)],
        body,
    )
}

pub(crate) async fn upstream(name: &'static str) -> (SocketAddr, Upstream) {
    upstream_answering(name, None).await
}

/// [`upstream`], answering the JSON `json(n)` to its `n`th request when given.
pub(crate) async fn upstream_answering(
    name: &'static str,
    json: Option<fn(u64) -> String>,
) -> (SocketAddr, Upstream) {
    let up = Upstream {
        name,
        fail_per_mille: Arc::default(),
        fail_testers: Arc::default(),
        fail_user: Arc::default(),
        count: Arc::default(),
        json,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(answer).with_state(up.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, up)
}

pub(crate) const RULES: &str = r#"
[[rules]]
name = "testers"
when = { header = { name = "x-tester", present = true } }
lane = "gray"

[[rules]]
name = "canary"
when = { sticky = { by = { header = "x-user" }, percent = 0 } }
lane = "gray"
"#;

/// The `[rollouts]` keys of the tests' gateways: the state saved and reports published
/// every 300 ms at most (the defaults are 15 s), so that the evidence settles within a
/// second of the load's end. The default cadences have tests of their own.
pub(crate) const FAST_WRITES: &str = "save_every_ms = 300\nreport_every_ms = 300\n";

/// A folder for a gateway on file discovery: a gray and a baseline instance of `svc`
/// (`instances.toml`), [`RULES`], and a `gateway.toml` whose `[rollouts]` table has the
/// keys `settings` and whose rollout of `svc` (rule `canary`) has the keys `rollout`.
pub(crate) async fn files(
    tag: &str,
    settings: &str,
    rollout: &str,
) -> (TempDir, Upstream, Upstream) {
    let dir = TempDir::new(tag);
    let (gray_addr, gray) = upstream("gray-1").await;
    let (base_addr, base) = upstream("base-1").await;
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"gray-1\"\naddress = \"{gray_addr}\"\nlabels = {{ gray = true }}\n\n\
             [[services.svc]]\nid = \"base-1\"\naddress = \"{base_addr}\"\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules.toml"), RULES).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\
             instances = \"instances.toml\"\n\n[rollouts]\n{FAST_WRITES}{settings}\n\
             [services.svc]\npreset = \"seed-000\"\n\n[services.svc.rollout]\nrule = \"canary\"\n{rollout}"
        ),
    )
    .unwrap();
    (dir, gray, base)
}

/// Adds top-level `keys` to the `gateway.toml` [`files`] wrote in `dir` (after `admin`).
pub(crate) fn add_top_level(dir: &TempDir, keys: &str) {
    let path = dir.path().join("gateway.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "admin = \"127.0.0.1:0\"\n",
        &format!("admin = \"127.0.0.1:0\"\n{keys}"),
    );
    std::fs::write(&path, text).unwrap();
}

pub(crate) type HttpClient =
    Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An admin request: the status and the JSON body.
pub(crate) async fn admin(gateway: &impl Addrs, method: &str, path: &str) -> (u16, Value) {
    let (status, _, body) = admin_with(gateway, method, path, &[]).await;
    (status, body)
}

/// An admin request with `headers`: the status, the response's headers and the JSON body.
pub(crate) async fn admin_with(
    gateway: &impl Addrs,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, Value) {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", gateway.admin()));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = client()
        .request(req.body(Empty::new()).unwrap())
        .await
        .expect("the admin answers");
    let status = res.status().as_u16();
    let head = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        head,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    )
}

/// Polls `/rollouts/svc` until `done` holds, for at most `bound`.
pub(crate) async fn wait_for(
    gateway: &impl Addrs,
    bound: Duration,
    done: impl FnMut(&Value) -> bool,
) -> Value {
    wait_for_rollout(gateway, "svc", bound, done).await
}

/// Polls `/rollouts/{service}` until `done` holds, for at most `bound`.
pub(crate) async fn wait_for_rollout(
    gateway: &impl Addrs,
    service: &str,
    bound: Duration,
    mut done: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + bound;
    let path = format!("/rollouts/{service}");
    loop {
        let (_, view) = admin(gateway, "GET", &path).await;
        if done(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "not reached within {bound:?}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the load saw: per request, the user, the status and who served it.
#[derive(Default)]
pub(crate) struct Seen(pub(crate) Mutex<Vec<(u32, u16, String)>>);

impl Seen {
    /// Whether every request was answered 200.
    pub(crate) fn all_ok(&self) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .all(|(_, status, _)| *status == 200)
    }
}

/// Users `0..users` (`x-user: u{i}`), `concurrency` requests at a time, until `stop`;
/// `tester`: with `x-tester` too.
pub(crate) fn load(
    gateway: &impl Addrs,
    users: u32,
    concurrency: u32,
    tester: bool,
    stop: Arc<AtomicBool>,
) -> (Arc<Seen>, Vec<tokio::task::JoinHandle<()>>) {
    let to = Spread {
        proxies: vec![gateway.proxy()],
        path: "/svc/x",
        tester,
    };
    to.load(users, concurrency, stop)
}

/// Where a load goes: request after request to the next of `proxies` (round robin over
/// every request of every client, as an L4 balancer in front of the gateways spreads one
/// user's requests; a proxy listed twice takes twice the share), at `path`; `tester`:
/// with `x-tester`.
pub(crate) struct Spread {
    pub(crate) proxies: Vec<SocketAddr>,
    pub(crate) path: &'static str,
    pub(crate) tester: bool,
}

impl Spread {
    /// Users `0..users` (`x-user: u{i}`), `concurrency` requests at a time, until `stop`:
    /// what the load saw (who served each request, by `x-served-by`).
    pub(crate) fn load(
        self,
        users: u32,
        concurrency: u32,
        stop: Arc<AtomicBool>,
    ) -> (Arc<Seen>, Vec<tokio::task::JoinHandle<()>>) {
        let seen = Arc::new(Seen::default());
        let to = Arc::new(self);
        let next = Arc::new(AtomicU64::new(0));
        let tasks = (0..concurrency)
            .map(|c| {
                let (seen, stop, client) = (seen.clone(), stop.clone(), client());
                let (to, next) = (to.clone(), next.clone());
                tokio::spawn(async move {
                    let mut user = c;
                    while !stop.load(Ordering::Relaxed) {
                        user = (user + concurrency) % users;
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let addr = to.proxies[i % to.proxies.len()];
                        let mut req = http::Request::get(format!("http://{addr}{}", to.path))
                            .header("x-user", format!("u{user}"));
                        if to.tester {
                            req = req.header("x-tester", "1");
                        }
                        let Ok(res) = client.request(req.body(Empty::new()).unwrap()).await else {
                            continue;
                        };
                        let by = res
                            .headers()
                            .get("x-served-by")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned();
                        let status = res.status().as_u16();
                        let _ = res.into_body().collect().await;
                        seen.0.lock().unwrap().push((user, status, by));
                    }
                })
            })
            .collect();
        (seen, tasks)
    }
}

pub(crate) async fn stop_load(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
}

pub(crate) async fn wait_until_seen(seen: &Seen, n: usize) {
    // Generous: the whole suite shares two cores with these debug-built gateways.
    let deadline = Instant::now() + Duration::from_secs(90);
    while seen.0.lock().unwrap().len() < n {
        assert!(
            Instant::now() < deadline,
            "the load made fewer than {n} requests"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The view once the evidence stopped changing (the load stopped, and looks took in its
/// last requests): the same evidence for 2 s, over which the state was saved again (with
/// [`FAST_WRITES`], every report published since the load's end is in it).
pub(crate) async fn settled(gateway: &impl Addrs) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = admin(gateway, "GET", "/rollouts/svc").await.1;
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = admin(gateway, "GET", "/rollouts/svc").await.1;
        assert!(
            Instant::now() < deadline,
            "the evidence never settled: {now:#}"
        );
        if now["evidence"] != first["evidence"] {
            (first, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(2) && now["version"] != first["version"] {
            return now;
        }
    }
}

pub(crate) async fn text(gateway: &impl Addrs, path: &str) -> String {
    let req = http::Request::get(format!("http://{}{path}", gateway.admin()))
        .body(Empty::new())
        .unwrap();
    let res = client().request(req).await.unwrap();
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// The sum of the series of the counter `name` (in Prometheus' text, `metrics`) whose
/// labels include every one of `labels` (`key="value"`).
pub(crate) fn counter(metrics: &str, name: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|line| line.rsplit_once("} "))
        .filter(|(series, _)| labels.iter().all(|l| series.split(',').any(|s| s == *l)))
        .map(|(_, value)| value.trim().parse::<u64>().expect("a whole count"))
        .sum()
}
