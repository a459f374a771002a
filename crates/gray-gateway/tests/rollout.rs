//! Rollouts through the real gateway, with real upstream servers on loopback (a baseline
//! and a gray instance) and a load generator whose users are sticky keys (`x-user`): a
//! healthy gray is promoted; a gray that starts failing 5 % of its requests is rolled back
//! (weight 0) with no baseline user affected; a shared dependency failing both lanes, and
//! testers by header meeting a failing gray, roll nothing back; a manual abort; a restart
//! resumes the same step with the same evidence; the CLI. Every wait is a bounded poll of
//! `/rollouts/{service}`.

mod rollouts;

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use gray_gateway::{Gateway, config::Config};
use gray_test_support::TempDir;
use rollouts::{Upstream, admin, load, settled, stop_load, text, wait_for, wait_until_seen};
use serde_json::Value;

struct Setup {
    gateway: Gateway,
    gray: Upstream,
    base: Upstream,
    dir: TempDir,
}

async fn setup(tag: &str, rollout: &str) -> Setup {
    let (dir, gray, base) = rollouts::files(tag, "interval_ms = 100\n", rollout).await;
    let gateway = start(&dir).await;
    Setup {
        gateway,
        gray,
        base,
        dir,
    }
}

async fn start(dir: &TempDir) -> Gateway {
    let config = Config::load(&dir.path().join("gateway.toml")).expect("a valid config");
    Gateway::start(config).await.expect("the gateway starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_gray_is_promoted() {
    let s = setup(
        "rollout-promote",
        "steps = [10, 50, 100]\nhold_ms = 300\nmin_users = 10\ndetect = { min_rate = 0.5 }\n",
    )
    .await;
    let (status, view) = admin(&s.gateway, "GET", "/rollouts/svc").await;
    assert_eq!(
        (status, view["phase"].as_str()),
        (200, Some("pending")),
        "{view}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, tasks) = load(&s.gateway, 400, 8, false, stop.clone());
    let (status, view) = admin(&s.gateway, "POST", "/rollouts/svc").await;
    assert_eq!(
        (status, view["weight"].as_f64()),
        (200, Some(10.0)),
        "{view}"
    );

    let view = wait_for(&s.gateway, Duration::from_secs(60), |v| {
        v["phase"] == "promoted" || v["phase"] == "rolled_back"
    })
    .await;
    stop_load(&stop, tasks).await;
    assert_eq!(view["phase"], "promoted", "{view:#}");
    assert_eq!(view["weight"].as_f64(), Some(100.0));
    // the rules file still says 0: the rollout's weight wins, both are shown
    assert_eq!(view["source_percent"].as_f64(), Some(0.0));
    let reasons: Vec<&str> = view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["reason"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["start", "advance", "complete"], "{view:#}");
    assert!(view["evidence"]["requests"]["gray"].as_u64().unwrap() > 0);
    // promoted: every user is gray now
    let stop = Arc::new(AtomicBool::new(false));
    let (seen2, tasks) = load(&s.gateway, 50, 2, false, stop.clone());
    wait_until_seen(&seen2, 100).await;
    stop_load(&stop, tasks).await;
    assert!(
        seen2
            .0
            .lock()
            .unwrap()
            .iter()
            .all(|(_, _, by)| by == "gray-1")
    );
    assert!(seen.all_ok());
    let metrics = text(&s.gateway, "/metrics").await;
    for line in [
        r#"gray_gateway_rollout_transitions_total{service="svc",from="step",to="promoted",reason="complete"} 1"#,
        r#"gray_gateway_rollout_weight{service="svc"} 100"#,
        r#"gray_gateway_rollout_phase{service="svc",phase="promoted"} 1"#,
        r#"gray_gateway_request_duration_seconds_count{service="svc",lane="gray"}"#,
        r#"gray_gateway_request_duration_seconds_bucket{le="10.0",service="svc",lane="baseline"}"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    s.gateway.shutdown().await;
    drop(s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_failing_5_percent_is_rolled_back_and_no_baseline_user_sees_it() {
    let s = setup(
        "rollout-back",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, tasks) = load(&s.gateway, 400, 8, false, stop.clone());
    admin(&s.gateway, "POST", "/rollouts/svc").await;
    // healthy for a while first
    wait_until_seen(&seen, 1000).await;
    assert_eq!(
        admin(&s.gateway, "GET", "/rollouts/svc").await.1["phase"],
        "step"
    );
    let fault = Instant::now();
    s.gray.fail_per_mille.store(50, Ordering::Relaxed);
    let view = wait_for(&s.gateway, Duration::from_secs(60), |v| {
        v["phase"] == "rolled_back"
    })
    .await;
    let to_zero = fault.elapsed();
    eprintln!("fault to weight 0: {to_zero:?}");
    assert_eq!(view["weight"].as_f64(), Some(0.0));
    let reason = view["last_transition"]["reason"]["kind"].as_str().unwrap();
    assert!(["alarm", "kill_switch"].contains(&reason), "{view:#}");
    let after = seen.0.lock().unwrap().len();
    wait_until_seen(&seen, after + 500).await;
    stop_load(&stop, tasks).await;

    let seen = std::mem::take(&mut *seen.0.lock().unwrap());
    // errors came from gray only, and only to users gray served
    let gray_users: HashSet<u32> = seen
        .iter()
        .filter(|(_, _, by)| by == "gray-1")
        .map(|(u, _, _)| *u)
        .collect();
    for (user, status, by) in seen.iter() {
        if *status != 200 {
            assert_eq!(by, "gray-1");
            assert!(gray_users.contains(user));
        }
    }
    assert!(seen.iter().any(|(_, status, _)| *status == 500));
    // weight 0: the last requests all went to baseline
    assert!(
        seen[seen.len() - 100..]
            .iter()
            .all(|(_, _, by)| by == "base-1")
    );
    assert!(s.base.count.load(Ordering::Relaxed) > 0);
    s.gateway.shutdown().await;
}

/// Runs 4,000 requests of the load and asserts the rollout never rolled back (α = 0.001:
/// the chance that this fails for a healthy gray is at most 0.1 %).
async fn no_rollback(rollout: &str, tag: &str, tester: bool, both: bool) -> Value {
    let s = setup(tag, rollout).await;
    admin(&s.gateway, "POST", "/rollouts/svc").await;
    if both {
        s.gray.fail_per_mille.store(50, Ordering::Relaxed);
        s.base.fail_per_mille.store(50, Ordering::Relaxed);
    } else {
        s.gray.fail_testers.store(true, Ordering::Relaxed);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, mut tasks) = load(&s.gateway, 400, 6, false, stop.clone());
    if tester {
        let (_, testers) = load(&s.gateway, 20, 2, true, stop.clone());
        tasks.extend(testers);
    }
    wait_until_seen(&seen, 4000).await;
    stop_load(&stop, tasks).await;
    let (_, view) = admin(&s.gateway, "GET", "/rollouts/svc").await;
    assert_eq!(view["phase"], "step", "{view:#}");
    assert_eq!(view["weight"].as_f64(), Some(50.0));
    s.gateway.shutdown().await;
    view
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_dependency_failing_both_lanes_rolls_nothing_back() {
    let view = no_rollback(
        "steps = [50, 100]\nhold_ms = 600000\nmin_users = 10\nalpha = 0.001\n",
        "rollout-shared",
        false,
        true,
    )
    .await;
    // both lanes' errors are in the evidence
    assert!(
        view["evidence"]["errors"]["gray"].as_u64().unwrap() > 0,
        "{view:#}"
    );
    assert!(
        view["evidence"]["errors"]["baseline"].as_u64().unwrap() > 0,
        "{view:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testers_by_header_meeting_a_failing_gray_are_no_evidence() {
    let view = no_rollback(
        "steps = [50, 100]\nhold_ms = 600000\nmin_users = 10\nalpha = 0.001\n",
        "rollout-testers",
        true,
        false,
    )
    .await;
    // the testers' 500s are not in the evidence; the sampled users' requests are
    assert_eq!(
        view["evidence"]["errors"]["gray"].as_u64(),
        Some(0),
        "{view:#}"
    );
    assert!(
        view["evidence"]["requests"]["gray"].as_u64().unwrap() > 0,
        "{view:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_abort_a_restart_and_the_cli() {
    let s = setup(
        "rollout-abort",
        "steps = [20, 50, 100]\nhold_ms = 300\nmin_users = 10\ngates = [50]\ndetect = { min_rate = 0.5 }\n",
    )
    .await;
    // errors as JSON with a reason
    let (status, body) = admin(&s.gateway, "POST", "/rollouts/svc/pause").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("pending"),
        "{body}"
    );
    let (status, body) = admin(&s.gateway, "GET", "/rollouts/nope").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = admin(&s.gateway, "POST", "/rollouts/svc/jump").await;
    assert_eq!(status, 400);

    // through the CLI: start, then the gate at 50 % pauses the rollout
    let addr = s.gateway.admin_addr().unwrap().to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
            .arg("rollout")
            .args(args)
            .args(["--admin", &addr])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, _) = cli(&["start", "svc"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("svc: step, weight 20 %"), "{out}");
    // what this gateway is to the rollout (one gateway, local files: it leads)
    let (code, out, _) = cli(&["status", "svc"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("this gateway leads") && !out.contains("cut off"),
        "{out}"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, tasks) = load(&s.gateway, 400, 6, false, stop.clone());
    let paused = wait_for(&s.gateway, Duration::from_secs(60), |v| {
        v["phase"] == "paused"
    })
    .await;
    assert_eq!(
        paused["last_transition"]["reason"]["kind"], "gate",
        "{paused:#}"
    );
    stop_load(&stop, tasks).await;
    assert!(!seen.0.lock().unwrap().is_empty());
    let (code, _, err) = cli(&["promote", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404"), "{err}");

    // the state survives a restart: same phase, step and evidence
    let before = settled(&s.gateway).await;
    let gateway = {
        s.gateway.shutdown().await;
        start(&s.dir).await
    };
    let (_, after) = admin(&gateway, "GET", "/rollouts/svc").await;
    for key in ["phase", "weight", "step", "evidence"] {
        assert_eq!(after[key], before[key], "{key}: {after:#} vs {before:#}");
    }

    // a manual abort: weight 0 at once, the rule's percentage with it
    let (code, out, _) = {
        let addr = gateway.admin_addr().unwrap().to_string();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
            .args(["rollout", "abort", "svc", "--admin", &addr])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            (),
        )
    };
    assert_eq!(code, Some(0));
    assert!(out.contains("svc: rolled_back, weight 0 %"), "{out}");
    let percent = gateway
        .rules()
        .load()
        .rules()
        .sticky_rule("canary")
        .unwrap()
        .percent();
    assert_eq!(percent, 0.0);
    let (status, _) = admin(&gateway, "POST", "/rollouts/svc/abort").await;
    assert_eq!(status, 409);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_that_refuses_connections_behind_a_baseline_fallback_is_rolled_back() {
    // seed-000's fallback is baseline: every gray user is served by baseline, with 200
    let (dir, _gray, _base) = rollouts::files(
        "rollout-gray-down",
        "interval_ms = 100\n",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
    )
    .await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let path = dir.path().join("instances.toml");
    let instances = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = instances.split_once("address = \"").unwrap();
    let (_, rest) = rest.split_once('"').unwrap();
    std::fs::write(&path, format!("{head}address = \"{closed}\"{rest}")).unwrap();
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("gray-1\"\naddress = \"127.0.0.1")
    );
    let gateway = start(&dir).await;

    admin(&gateway, "POST", "/rollouts/svc").await;
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, tasks) = load(&gateway, 400, 6, false, stop.clone());
    let view = wait_for(&gateway, Duration::from_secs(60), |v| {
        v["phase"] == "rolled_back"
    })
    .await;
    stop_load(&stop, tasks).await;
    let reason = view["last_transition"]["reason"]["kind"].as_str().unwrap();
    assert!(["alarm", "kill_switch"].contains(&reason), "{view:#}");
    assert!(
        view["evidence"]["errors"]["gray"].as_u64() > Some(0),
        "a gray that could not take its requests counts against gray: {view:#}"
    );
    // and no client saw it: baseline served them all
    let all_from_baseline = {
        let seen = seen.0.lock().unwrap();
        !seen.is_empty()
            && seen
                .iter()
                .all(|(_, status, by)| *status == 200 && by == "base-1")
    };
    assert!(all_from_baseline);
    gateway.shutdown().await;
}
