//! A rollout never promotes a gray its own test would still catch, and a shared outage is
//! not a clean hold (issue 34): the gateway binary as a process, file discovery, real
//! upstream servers on loopback (a baseline and a gray instance), and a load of sticky
//! users sent round-robin. Steps 5, 10, 25, 50, 100 %, 4 s holds, `min_users` 50, no
//! gate. Every wait is a bounded poll of `/rollouts/svc`.
//!
//! - gray starts failing 2 % (and, in another run, 5 %) of its requests once the rollout
//!   reaches 25 %: rolled back, never promoted. The degradation to catch is set to 1 % of
//!   users (`detect.min_rate`), so that with one request per user and step a 2 % fault is
//!   twice what each step must be able to see; the defaults (2 %) are the simulations'.
//! - every request of both lanes fails for a while after the rollout reached 10 %: paused
//!   (`outage`), not advanced while it lasts, then resumed (`recovered`) and promoted.
//! - a second gateway given the same `state_dir` refuses to start (issue 30).

mod rollouts;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use gray_test_support::TempDir;
use rollouts::{Upstream, admin, load, process::Process, stop_load, wait_for};
use serde_json::Value;

struct Setup {
    gateway: Process,
    gray: Upstream,
    base: Upstream,
    _dir: TempDir,
}

async fn setup(tag: &str, rollout: &str) -> Setup {
    let (dir, gray, base) = rollouts::files(
        tag,
        "interval_ms = 200\n",
        &format!("steps = [5, 10, 25, 50, 100]\nhold_ms = 4000\nmin_users = 50\n{rollout}"),
    )
    .await;
    let gateway = Process::start(&dir).await;
    Setup {
        gateway,
        gray,
        base,
        _dir: dir,
    }
}

/// Starts the rollout; checks it is at its first step.
async fn start(s: &Setup) {
    let (status, view) = admin(&s.gateway, "POST", "/rollouts/svc").await;
    assert_eq!(status, 200, "{view:#}");
    assert_eq!(view["weight"].as_f64(), Some(5.0), "{view:#}");
}

fn weight(v: &Value) -> f64 {
    v["weight"].as_f64().unwrap_or(f64::NAN)
}

fn phase(v: &Value) -> &str {
    v["phase"].as_str().unwrap_or("?")
}

/// Gray fails `per_mille` of its requests from the 25 % step on: the rollout must roll
/// back, and never be promoted on the way.
async fn a_fault_from_the_25_percent_step_is_rolled_back(tag: &str, per_mille: u32) {
    let s = setup(tag, "detect = { min_rate = 0.01 }\n").await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_seen, tasks) = load(&s.gateway, 20_000, 16, false, stop.clone());
    start(&s).await;
    // Generous: the steps wait for thousands of users, on two loaded cores.
    wait_for(&s.gateway, Duration::from_secs(300), |v| {
        assert_ne!(
            phase(v),
            "rolled_back",
            "rolled back before the fault: {v:#}"
        );
        weight(v) >= 25.0
    })
    .await;
    s.gray.fail_per_mille.store(per_mille, Ordering::Relaxed);
    let end = wait_for(&s.gateway, Duration::from_secs(300), |v| {
        assert_ne!(phase(v), "promoted", "promoted with the fault: {v:#}");
        phase(v) == "rolled_back"
    })
    .await;
    stop_load(&stop, tasks).await;
    assert_eq!(weight(&end), 0.0, "{end:#}");
    let reason = end["last_transition"]["reason"]["kind"].as_str();
    assert!(
        matches!(reason, Some("alarm" | "kill_switch")),
        "rolled back for {reason:?}: {end:#}"
    );
    assert!(s.base.count.load(Ordering::Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_failing_2_percent_from_the_25_percent_step_is_rolled_back_never_promoted() {
    a_fault_from_the_25_percent_step_is_rolled_back("evidence-2", 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_failing_5_percent_from_the_25_percent_step_is_rolled_back_never_promoted() {
    a_fault_from_the_25_percent_step_is_rolled_back("evidence-5", 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_outage_pauses_the_rollout_which_then_resumes_and_promotes() {
    // 2,000 users (100 at 5 %, over min_users) can show a degradation of half of them:
    // the steps are quick, so that only the outage holds them
    let s = setup("evidence-outage", "detect = { min_rate = 0.5 }\n").await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_seen, tasks) = load(&s.gateway, 2_000, 8, false, stop.clone());
    start(&s).await;
    wait_for(&s.gateway, Duration::from_secs(120), |v| weight(v) >= 10.0).await;
    // every request of both lanes fails
    s.gray.fail_per_mille.store(1000, Ordering::Relaxed);
    s.base.fail_per_mille.store(1000, Ordering::Relaxed);
    let paused = wait_for(&s.gateway, Duration::from_secs(60), |v| {
        assert_ne!(
            phase(v),
            "rolled_back",
            "a shared outage rolled back: {v:#}"
        );
        phase(v) == "paused"
    })
    .await;
    assert_eq!(
        paused["last_transition"]["reason"]["kind"].as_str(),
        Some("outage"),
        "{paused:#}"
    );
    let held = weight(&paused);
    // three holds' worth of outage: nothing advances
    let outage_end = Instant::now() + Duration::from_secs(12);
    while Instant::now() < outage_end {
        let (_, v) = admin(&s.gateway, "GET", "/rollouts/svc").await;
        assert_eq!((phase(&v), weight(&v)), ("paused", held), "{v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.gray.fail_per_mille.store(0, Ordering::Relaxed);
    s.base.fail_per_mille.store(0, Ordering::Relaxed);
    let mut reasons = Vec::new();
    let end = wait_for(&s.gateway, Duration::from_secs(120), |v| {
        assert_ne!(
            phase(v),
            "rolled_back",
            "rolled back after the outage: {v:#}"
        );
        if let Some(r) = v["last_transition"]["reason"]["kind"].as_str()
            && reasons.last().map(String::as_str) != Some(r)
        {
            reasons.push(r.to_owned());
        }
        phase(v) == "promoted"
    })
    .await;
    stop_load(&stop, tasks).await;
    assert_eq!(weight(&end), 100.0);
    assert!(
        reasons.iter().any(|r| r == "recovered"),
        "never resumed after the outage: {reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_state_dir_refuses_to_start() {
    let s = setup("rollout-lock", "").await;
    // the first one leads the rollout from these files; a second would lead it too
    let (status, stderr) = Process::refused(&s._dir).await;
    assert!(!status.success(), "{status}");
    assert!(
        stderr.contains("gray-rollouts.lock") && stderr.contains("another gateway"),
        "{stderr}"
    );
    // the first one is untouched
    let (code, view) = admin(&s.gateway, "GET", "/rollouts/svc").await;
    assert_eq!(
        (code, view["phase"].as_str()),
        (200, Some("pending")),
        "{view:#}"
    );
    // gone (SIGKILL, no clean shutdown): the lock goes with the process
    s.gateway.kill().await;
    let again = Process::start(&s._dir).await;
    let (code, _) = admin(&again, "GET", "/rollouts/svc").await;
    assert_eq!(code, 200);
}
