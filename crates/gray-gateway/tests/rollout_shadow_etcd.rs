//! A rollout's shadow phase on several gateways (feature `etcd`): gateway processes (the
//! real binary) on one real etcd, each mirroring the baseline requests of `orders` to its
//! gray lane and judging a copy and its control (a second baseline instance) against the
//! user's answer; one load of users spread request by request over the gateways, as an L4
//! balancer in front of them spreads one user's requests. The leader's machine tests the
//! counts every gateway reports (`Report::shadow`); every gateway puts the stored phase in
//! force. The two baseline instances differ in a timestamp on every answer: noise that each
//! gateway's judge learns from its own controls.
//!
//! - a gray computing a field wrong on 2 % of its answers is rolled back from the shadow
//!   phase (`shadow_alarm`) on every gateway; no user is answered by gray on any, and every
//!   gateway stops copying;
//! - a gray differing only in the timestamp goes on to its first step on every gateway,
//!   and every gateway stops copying;
//! - the leader sees a tenth of the load, too few copies for `min_requests` on its own: the
//!   followers' counts end the phase;
//! - the leader killed (SIGKILL) mid-shadow: another gateway leads, and the same shadow
//!   phase (its hold, its counts) ends, each transition written once.
//!
//! Every wait is a bounded poll; the gateway processes are killed when a test fails.

#![cfg(feature = "etcd")]

mod rollouts;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use gray_rollout::{machine::ShadowEvidence, shadow::ShadowCounts};
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use rollouts::{
    Addrs, RULES, Seen, Spread, Upstream, admin, counter,
    etcd::{Process, history_of, started, tables, written_once},
    stop_load, text, upstream_answering, wait_until_seen,
};
use serde_json::Value;

/// The top of each gateway's configuration.
const TOP: &str = "\
# Copies at the gateway's own priority, and never shed: these tests count what the judges
# saw, on a machine other tests keep busy (the defaults, the lowest priority and copies shed
# while the gateway is busy, are tested in tests/tests/gateway_mirror.rs).
mirror_priority = \"normal\"
mirror_max_busy = 1
";

/// An answer of `orders`: the order `id`, and a timestamp that differs on every answer.
fn order(id: u64, ts: u64) -> String {
    format!(r#"{{"id":{id},"ts":{ts}}}"#)
}

/// A gray that differs from baseline in the timestamp only.
fn right(n: u64) -> String {
    order(7, n + 900_000)
}

/// A gray that computes the order's `id` wrong on 2 % of its answers (every 50th).
fn wrong_on_2_percent(n: u64) -> String {
    order(if n % 50 == 49 { 8 } else { 7 }, n + 900_000)
}

/// Gateway processes sharing the rollout of `orders` through one etcd (the first leading),
/// and a load through them.
struct Fleet {
    etcd: Etcd,
    _dir: TempDir,
    gateways: Vec<Process>,
    gray: Upstream,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `n` gateway processes on one etcd over two baseline instances of `orders` (`base-1`,
/// `base-2`) and a gray one (`gray-1`) answering `gray(n)`. Each mirrors baseline's
/// requests to gray, half of them with a control, and the rollout of `orders` (rule
/// `canary`) has a shadow phase of `hold_ms` and `min_requests` before steps of 50 and
/// 100 %. The rollout is started through a follower, and in its shadow phase on every
/// gateway.
async fn fleet(tag: &str, gray: fn(u64) -> String, hold_ms: u64, min_requests: u64) -> Fleet {
    let etcd = Etcd::start().await;
    let instances: [(&'static str, fn(u64) -> String, &str); 3] = [
        ("base-1", |n| order(7, n), ""),
        ("base-2", |n| order(7, n + 500_000), ""),
        ("gray-1", gray, r#", "labels": {"gray": "true"}"#),
    ];
    let mut upstreams = Vec::new();
    for (name, answer, labels) in instances {
        let (addr, up) = upstream_answering(name, Some(answer)).await;
        let key = format!("/gray/orders/{name}");
        etcd.put(&key, format!(r#"{{"address": "{addr}"{labels}}}"#))
            .await;
        upstreams.push(up);
    }
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("rules.toml"), RULES).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "{TOP}listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\n{}\
             [services.orders]\npreset = \"seed-000\"\n\n\
             [services.orders.mirror]\nlane = \"gray\"\ncontrol_percent = 50\n\n\
             [services.orders.rollout]\nrule = \"canary\"\nsteps = [50, 100]\nhold_ms = 600000\n\
             min_users = 1\nshadow = {{ hold_ms = {hold_ms}, min_requests = {min_requests} }}\n",
            tables(&etcd, ""),
        ),
    )
    .unwrap();
    let gateways = started(&dir, "orders", 3).await;
    let (status, view) = admin(&gateways[1], "POST", "/rollouts/orders").await;
    assert_eq!(
        (status, view["phase"].as_str(), view["weight"].as_f64()),
        (200, Some("shadow"), Some(0.0)),
        "{view:#}"
    );
    for g in &gateways {
        wait_out_of(g, "pending", WAIT).await;
    }
    Fleet {
        etcd,
        _dir: dir,
        gateways,
        gray: upstreams.pop().unwrap(),
        stop: Arc::default(),
        tasks: Vec::new(),
    }
}

impl Fleet {
    fn proxies(&self) -> Vec<SocketAddr> {
        self.gateways.iter().map(Addrs::proxy).collect()
    }

    /// Users' GETs through the gateways `to` (round robin, request by request), six at a
    /// time, until [`stop_load`](Self::stop_load): what they saw.
    fn load(&mut self, to: Vec<SocketAddr>) -> Arc<Seen> {
        self.stop = Arc::default();
        let spread = Spread {
            proxies: to,
            path: "/orders/item",
            tester: false,
        };
        let (seen, tasks) = spread.load(1_000, 6, self.stop.clone());
        self.tasks = tasks;
        seen
    }

    async fn stop_load(&mut self) {
        stop_load(&self.stop, std::mem::take(&mut self.tasks)).await;
    }

    /// Waits until every gateway has left the shadow phase (within 60 s; see
    /// [`wait_out_of`]): each one shows `phase` at `weight`, entered by a transition of
    /// `kind`, the same transition on every gateway. Their views, the leader's first.
    async fn out_of_shadow(&self, phase: &str, weight: f64, kind: &str) -> Vec<Value> {
        let start = Instant::now();
        let mut views = Vec::new();
        for g in &self.gateways {
            views.push(wait_out_of(g, "shadow", Duration::from_secs(60)).await);
        }
        eprintln!(
            "out of the shadow phase on every gateway after {:?}",
            start.elapsed()
        );
        for view in &views {
            let reason = view["last_transition"]["reason"]["kind"].as_str();
            assert_eq!(
                (view["phase"].as_str(), view["weight"].as_f64(), reason),
                (Some(phase), Some(weight), Some(kind)),
                "{view:#}"
            );
            assert_eq!(view["last_transition"], views[0]["last_transition"]);
        }
        views
    }

    /// Once every gateway has left the shadow phase: each one's copies end (those offered
    /// before finish, within [`WAIT`]), and the load's next `more` requests make none.
    async fn copies_stop(&self, seen: &Seen, more: usize) {
        let mut before = Vec::new();
        for g in &self.gateways {
            idle(g).await;
            before.push(sent(g).await);
        }
        assert!(
            before.iter().all(|n| *n > 0),
            "every gateway copied: {before:?}"
        );
        let n = seen.0.lock().unwrap().len();
        wait_until_seen(seen, n + more).await;
        let mut after = Vec::new();
        for g in &self.gateways {
            idle(g).await;
            after.push(sent(g).await);
        }
        assert_eq!(
            before, after,
            "copies sent by each gateway, then after {more} more requests"
        );
    }

    /// What each gateway's judge counted, as `/mirrors` shows it, once its copies ended.
    async fn judges(&self) -> Vec<Value> {
        let mut judges = Vec::new();
        for g in &self.gateways {
            idle(g).await;
            judges.push(admin(g, "GET", "/mirrors").await.1["orders"]["judge"].clone());
        }
        judges
    }

    /// What etcd kept of the shadow phase: each transition written once, of the reasons
    /// `kinds` in turn; the stored counts never going back; and the last stored evidence,
    /// whose counts are what it consumed of each gateway's (its sources), none counted
    /// twice.
    async fn stored(&self, kinds: &[&str]) -> ShadowEvidence {
        let states = history_of(&self.etcd, "orders").await;
        written_once(&states);
        let mut written: Vec<&str> = states
            .iter()
            .filter_map(|(_, st)| st.last_transition.as_ref())
            .map(|t| t.reason.as_str())
            .collect();
        written.dedup();
        assert_eq!(written, kinds, "{states:#?}");
        let shadows: Vec<&ShadowEvidence> = states
            .iter()
            .filter_map(|(_, st)| st.shadow.as_ref())
            .collect();
        let copies: Vec<u64> = shadows.iter().map(|s| s.counts.copies).collect();
        assert!(
            copies.is_sorted(),
            "the stored counts of copies: {copies:?}"
        );
        let last = shadows.last().unwrap();
        let consumed = last
            .consumed
            .values()
            .fold(ShadowCounts::default(), |sum, c| sum.add(c));
        assert_eq!(consumed, last.counts, "{last:#?}");
        (*last).clone()
    }

    /// The counts the leader's machine judged (`counts` of `transition`, out of the shadow
    /// phase by a reason `kind`) are those the gateways' judges fed their tests: those of
    /// two gateways at least, none counted twice (no more than the judges' sum, field by
    /// field); and every judge learned the timestamp as noise from its own controls.
    /// Returns the counts.
    async fn counted_once(&self, transition: &Value, kind: &str) -> ShadowCounts {
        let stored = self.stored(&["start", kind]).await;
        let counts = stored.counts;
        assert_eq!(
            serde_json::to_value(counts).unwrap(),
            transition["reason"]["counts"],
            "{transition:#}"
        );
        let sources = stored.consumed.values().filter(|c| c.copies > 0).count();
        assert!(sources >= 2, "{stored:#?}");
        let judges = self.judges().await;
        let judged =
            |field: &str| -> u64 { judges.iter().map(|j| j[field].as_u64().unwrap()).sum() };
        for (field, machine) in [
            ("copies", counts.copies),
            ("controls", counts.controls),
            ("copy_mismatches", counts.copy_mismatches),
            ("control_mismatches", counts.control_mismatches),
        ] {
            assert!(
                machine <= judged(field),
                "{field}: the machine counted {machine}, the judges {}: {judges:#?}",
                judged(field)
            );
        }
        let copies: Vec<&Value> = judges.iter().map(|j| &j["copies"]).collect();
        eprintln!(
            "the machine judged {counts:?} from {sources} gateways; their judges, copies: {copies:?}"
        );
        let noise: Vec<&Value> = judges.iter().map(|j| &j["noise"]).collect();
        let ts = Value::from("json /ts");
        assert!(
            noise
                .iter()
                .all(|n| n.as_array().is_some_and(|n| n.contains(&ts))),
            "every gateway's judge learned the timestamp as noise from its controls: {noise:?}"
        );
        counts
    }

    /// Stops the load, then every gateway.
    async fn stop(mut self) {
        self.stop_load().await;
        for g in std::mem::take(&mut self.gateways) {
            g.terminate().await;
        }
    }
}

/// Polls `gateway`'s rollout of `orders` until its phase is no longer `phase`, for at most
/// `within`, and its metrics just before each look: while the rollout is in its shadow
/// phase, no user request was answered by gray on this gateway. The view then.
async fn wait_out_of(gateway: &Process, phase: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let by_gray = gray_served(gateway).await;
        let (_, view) = admin(gateway, "GET", "/rollouts/orders").await;
        if view["phase"] == "shadow" {
            assert_eq!(by_gray, 0, "a user answered by gray in the shadow phase");
        }
        if view["phase"] != phase {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "still {phase} after {within:?}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The users' requests gray's instance answered through `gateway` (copies are not counted
/// there).
async fn gray_served(gateway: &Process) -> u64 {
    let metrics = text(gateway, "/metrics").await;
    let labels = ["service=\"orders\"", "instance=\"gray-1\""];
    counter(&metrics, "gray_gateway_requests_total", &labels)
}

/// The copies `gateway` sent to gray so far.
async fn sent(gateway: &Process) -> u64 {
    let metrics = text(gateway, "/metrics").await;
    let labels = ["service=\"orders\"", "lane=\"gray\"", "outcome=\"sent\""];
    counter(&metrics, "gray_gateway_mirror_requests_total", &labels)
}

/// Waits (within [`WAIT`]) until `gateway`'s mirror has no copy in flight.
async fn idle(gateway: &Process) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, mirrors) = admin(gateway, "GET", "/mirrors").await;
        if mirrors["orders"]["in_flight"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "copies in flight: {mirrors}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_wrong_on_2_percent_is_rolled_back_from_the_shadow_on_every_gateway() {
    // A hold the judge ends first: the phase leaves by its alarm.
    let mut f = fleet("shadow-etcd-back", wrong_on_2_percent, 600_000, 200).await;
    let seen = f.load(f.proxies());
    let views = f.out_of_shadow("rolled_back", 0.0, "shadow_alarm").await;
    let transition = &views[0]["last_transition"];
    assert_eq!(transition["reason"]["stream"], "mismatch", "{transition:#}");
    // every gateway stops copying while the load goes on (a hundred requests through each)
    f.copies_stop(&seen, 300).await;
    f.stop_load().await;

    assert!(
        seen.0
            .lock()
            .unwrap()
            .iter()
            .all(|(_, status, by)| *status == 200 && by.starts_with("base-")),
        "every user answered by baseline"
    );
    for g in &f.gateways {
        assert_eq!(gray_served(g).await, 0, "gray served no user");
    }
    assert!(f.gray.count.load(Ordering::Relaxed) > 0, "gray had copies");
    let counts = f.counted_once(transition, "shadow_alarm").await;
    assert!(counts.copy_mismatches > 0, "{counts:?}");
    let metrics = text(&f.gateways[0], "/metrics").await;
    let from_shadow = [
        "service=\"orders\"",
        "from=\"shadow\"",
        "to=\"rolled_back\"",
        "reason=\"shadow_alarm\"",
    ];
    let total = "gray_gateway_rollout_transitions_total";
    assert_eq!(counter(&metrics, total, &from_shadow), 1, "{metrics}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_differing_only_in_the_timestamp_goes_on_to_its_first_step_on_every_gateway() {
    let mut f = fleet("shadow-etcd-pass", right, 3_000, 300).await;
    let seen = f.load(f.proxies());
    let views = f.out_of_shadow("step", 50.0, "shadow_passed").await;
    assert!(views.iter().all(|v| v["step"] == 0), "{views:#?}");
    f.copies_stop(&seen, 300).await;
    // the step's weight is in force on every gateway: some users are gray through each
    for g in &f.gateways {
        assert!(gray_served(g).await > 0, "at 50 %, some users are gray");
    }
    f.stop_load().await;
    let counts = f
        .counted_once(&views[0]["last_transition"], "shadow_passed")
        .await;
    assert!(counts.copies >= 300, "{counts:?}");
    assert_eq!(counts.copy_mismatches, 0, "{counts:?}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_followers_counts_end_a_shadow_phase_the_leaders_alone_could_not() {
    // Each follower judges about 5/11 of the pairs, and counts them a second at a time:
    // 400 were one follower's first second (the other's not counted yet), 1,000 need
    // both followers' seconds.
    let min_requests = 1_000;
    let mut f = fleet("shadow-etcd-followers", right, 2_000, min_requests).await;
    // one request in eleven through the leader, five through each follower
    let [a, b, c] = f.proxies().try_into().unwrap();
    f.load([vec![a], [b, c].repeat(5)].concat());
    let views = f.out_of_shadow("step", 50.0, "shadow_passed").await;
    f.stop_load().await;
    assert_eq!(views[0]["leader"], true, "{:#}", views[0]);
    let counts = f
        .counted_once(&views[0]["last_transition"], "shadow_passed")
        .await;
    assert!(counts.copies >= min_requests, "{counts:?}");
    let leaders = &f.judges().await[0];
    assert!(
        leaders["copies"].as_u64().unwrap() < min_requests / 2,
        "the leader judged too few copies to end the phase on its own: {leaders}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_shadow_hands_over_and_the_same_shadow_phase_ends() {
    let (hold_ms, min_requests) = (8_000, 300);
    let mut f = fleet("shadow-etcd-leader", right, hold_ms, min_requests).await;
    f.load(f.proxies());
    // the leader has stored copies judged, and the phase goes on
    let before = stored_copies(&f.etcd).await;
    f.stop_load().await;
    let killed = SystemTime::now();
    f.gateways.remove(0).kill().await;
    f.load(f.proxies());
    let views = f.out_of_shadow("step", 50.0, "shadow_passed").await;
    f.stop_load().await;
    let leaders = views.iter().filter(|v| v["leader"] == true).count();
    assert_eq!(leaders, 1, "one of the two others leads: {views:#?}");
    // passed by the next leader, the hold counted from the phase's start
    let transition = &views[0]["last_transition"];
    let since_epoch = killed.duration_since(SystemTime::UNIX_EPOCH).unwrap();
    assert!(
        u128::from(transition["at_ms"].as_u64().unwrap()) > since_epoch.as_millis(),
        "the phase ended after the leader was killed: {transition:#}"
    );
    let held = transition["reason"]["held_ms"].as_u64().unwrap();
    assert!(held >= hold_ms, "{transition:#}");
    assert!(
        transition["reason"]["counts"]["copies"].as_u64() >= Some(min_requests),
        "{transition:#}"
    );
    // each transition written once; the evidence carried over the handover (never
    // counted back), with the counts of every gateway, the killed leader's too
    let last = f.stored(&["start", "shadow_passed"]).await;
    assert_eq!(last.consumed.len(), 3, "{last:#?}");
    assert!(
        last.counts.copies >= before,
        "the killed leader stored {before} copies judged"
    );
    f.stop().await;
}

/// Waits (within 60 s) until the rollout of `orders` stored in `etcd`, still in its shadow
/// phase, has judged copies: their count then.
async fn stored_copies(etcd: &Etcd) -> u64 {
    let mut client = etcd.client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = client
            .get("/gray/rollouts/orders/state", None)
            .await
            .unwrap();
        let state: gray_rollout::State = serde_json::from_slice(got.kvs()[0].value()).unwrap();
        assert_eq!(state.phase, gray_rollout::Phase::Shadow, "{state:#?}");
        let copies = state.shadow.as_ref().map_or(0, |s| s.counts.copies);
        if copies > 0 {
            return copies;
        }
        assert!(
            Instant::now() < deadline,
            "no copy judged within 60 s: {state:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
