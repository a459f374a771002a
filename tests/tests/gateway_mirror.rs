//! Mirroring through the gateway (`[services.x.mirror]`), with real axum instances on
//! loopback and a reqwest client: baseline's GETs are copied to the gray lane with its
//! stain and `x-gray-mirror`, compared with the users' answers (JSON field by field, noise
//! ignored where configured) and counted apart from the users' requests; POST is copied
//! only when listed, and a body over `max_body_bytes` reaches baseline intact while its
//! copy is dropped; a shadow that never answers, or none at all, costs the users nothing.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::get};
use gray_gateway::Gateway;
use gray_test_support::{TempDir, WAIT};
use gray_tests::{Server, admin_text, reqwest_client, serve};

/// What an instance saw: each request's method, `x-gray-lane`, `x-gray-mirror`, body.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, Option<String>, Option<String>, Bytes)>>>);

impl Seen {
    fn all(&self) -> Vec<(String, Option<String>, Option<String>, Bytes)> {
        self.0.lock().unwrap().clone()
    }
}

/// An instance answering `GET /item` and `POST /item` with the JSON `answer(n)` (`n`: the
/// requests it has answered), recording what it saw.
async fn instance(seen: Seen, answer: fn(usize) -> String) -> Server {
    #[derive(Clone)]
    struct App {
        seen: Seen,
        answer: fn(usize) -> String,
        n: Arc<AtomicUsize>,
    }
    async fn handle(
        State(app): State<App>,
        method: axum::http::Method,
        headers: HeaderMap,
        body: Bytes,
    ) -> ([(&'static str, &'static str); 1], String) {
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap_or_default().to_owned())
        };
        let len = body.len();
        app.seen.0.lock().unwrap().push((
            method.to_string(),
            header("x-gray-lane"),
            header("x-gray-mirror"),
            body,
        ));
        let n = app.n.fetch_add(1, Ordering::SeqCst);
        let mut answer = (app.answer)(n);
        if method == axum::http::Method::POST {
            answer = format!("{{\"received\":{len}}}");
        }
        ([("content-type", "application/json")], answer)
    }
    let app = App {
        seen,
        answer,
        n: Arc::default(),
    };
    serve(
        Router::new()
            .route("/item", get(handle).post(handle))
            .with_state(app),
    )
    .await
}

/// A gateway over `base` and, when given, `gray` (labelled gray) of the service `svc`, whose
/// `[services.svc]` table has the keys `service`.
async fn gateway(
    dir: &TempDir,
    base: SocketAddr,
    gray: Option<SocketAddr>,
    service: &str,
) -> Gateway {
    gateway_over(dir, &[base], gray, NORMAL, service).await
}

/// Copies at the gateway's own priority, and never shed: these tests count what the
/// judge saw, on a machine other tests keep busy, with the load, the instances and the
/// gateway on one runtime (the defaults, the lowest priority and shedding above 75 %
/// busy, are the benchmark's; shedding has a test of its own).
const NORMAL: &str = "mirror_priority = \"normal\"\nmirror_max_busy = 1";

/// [`gateway`] over several baseline instances, `base-1`, `base-2`…, with the top-level
/// keys `top`.
async fn gateway_over(
    dir: &TempDir,
    bases: &[SocketAddr],
    gray: Option<SocketAddr>,
    top: &str,
    service: &str,
) -> Gateway {
    let mut instances = String::new();
    for (i, base) in bases.iter().enumerate() {
        instances += &format!(
            "[[services.svc]]\nid = \"base-{}\"\naddress = \"{base}\"\n\n",
            i + 1
        );
    }
    if let Some(gray) = gray {
        instances += &format!(
            "[[services.svc]]\nid = \"gray-1\"\naddress = \"{gray}\"\nlabels = {{ gray = true }}\n"
        );
    }
    std::fs::write(dir.path().join("instances.toml"), instances).unwrap();
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

/// The value of `gray_gateway_mirror_requests_total` for `outcome`.
fn mirrored(metrics: &str, outcome: &str) -> u64 {
    let prefix = format!(
        "gray_gateway_mirror_requests_total{{service=\"svc\",lane=\"gray\",outcome=\"{outcome}\"}} "
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Waits (within [`WAIT`]) until the mirror's outcomes `done` add up to `n`; returns the
/// metrics then.
async fn settled(admin: SocketAddr, done: &[&str], n: u64) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let metrics = admin_text(admin, "/metrics").await;
        let sum: u64 = done.iter().map(|o| mirrored(&metrics, o)).sum();
        if sum >= n {
            return metrics;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done:?} reached {sum} of {n} within {WAIT:?}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn same(_: usize) -> String {
    r#"{"id":7,"items":[1,2,3]}"#.to_owned()
}

/// A gateway (its files in a folder of `tag`) over a baseline and a gray instance that
/// answer alike and record what they see, with the `[services.svc]` keys `service`.
struct Pair {
    _dir: TempDir,
    gw: Gateway,
    base_seen: Seen,
    gray_seen: Seen,
    _instances: [Server; 2],
}

async fn pair(tag: &str, service: &str) -> Pair {
    let dir = TempDir::new(tag);
    let (base_seen, gray_seen) = (Seen::default(), Seen::default());
    let base = instance(base_seen.clone(), same).await;
    let gray = instance(gray_seen.clone(), same).await;
    let gw = gateway(&dir, base.addr(), Some(gray.addr()), service).await;
    Pair {
        _dir: dir,
        gw,
        base_seen,
        gray_seen,
        _instances: [base, gray],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_gets_are_copied_to_the_gray_lane_compared_and_counted_apart() {
    // Bound by name (not `..`): the folder and the instances live to the end.
    let Pair {
        gw,
        base_seen,
        gray_seen,
        _dir,
        _instances,
    } = pair("mirror-copies", "mirror = { lane = \"gray\" }").await;
    let admin = gw.admin_addr().unwrap();
    let client = reqwest_client();
    for i in 0..20 {
        let mut request = client.get(format!("http://{}/svc/item", gw.addr()));
        if i == 0 {
            // No client makes its request look like a copy.
            request = request.header("x-gray-mirror", "1");
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-gray-instance"], "base-1");
        assert_eq!(response.text().await.unwrap(), same(0));
    }
    // A request stained gray goes to gray, and is not copied.
    let response = client
        .get(format!("http://{}/svc/item", gw.addr()))
        .header("x-tester", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-gray-instance"], "gray-1");
    let metrics = settled(admin, &["matched", "mismatched", "failed", "unjudged"], 20).await;
    assert_eq!(mirrored(&metrics, "sent"), 20, "{metrics}");
    assert_eq!(mirrored(&metrics, "matched"), 20, "{metrics}");
    assert_eq!(mirrored(&metrics, "mismatched"), 0, "{metrics}");

    let base_seen = base_seen.all();
    assert_eq!(base_seen.len(), 20);
    assert!(
        base_seen
            .iter()
            .all(|(_, lane, mark, _)| lane.is_none() && mark.is_none()),
        "baseline sees users' requests only, unmarked: {base_seen:?}"
    );
    let gray_seen = gray_seen.all();
    let copies: Vec<_> = gray_seen.iter().filter(|s| s.2.is_some()).collect();
    assert_eq!(copies.len(), 20, "{gray_seen:?}");
    assert!(
        copies.iter().all(|(method, lane, mark, _)| method == "GET"
            && lane.as_deref() == Some("gray")
            && mark.as_deref() == Some("1")),
        "each copy carries its lane's stain and the mark: {copies:?}"
    );

    // The copies appear in no user metric: gray served one request, the stained one.
    let gray_requests: u64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("gray_gateway_requests_total{") && l.contains("instance=\"gray-1\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(gray_requests, 1, "{metrics}");
    assert!(
        metrics.contains(
            "gray_gateway_mirror_duration_seconds_count{service=\"svc\",lane=\"gray\"} 20"
        ),
        "{metrics}"
    );
    gw.shutdown().await;
}

fn with_ts(n: usize) -> String {
    format!(r#"{{"id":7,"ts":{n},"items":[1,2,3]}}"#)
}

fn with_ts_and_a_bug(n: usize) -> String {
    // Every fourth answer of gray's differs in a field that matters.
    let id = if n % 4 == 3 { 8 } else { 7 };
    format!(r#"{{"id":{id},"ts":{},"items":[1,2,3]}}"#, n + 1000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differences_are_mismatches_but_in_ignored_fields_and_the_admin_shows_them() {
    let dir = TempDir::new("mirror-mismatch");
    let base = instance(Seen::default(), with_ts).await;
    let gray = instance(Seen::default(), with_ts_and_a_bug).await;
    let gw = gateway(
        &dir,
        base.addr(),
        Some(gray.addr()),
        "mirror = { lane = \"gray\", ignore_fields = [\"/ts\"], max_in_flight = 1 }",
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let client = reqwest_client();
    let mut judged = 0;
    for _ in 0..8 {
        let response = client
            .get(format!("http://{}/svc/item", gw.addr()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        // One copy at a time (`max_in_flight = 1`): each judged before the next is sent,
        // so that gray's answers come in order.
        judged += 1;
        settled(admin, &["matched", "mismatched", "dropped_busy"], judged).await;
    }
    let metrics = admin_text(admin, "/metrics").await;
    let (matched, mismatched, busy) = (
        mirrored(&metrics, "matched"),
        mirrored(&metrics, "mismatched"),
        mirrored(&metrics, "dropped_busy"),
    );
    assert_eq!(busy, 0, "{metrics}");
    assert_eq!(
        (matched, mismatched),
        (6, 2),
        "the ts field is noise, id is not: {metrics}"
    );
    let mirrors: serde_json::Value =
        serde_json::from_str(&admin_text(admin, "/mirrors").await).unwrap();
    let recent = mirrors["svc"]["recent_mismatches"].as_array().unwrap();
    assert_eq!(recent.len(), 2, "{mirrors}");
    assert_eq!(recent[0]["method"], "GET");
    assert_eq!(recent[0]["path"], "/item");
    assert_eq!(recent[0]["differences"], serde_json::json!(["json /id"]));
    assert_eq!(mirrors["svc"]["lane"], "gray");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_is_copied_only_when_listed_and_a_body_over_the_cap_reaches_baseline_intact() {
    let client = reqwest_client();
    // Not listed: not copied.
    let Pair {
        gw,
        gray_seen,
        _dir,
        _instances,
        ..
    } = pair("mirror-post-default", "mirror = { lane = \"gray\" }").await;
    let response = client
        .post(format!("http://{}/svc/item", gw.addr()))
        .body("x".repeat(100))
        .send()
        .await
        .unwrap();
    assert_eq!(response.text().await.unwrap(), r#"{"received":100}"#);
    client
        .get(format!("http://{}/svc/item", gw.addr()))
        .send()
        .await
        .unwrap();
    let metrics = settled(gw.admin_addr().unwrap(), &["matched"], 1).await;
    assert_eq!(mirrored(&metrics, "sent"), 1, "the GET only: {metrics}");
    assert!(gray_seen.all().iter().all(|s| s.0 == "GET"));
    gw.shutdown().await;

    // Listed, with a cap of 1 KiB.
    // Bound by name (not `..`): the folder and the instances live to the end.
    let Pair {
        gw,
        base_seen,
        gray_seen,
        _dir,
        _instances,
    } = pair(
        "mirror-post-listed",
        "mirror = { lane = \"gray\", methods = [\"GET\", \"POST\"], max_body_bytes = 1024 }",
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let small: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
    let large: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    // A body in chunks of unknown length (no `Content-Length`: chunked).
    let chunked = |body: &[u8], size: usize| {
        let frames: Vec<Result<_, std::io::Error>> = body
            .chunks(size)
            .map(|c| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        reqwest::Body::wrap(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    };
    let post = |body: reqwest::Body| {
        client
            .post(format!("http://{}/svc/item", gw.addr()))
            .body(body)
            .send()
    };
    // Within the cap, in chunks of unknown length: copied whole.
    let response = post(chunked(&small, 100)).await.unwrap();
    assert_eq!(response.text().await.unwrap(), r#"{"received":700}"#);
    // Over the cap by its length: not teed at all.
    let response = post(reqwest::Body::from(large.clone())).await.unwrap();
    assert_eq!(response.text().await.unwrap(), r#"{"received":200000}"#);
    // Over the cap in chunks of unknown length: teed, then dropped as the cap passed.
    let response = post(chunked(&large, 1000)).await.unwrap();
    assert_eq!(response.text().await.unwrap(), r#"{"received":200000}"#);

    settled(admin, &["matched", "mismatched"], 1).await;
    let metrics = settled(admin, &["dropped_body"], 2).await;
    assert_eq!(mirrored(&metrics, "sent"), 1, "{metrics}");
    assert_eq!(mirrored(&metrics, "dropped_body"), 2, "{metrics}");
    let base_seen = base_seen.all();
    assert_eq!(base_seen.len(), 3);
    assert_eq!(&base_seen[0].3[..], &small[..]);
    assert_eq!(
        &base_seen[1].3[..],
        &large[..],
        "baseline gets the body intact"
    );
    assert_eq!(
        &base_seen[2].3[..],
        &large[..],
        "baseline gets the body intact"
    );
    let gray_seen = gray_seen.all();
    assert_eq!(gray_seen.len(), 1, "only the small body is copied");
    assert_eq!(
        &gray_seen[0].3[..],
        &small[..],
        "the copy's body is the user's"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_never_answers_or_none_at_all_costs_the_users_nothing() {
    // A gray instance that accepts and never answers, and copies that wait a minute:
    // users still get every answer (from baseline, through the same gateway), and beyond
    // `max_in_flight` copies are dropped.
    let (hole, accepted) = gray_test_support::net::serve(|stream| async move {
        let _held = stream;
        std::future::pending::<()>().await;
    })
    .await;
    let dir = TempDir::new("mirror-dead");
    let base_seen = Seen::default();
    let base = instance(base_seen.clone(), same).await;
    // The copies at the default, lowest priority (never shed: that has a test of its own).
    let gw = gateway_over(
        &dir,
        &[base.addr()],
        Some(hole),
        "mirror_max_busy = 1",
        "mirror = { lane = \"gray\", max_in_flight = 2, timeout_ms = 60000 }",
    )
    .await;
    let client = reqwest_client();
    for _ in 0..30 {
        let response = tokio::time::timeout(
            WAIT,
            client.get(format!("http://{}/svc/item", gw.addr())).send(),
        )
        .await
        .expect("the user's request does not wait for its copy")
        .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-gray-instance"], "base-1");
    }
    // The two copies in flight were sent (their thread may run them a little later).
    let metrics = settled(gw.admin_addr().unwrap(), &["sent"], 2).await;
    assert_eq!(mirrored(&metrics, "sent"), 2, "{metrics}");
    assert_eq!(mirrored(&metrics, "dropped_busy"), 28, "{metrics}");
    assert!(accepted.load(Ordering::SeqCst) >= 1);
    assert_eq!(base_seen.all().len(), 30);
    gw.shutdown().await;

    // No gray instance at all: copies go nowhere (never to baseline).
    let dir = TempDir::new("mirror-none");
    let base_seen = Seen::default();
    let base = instance(base_seen.clone(), same).await;
    let gw = gateway(&dir, base.addr(), None, "mirror = { lane = \"gray\" }").await;
    for _ in 0..10 {
        let response = client
            .get(format!("http://{}/svc/item", gw.addr()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    let metrics = settled(gw.admin_addr().unwrap(), &["no_instance"], 10).await;
    assert_eq!(mirrored(&metrics, "no_instance"), 10, "{metrics}");
    let base_seen = base_seen.all();
    assert_eq!(
        base_seen.len(),
        10,
        "a copy never reaches baseline: {base_seen:?}"
    );
    assert!(base_seen.iter().all(|s| s.2.is_none()));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_are_shed_while_the_gateway_is_busy_and_made_again_once_it_is_not() {
    // A limit any steady load passes: eight clients back to back keep the runtime's workers
    // busy, and copies stop once the sampler has seen it; users are answered all along.
    let dir = TempDir::new("mirror-shed");
    let (base_seen, gray_seen) = (Seen::default(), Seen::default());
    let base = instance(base_seen.clone(), same).await;
    let gray = instance(gray_seen.clone(), same).await;
    let gw = gateway_over(
        &dir,
        &[base.addr()],
        Some(gray.addr()),
        "mirror_priority = \"normal\"\nmirror_max_busy = 0.1",
        "mirror = { lane = \"gray\" }",
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let url = format!("http://{}/svc/item", gw.addr());
    let shed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads: Vec<_> = (0..8)
        .map(|_| {
            let (client, url, shed) = (reqwest_client(), url.clone(), shed.clone());
            tokio::spawn(async move {
                let mut answered = 0u32;
                while !shed.load(Ordering::SeqCst) {
                    let response = client.get(&url).send().await.unwrap();
                    assert_eq!(response.status(), 200);
                    assert_eq!(response.headers()["x-gray-instance"], "base-1");
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let metrics = admin_text(admin, "/metrics").await;
        if mirrored(&metrics, "dropped_busy") > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no copy shed under load within {WAIT:?}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shed.store(true, Ordering::SeqCst);
    let mut answered = 0;
    for load in loads {
        answered += load.await.unwrap();
    }
    let metrics = admin_text(admin, "/metrics").await;
    let (sent, dropped) = (
        mirrored(&metrics, "sent"),
        mirrored(&metrics, "dropped_busy"),
    );
    assert!(dropped > 0 && sent < u64::from(answered), "{metrics}");

    // Idle again: one request now and then is copied again.
    let client = reqwest_client();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let metrics = admin_text(admin, "/metrics").await;
        if mirrored(&metrics, "sent") > sent {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no copy made again within {WAIT:?} of the load's end:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What was sent reached gray, marked; baseline saw every user's request, unmarked.
    let metrics = settled(
        admin,
        &["matched", "mismatched", "failed", "unjudged"],
        sent + 1,
    )
    .await;
    let copies = gray_seen.all().iter().filter(|s| s.2.is_some()).count() as u64;
    assert_eq!(copies, mirrored(&metrics, "sent"), "{metrics}");
    assert!(base_seen.all().iter().all(|s| s.2.is_none()));
    gw.shutdown().await;
}

fn ts_one(n: usize) -> String {
    format!(r#"{{"id":7,"ts":{n}}}"#)
}

fn ts_two(n: usize) -> String {
    format!(r#"{{"id":7,"ts":{}}}"#, n + 500_000)
}

fn gray_ts(n: usize) -> String {
    format!(r#"{{"id":7,"ts":{}}}"#, n + 900_000)
}

fn gray_ts_and_two_percent(n: usize) -> String {
    let id = if n % 50 == 49 { 8 } else { 7 };
    format!(r#"{{"id":{id},"ts":{}}}"#, n + 900_000)
}

/// `/mirrors`' judge of `svc`.
async fn judge(admin: SocketAddr) -> serde_json::Value {
    let mirrors: serde_json::Value =
        serde_json::from_str(&admin_text(admin, "/mirrors").await).unwrap();
    mirrors["svc"]["judge"].clone()
}

/// Two baseline instances whose answers differ in `ts` on every answer, and a gray
/// answering with `gray`, behind a gateway mirroring to gray with a control for every copy.
async fn judging(tag: &str, gray: fn(usize) -> String) -> (TempDir, Gateway, [Server; 3]) {
    let dir = TempDir::new(tag);
    let one = instance(Seen::default(), ts_one).await;
    let two = instance(Seen::default(), ts_two).await;
    let gray = instance(Seen::default(), gray).await;
    let gw = gateway_over(
        &dir,
        &[one.addr(), two.addr()],
        Some(gray.addr()),
        NORMAL,
        "mirror = { lane = \"gray\", control_percent = 100 }",
    )
    .await;
    (dir, gw, [one, two, gray])
}

/// Users' GETs, four at a time, until `done` holds of the judge (looked at every 200
/// requests) or `max` requests went, within [`WAIT`]; the judge then, and the requests
/// sent.
async fn until_judged(
    gw: &Gateway,
    max: usize,
    done: impl Fn(&serde_json::Value) -> bool,
) -> (serde_json::Value, usize) {
    let admin = gw.admin_addr().unwrap();
    let client = reqwest_client();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut sent = 0;
    while sent < max && tokio::time::Instant::now() < deadline {
        let batch = (0..4).map(|_| client.get(format!("http://{}/svc/item", gw.addr())).send());
        for response in futures_util::future::join_all(batch).await {
            assert_eq!(response.unwrap().status(), 200);
        }
        sent += 4;
        if sent % 200 == 0 && done(&judge(admin).await) {
            break;
        }
    }
    (judge(admin).await, sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_differing_on_two_percent_of_answers_alarms_the_judge_beyond_learned_noise() {
    let (_dir, gw, _instances) = judging("mirror-judge-bug", gray_ts_and_two_percent).await;
    let (judge, sent) = until_judged(&gw, 40_000, |j| !j["alarm"].is_null()).await;
    let metrics = admin_text(gw.admin_addr().unwrap(), "/metrics").await;
    assert_eq!(
        judge["alarm"], "mismatch",
        "after {sent} requests: {judge}\n{metrics}"
    );
    assert!(
        judge["noise"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("json /ts")),
        "the timestamp is learned as noise: {judge}"
    );
    assert!(judge["controls"].as_u64().unwrap() > 0, "{judge}");
    assert_eq!(judge["control_mismatches"].as_u64().unwrap(), 0, "{judge}");
    assert!(
        metrics.contains("gray_gateway_mirror_alarm{service=\"svc\",lane=\"gray\"} 1"),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_differing_only_in_the_noise_matches_and_does_not_alarm() {
    let (_dir, gw, _instances) = judging("mirror-judge-noise", gray_ts).await;
    let learned = |j: &serde_json::Value| {
        j["noise"]
            .as_array()
            .is_some_and(|n| n.contains(&serde_json::json!("json /ts")))
    };
    let (judge, sent) = until_judged(&gw, 20_000, learned).await;
    assert!(learned(&judge), "after {sent} requests: {judge}");
    // Once the noise is learned, gray's answers match: every copy judged from then on.
    let admin = gw.admin_addr().unwrap();
    let before = admin_text(admin, "/metrics").await;
    let (judge, sent) = until_judged(&gw, 2_000, |_| false).await;
    assert!(
        judge["alarm"].is_null(),
        "after {sent} more requests: {judge}"
    );
    let after = settled(
        admin,
        &["matched", "mismatched"],
        mirrored(&before, "matched") + 1,
    )
    .await;
    let delta = |outcome| mirrored(&after, outcome) - mirrored(&before, outcome);
    assert_eq!(delta("mismatched"), 0, "{after}");
    assert!(delta("matched") > 0, "{after}");
    // `control_percent = 100`: every copy judged had its control, on the baseline
    // instance that did not answer the user (a control that kept landing on the user's
    // instance would be skipped), whichever of the two the users' balancer preferred.
    let judged = mirrored(&after, "matched") + mirrored(&after, "mismatched");
    let controls: u64 = ["control_matched", "control_mismatched", "control_failed"]
        .iter()
        .map(|o| mirrored(&after, o))
        .sum();
    assert!(
        controls * 100 >= judged * 95,
        "{controls} controls for {judged} copies judged:\n{after}"
    );
    gw.shutdown().await;
}

// === a rollout's shadow phase ===

/// A gateway over two baseline instances differing in `ts` on every answer and a gray
/// answering with `gray`, whose rollout of `svc` starts with a shadow phase (`hold_ms`,
/// 200 copies) before steps of 50 and 100 %; the rollout started.
async fn shadowed(
    tag: &str,
    gray: fn(usize) -> String,
    hold_ms: u64,
) -> (TempDir, Gateway, [Server; 3]) {
    let dir = TempDir::new(tag);
    let one = instance(Seen::default(), ts_one).await;
    let two = instance(Seen::default(), ts_two).await;
    let gray = instance(Seen::default(), gray).await;
    let rules = "[[rules]]\nname = \"canary\"\nwhen = { sticky = { by = { header = \"x-user\" }, percent = 0 } }\nlane = \"gray\"\n";
    std::fs::write(
        dir.path().join("instances.toml"),
        format!(
            "[[services.svc]]\nid = \"base-1\"\naddress = \"{}\"\n\n[[services.svc]]\nid = \"base-2\"\naddress = \"{}\"\n\n\
             [[services.svc]]\nid = \"gray-1\"\naddress = \"{}\"\nlabels = {{ gray = true }}\n",
            one.addr(),
            two.addr(),
            gray.addr()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("rules.toml"), rules).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\
             instances = \"instances.toml\"\n{NORMAL}\n[rollouts]\ninterval_ms = 100\n\
             [services.svc]\npreset = \"seed-000\"\nmirror = {{ lane = \"gray\", control_percent = 100 }}\n\
             [services.svc.rollout]\nrule = \"canary\"\nsteps = [50, 100]\nhold_ms = 600000\nmin_users = 1\n\
             shadow = {{ hold_ms = {hold_ms}, min_requests = 200 }}\n"
        ),
    )
    .unwrap();
    let gw = gray_tests::start_gateway(dir.path()).await;
    let admin = gw.admin_addr().unwrap();
    let started: serde_json::Value = reqwest_client()
        .post(format!("http://{admin}/rollouts/svc"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(started["phase"], "shadow", "{started}");
    assert_eq!(started["weight"].as_f64(), Some(0.0), "{started}");
    (dir, gw, [one, two, gray])
}

/// Users' GETs (each its own `x-user`), four at a time, until the rollout leaves its
/// shadow phase (within `within`); the rollout then, and who answered each user while the
/// rollout was still in its shadow phase after the answer.
async fn until_out_of_shadow(gw: &Gateway, within: Duration) -> (serde_json::Value, Vec<String>) {
    let admin = gw.admin_addr().unwrap();
    let client = reqwest_client();
    let deadline = tokio::time::Instant::now() + within;
    let mut answered = Vec::new();
    let mut user = 0;
    loop {
        let batch = (0..4).map(|_| {
            user += 1;
            client
                .get(format!("http://{}/svc/item", gw.addr()))
                .header("x-user", user.to_string())
                .send()
        });
        for response in futures_util::future::join_all(batch).await {
            let response = response.unwrap();
            assert_eq!(response.status(), 200);
            answered.push(
                response.headers()["x-gray-instance"]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        let view: serde_json::Value =
            serde_json::from_str(&admin_text(admin, "/rollouts/svc").await).unwrap();
        if view["phase"] != "shadow" {
            return (view, answered);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still in the shadow phase after {WAIT:?}: {view}"
        );
    }
}

/// Waits (within [`WAIT`]) until the mirror has no copy in flight.
async fn idle(gw: &Gateway) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mirrors: serde_json::Value =
            serde_json::from_str(&admin_text(gw.admin_addr().unwrap(), "/mirrors").await).unwrap();
        if mirrors["svc"]["in_flight"] == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "copies in flight: {mirrors}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The users' requests gray's instance answered, by the metrics (copies are not counted
/// there).
fn gray_served(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("gray_gateway_requests_total{") && l.contains("instance=\"gray-1\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The copies sent so far.
async fn sent(gw: &Gateway) -> u64 {
    mirrored(
        &admin_text(gw.admin_addr().unwrap(), "/metrics").await,
        "sent",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_differs_beyond_the_noise_is_rolled_back_before_any_user_sees_gray() {
    // A hold long enough for the judge: the rollout leaves the shadow phase by its alarm.
    let (_dir, gw, _instances) = shadowed("shadow-back", gray_ts_and_two_percent, 60_000).await;
    let (view, answered) = until_out_of_shadow(&gw, Duration::from_secs(60)).await;
    assert_eq!(view["phase"], "rolled_back", "{view:#}");
    assert_eq!(view["weight"].as_f64(), Some(0.0));
    let reason = &view["last_transition"]["reason"];
    assert_eq!(
        (reason["kind"].as_str(), reason["stream"].as_str()),
        (Some("shadow_alarm"), Some("mismatch")),
        "{view:#}"
    );
    assert!(
        view["shadow"]["noise"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("json /ts")),
        "{view:#}"
    );
    let recent = view["shadow"]["recent_mismatches"].as_array().unwrap();
    assert!(
        recent
            .iter()
            .any(|m| m["differences"] == serde_json::json!(["json /id"])),
        "the latest mismatches show the field that differs: {view:#}"
    );
    assert!(
        answered.iter().all(|by| by.starts_with("base-")),
        "no user is answered by gray in the shadow phase"
    );
    let metrics = admin_text(gw.admin_addr().unwrap(), "/metrics").await;
    assert_eq!(gray_served(&metrics), 0, "gray served no user: {metrics}");
    // The copies stop at once (those offered before finish first).
    idle(&gw).await;
    let before = sent(&gw).await;
    for _ in 0..20 {
        reqwest_client()
            .get(format!("http://{}/svc/item", gw.addr()))
            .send()
            .await
            .unwrap();
    }
    idle(&gw).await;
    assert_eq!(sent(&gw).await, before, "no copy after the rollback");
    let metrics = admin_text(gw.admin_addr().unwrap(), "/metrics").await;
    assert!(
        metrics.contains(r#"gray_gateway_rollout_transitions_total{service="svc",from="shadow",to="rolled_back",reason="shadow_alarm"} 1"#),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_that_differs_only_in_the_noise_goes_on_to_its_first_step() {
    let (_dir, gw, _instances) = shadowed("shadow-pass", gray_ts, 2_000).await;
    let (view, answered) = until_out_of_shadow(&gw, WAIT).await;
    assert_eq!(view["phase"], "step", "{view:#}");
    assert_eq!(view["weight"].as_f64(), Some(50.0));
    assert_eq!(
        view["last_transition"]["reason"]["kind"], "shadow_passed",
        "{view:#}"
    );
    assert!(
        view["shadow"]["counts"]["copies"].as_u64().unwrap() >= 200,
        "{view:#}"
    );
    // What the gateway recorded of the shadow phase: no request of gray's arm (the weight
    // was 0: the rule stained no user gray). The answers the test saw while the view still
    // said `shadow` were baseline's (but for a batch that raced the transition).
    assert_eq!(
        view["last_transition"]["evidence"]["requests"]["gray"], 0,
        "{view:#}"
    );
    assert!(answered.len() > 4);
    assert!(
        answered[..answered.len() - 4]
            .iter()
            .all(|by| by.starts_with("base-")),
        "no user is answered by gray in the shadow phase"
    );
    // In the step, users are gray by the weight, and the copies have stopped (those
    // offered before it finish first).
    idle(&gw).await;
    let before = sent(&gw).await;
    let mut by_gray = 0;
    for user in 0..40 {
        let response = reqwest_client()
            .get(format!("http://{}/svc/item", gw.addr()))
            .header("x-user", format!("after-{user}"))
            .send()
            .await
            .unwrap();
        by_gray += usize::from(response.headers()["x-gray-instance"] == "gray-1");
    }
    assert!(by_gray > 0, "at 50 %, some users are gray");
    idle(&gw).await;
    assert_eq!(sent(&gw).await, before, "no copy once the steps begin");
    gw.shutdown().await;
}
