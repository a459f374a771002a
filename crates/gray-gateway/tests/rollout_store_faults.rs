//! What is in force is what the store accepted (issue 30): the real gateway, real upstream
//! servers on loopback, a load of sticky users, and the gateway's own file store behind a
//! wrapper that fails its saves, or its reads of the reports, on demand (the shape of an
//! etcd that times out). Every wait is a bounded poll of `/rollouts/svc`.
//!
//! - saves failing: an advance the leader derives is not in force, not in the history and
//!   not counted; once saves succeed again it is derived again and saved;
//! - saves failing and gray failing: the rollback is in force at once (weight 0), and
//!   saved once the store takes it;
//! - the reports unreadable: no evidence, the clock still runs, and the rollout pauses as
//!   stale after `stale_ms`.

mod rollouts;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures_util::future::BoxFuture;
use gray_gateway::{
    Gateway,
    config::Config,
    rollout::store::{Contact, Fence, FileStore, RolloutStore, Saved, StoreError, Stored},
};
use gray_rollout::{Report, State};
use gray_test_support::TempDir;
use rollouts::{Upstream, admin, load, stop_load, wait_for};
use tokio::sync::watch;

/// The gateway's file store, failing on demand.
#[derive(Debug)]
struct Flaky {
    inner: Arc<FileStore>,
    fail_saves: AtomicBool,
    fail_reports: AtomicBool,
    /// The states of the saves that failed, oldest first.
    refused: Mutex<Vec<State>>,
}

impl RolloutStore for Flaky {
    fn load<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        self.inner.load(service)
    }

    fn save<'a>(
        &'a self,
        service: &'a str,
        state: &'a State,
        expected: Option<u64>,
        fence: Fence,
    ) -> BoxFuture<'a, Result<Saved, StoreError>> {
        if self.fail_saves.load(Ordering::Relaxed) {
            self.refused.lock().unwrap().push(state.clone());
            return Box::pin(async { Err("injected: the store timed out".into()) });
        }
        self.inner.save(service, state, expected, fence)
    }

    fn publish_report<'a>(
        &'a self,
        service: &'a str,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.publish_report(service, report)
    }

    fn reports<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Vec<Report>, StoreError>> {
        if self.fail_reports.load(Ordering::Relaxed) {
            return Box::pin(async { Err("injected: the reports cannot be read".into()) });
        }
        self.inner.reports(service)
    }

    fn is_leader(&self, service: &str) -> bool {
        self.inner.is_leader(service)
    }

    fn watch(&self, service: &str) -> watch::Receiver<Option<Stored>> {
        self.inner.watch(service)
    }

    fn contact(&self) -> Contact {
        self.inner.contact()
    }
}

struct Setup {
    gateway: Gateway,
    store: Arc<Flaky>,
    gray: Upstream,
    _dir: TempDir,
}

async fn setup(tag: &str, rollout: &str) -> Setup {
    let (dir, gray, _base) = rollouts::files(tag, "interval_ms = 100\n", rollout).await;
    let config = Config::load(&dir.path().join("gateway.toml")).expect("a valid config");
    let store = Arc::new(Flaky {
        inner: FileStore::open(dir.path()).expect("the folder is ours"),
        fail_saves: AtomicBool::new(false),
        fail_reports: AtomicBool::new(false),
        refused: Mutex::default(),
    });
    let gateway = Gateway::start_with_store(config, store.clone())
        .await
        .expect("the gateway starts");
    Setup {
        gateway,
        store,
        gray,
        _dir: dir,
    }
}

fn advances(view: &serde_json::Value) -> usize {
    view["transitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["reason"]["kind"] == "advance")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advance_the_store_refused_is_not_in_force_and_a_rollback_is() {
    let s = setup(
        "rollout-save-fails",
        "steps = [20, 50, 100]\nhold_ms = 300\nmin_users = 10\ndetect = { power = 0 }\n",
    )
    .await;
    let (status, view) = admin(&s.gateway, "POST", "/rollouts/svc").await;
    assert_eq!(
        (status, view["weight"].as_f64()),
        (200, Some(20.0)),
        "{view:#}"
    );
    s.store.fail_saves.store(true, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let (_seen, tasks) = load(&s.gateway, 400, 6, false, stop.clone());

    // the leader derives the advance to 50 %, and the store refuses it, again and again
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while s
        .store
        .refused
        .lock()
        .unwrap()
        .iter()
        .filter(|st| st.weight == 50.0)
        .count()
        < 3
    {
        let (_, view) = admin(&s.gateway, "GET", "/rollouts/svc").await;
        assert_eq!(
            view["weight"].as_f64(),
            Some(20.0),
            "not in force: {view:#}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no advance derived: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, view) = admin(&s.gateway, "GET", "/rollouts/svc").await;
    assert_eq!(
        (
            view["weight"].as_f64(),
            view["phase"].as_str(),
            advances(&view)
        ),
        (Some(20.0), Some("step"), 0),
        "an advance the store refused is not in force, nor in the history: {view:#}"
    );
    let metrics = rollouts::text(&s.gateway, "/metrics").await;
    assert!(
        !metrics.contains("reason=\"advance\""),
        "nor counted: {metrics}"
    );

    // gray fails every request: the rollback is in force although the store refuses it
    s.gray.fail_per_mille.store(1000, Ordering::Relaxed);
    let view = wait_for(&s.gateway, Duration::from_secs(60), |v| {
        v["phase"] == "rolled_back"
    })
    .await;
    assert_eq!(
        (view["weight"].as_f64(), view["unsaved"].as_bool()),
        (Some(0.0), Some(true)),
        "{view:#}"
    );
    stop_load(&stop, tasks).await;

    // the store answers again: the rollback is what it keeps
    s.store.fail_saves.store(false, Ordering::Relaxed);
    wait_for(&s.gateway, Duration::from_secs(30), |v| {
        v["unsaved"] == false
    })
    .await;
    let stored = s.store.inner.load("svc").await.unwrap().expect("saved");
    assert_eq!(
        (stored.state.phase.as_str(), stored.state.weight),
        ("rolled_back", 0.0)
    );
    s.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_that_cannot_be_read_pause_the_rollout_as_stale() {
    let s = setup(
        "rollout-reports-fail",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\nstale_ms = 1500\n",
    )
    .await;
    admin(&s.gateway, "POST", "/rollouts/svc").await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_seen, tasks) = load(&s.gateway, 400, 4, false, stop.clone());
    wait_for(&s.gateway, Duration::from_secs(30), |v| {
        v["evidence"]["requests"]["gray"].as_u64() > Some(0)
    })
    .await;
    s.store.fail_reports.store(true, Ordering::Relaxed);
    let view = wait_for(&s.gateway, Duration::from_secs(30), |v| {
        v["phase"] == "paused"
    })
    .await;
    assert_eq!(
        (
            view["pause_reason"]["kind"].as_str(),
            view["weight"].as_f64()
        ),
        (Some("stale"), Some(20.0)),
        "{view:#}"
    );
    // readable again: it goes on by itself
    s.store.fail_reports.store(false, Ordering::Relaxed);
    wait_for(&s.gateway, Duration::from_secs(30), |v| {
        v["phase"] == "step"
    })
    .await;
    stop_load(&stop, tasks).await;
    s.gateway.shutdown().await;
}
