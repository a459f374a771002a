//! The admin address with an `admin_token`, through the real gateway and the real CLI:
//! commands without the token get 401 with a clear body, reads too with
//! `admin_token_for_reads`, while the page's files and `/healthz` stay open; and the
//! history the page draws (`/services/history`, `/rollouts/{service}/history`) fills with
//! the requests that went through.

mod rollouts;

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use gray_gateway::{Gateway, config::Config};
use gray_test_support::TempDir;
use rollouts::{admin, admin_with, load, stop_load};
use serde_json::Value;

const TOKEN: &str = "t0ken-for-the-admin-tests-0123456789";

/// A gateway with a pending rollout of `svc`, and `access` after `admin = …`.
async fn gateway(tag: &str, access: &str) -> (Gateway, TempDir) {
    let (dir, _gray, _base) = rollouts::files(
        tag,
        "interval_ms = 100\n",
        "steps = [10, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
    )
    .await;
    rollouts::add_top_level(&dir, access);
    let path = dir.path().join("gateway.toml");
    let config = Config::load(&path).expect("a valid config");
    (
        Gateway::start(config).await.expect("the gateway starts"),
        dir,
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_need_the_token_and_reads_do_not() {
    let (gw, dir) = gateway("admin-token", &format!("admin_token = \"{TOKEN}\"\n")).await;
    // reads are open
    let (status, view) = admin(&gw, "GET", "/rollouts/svc").await;
    assert_eq!(
        (status, view["phase"].as_str()),
        (200, Some("pending")),
        "{view}"
    );
    // a command without the token, or with another, is refused with a reason
    let (status, head, body) = admin_with(&gw, "POST", "/rollouts/svc", &[]).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{body}"
    );
    assert_eq!(head["www-authenticate"], "Bearer realm=\"gray admin\"");
    let wrong = bearer("t0ken-for-the-admin-tests-0123456780");
    let (status, _, body) =
        admin_with(&gw, "POST", "/rollouts/svc", &[("authorization", &wrong)]).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("not this admin's"),
        "{body}"
    );
    let (status, _, body) =
        admin_with(&gw, "POST", "/rollouts/svc", &[("authorization", TOKEN)]).await;
    assert_eq!(status, 401, "a token without its scheme: {body}");
    let (_, view) = admin(&gw, "GET", "/rollouts/svc").await;
    assert_eq!(view["phase"], "pending", "nothing changed: {view}");
    // with it, the command runs
    let right = bearer(TOKEN);
    let (status, _, view) =
        admin_with(&gw, "POST", "/rollouts/svc", &[("authorization", &right)]).await;
    assert_eq!(
        (status, view["weight"].as_f64()),
        (200, Some(10.0)),
        "{view}"
    );

    // the CLI: refused without the token, through with $GRAY_ADMIN_TOKEN or --token-file
    let addr = gw.admin_addr().unwrap().to_string();
    let cli = |args: &[&str], env: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gray-gateway"));
        command.arg("rollout").args(args).args(["--admin", &addr]);
        command.env_remove("GRAY_ADMIN_TOKEN");
        if let Some(token) = env {
            command.env("GRAY_ADMIN_TOKEN", token);
        }
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = cli(&["pause", "svc"], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("401") && err.contains("bearer token"), "{err}");
    let (code, out, err) = cli(&["pause", "svc"], Some(TOKEN));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("svc: paused"), "{out}");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let (code, out, err) = cli(
        &["resume", "svc", "--token-file", file.to_str().unwrap()],
        None,
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, _) = cli(&["status", "svc"], None);
    assert_eq!(code, Some(0), "a read needs no token: {out}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_admin_token_for_reads_only_the_page_and_healthz_are_open() {
    let (gw, _dir) = gateway(
        "admin-token-reads",
        &format!("admin_token = \"{TOKEN}\"\nadmin_token_for_reads = true\n"),
    )
    .await;
    let right = bearer(TOKEN);
    for path in [
        "/rollouts",
        "/rollouts/svc",
        "/metrics",
        "/services",
        "/services/history",
        "/rollouts/svc/history",
        "/mirrors",
    ] {
        let (status, _, body) = admin_with(&gw, "GET", path, &[]).await;
        assert_eq!(status, 401, "{path}: {body}");
        let (status, _, _) = admin_with(&gw, "GET", path, &[("authorization", &right)]).await;
        assert_eq!(status, 200, "{path} with the token");
    }
    let (status, _, _) = admin_with(&gw, "POST", "/explain", &[]).await;
    assert_eq!(status, 401, "/explain reads");
    for path in [
        "/",
        "/ui/app.js",
        "/ui/app.css",
        "/ui/uPlot.iife.min.js",
        "/ui/uPlot.min.css",
        "/ui/uPlot.LICENSE",
        "/healthz",
    ] {
        let (status, head, _) = admin_with(&gw, "GET", path, &[]).await;
        assert_eq!(status, 200, "{path} is open");
        assert!(
            head["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("default-src 'self'"),
            "{path}: {head:?}"
        );
    }
    gw.shutdown().await;
}

/// Polls `path` until `done` holds, for at most a minute.
async fn wait_for_json(gw: &Gateway, path: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = admin(gw, "GET", path).await;
        if status == 200 && done(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never got there: {body:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_holds_each_lane_and_the_rollout_second_by_second() {
    let (gw, _dir) = gateway("admin-history", "").await;
    let (status, body) = admin(&gw, "GET", "/rollouts/nope/history").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = admin(&gw, "POST", "/rollouts/svc").await;
    assert_eq!(status, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, tasks) = load(&gw, 200, 4, false, stop.clone());
    // both lanes had requests in a second the sampler saw
    let lanes = |h: &Value, lane: &str| -> f64 {
        h["services"]["svc"][lane]["requests_per_s"]
            .as_array()
            .map_or(0.0, |v| v.iter().filter_map(Value::as_f64).sum())
    };
    let history = wait_for_json(&gw, "/services/history", |h| {
        lanes(h, "baseline") > 0.0 && lanes(h, "gray") > 0.0
    })
    .await;
    stop_load(&stop, tasks).await;
    assert!(seen.all_ok());
    let baseline = &history["services"]["svc"]["baseline"];
    let points = baseline["t"].as_array().unwrap().len();
    for column in ["requests_per_s", "errors_per_s", "p50_ms", "p99_ms"] {
        assert_eq!(
            baseline[column].as_array().unwrap().len(),
            points,
            "{column}"
        );
    }
    assert!(
        baseline["p99_ms"]
            .as_array()
            .unwrap()
            .iter()
            .any(Value::is_number),
        "{baseline}"
    );
    assert_eq!(history["window"], 600);
    // the rollout: its weight over time, at 10 % since the start
    let rollout = wait_for_json(&gw, "/rollouts/svc/history", |h| {
        h["weight"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w.as_f64() == Some(10.0)))
    })
    .await;
    let n = rollout["t"].as_array().unwrap().len();
    assert_eq!(rollout["phase"].as_array().unwrap().len(), n);
    assert_eq!(rollout["phase"].as_array().unwrap().last().unwrap(), "step");
    assert_eq!(rollout["log_m"]["errors"].as_array().unwrap().len(), n);
    assert!(
        rollout["alarm_at"]["rollout"].as_f64().unwrap() > 0.0,
        "{rollout}"
    );
    // times are Unix seconds, one a second, in order
    let t: Vec<f64> = rollout["t"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(t.windows(2).all(|w| w[1] > w[0]), "{t:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - t[t.len() - 1]).abs() < 60.0, "{t:?} against {now}");
    gw.shutdown().await;
}
