//! Gateway processes on one real etcd (feature `etcd`): the binary started on a
//! configuration whose `[etcd]` table holds the instances and the rollouts, and what etcd
//! kept of a rollout's state.

use std::sync::{Arc, atomic::AtomicBool};

use etcd_client::{EventType, WatchOptions};
use gray_rollout::State;
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use serde_json::Value;

pub(crate) use super::process::Process;
use super::{
    RULES, Seen, Upstream, admin, load, settled, stop_load, upstream, wait_for_rollout,
    wait_until_seen,
};

pub(crate) const STATE: &str = "/gray/rollouts/svc/state";
pub(crate) const LEADER: &str = "/gray/rollouts/svc/leader";

pub(crate) struct Setup {
    pub(crate) etcd: Etcd,
    pub(crate) gray: Upstream,
    pub(crate) base: Upstream,
    pub(crate) dir: TempDir,
}

/// A real etcd with a baseline and a gray instance of `svc`, and a gateway configuration
/// whose rollout has the keys `rollout`, with `[rollouts]` keys `settings`.
pub(crate) async fn setup(tag: &str, rollout: &str, settings: &str) -> Setup {
    let etcd = Etcd::start().await;
    let (gray_addr, gray) = upstream("gray-1").await;
    let (base_addr, base) = upstream("base-1").await;
    etcd.put(
        "/gray/svc/gray-1",
        format!(r#"{{"address": "{gray_addr}", "labels": {{"gray": "true"}}}}"#),
    )
    .await;
    etcd.put(
        "/gray/svc/base-1",
        format!(r#"{{"address": "{base_addr}"}}"#),
    )
    .await;
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("rules.toml"), RULES).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\n{}\
             [services.svc]\npreset = \"seed-000\"\n\n[services.svc.rollout]\nrule = \"canary\"\n{rollout}",
            tables(&etcd, settings),
        ),
    )
    .unwrap();
    Setup {
        etcd,
        gray,
        base,
        dir,
    }
}

/// The `[etcd]` table of the tests' gateways (on `etcd`, prefix `/gray`, short timeouts)
/// and their `[rollouts]` table: looks every 100 ms, [`FAST_WRITES`](super::FAST_WRITES),
/// a 2 s lease, and the keys `settings`.
pub(crate) fn tables(etcd: &Etcd, settings: &str) -> String {
    format!(
        "[etcd]\nendpoints = [\"{}\"]\nprefix = \"/gray\"\nconnect_timeout_ms = 1000\n\
         request_timeout_ms = 1000\nprogress_deadline_ms = 1500\n\n\
         [rollouts]\ninterval_ms = 100\n{FAST}lease_ttl_ms = 2000\n{settings}\n",
        etcd.endpoint(),
        FAST = super::FAST_WRITES,
    )
}

/// Starts `n` gateway processes on `dir`'s `gateway.toml`, the first one leading the
/// rollout of `service`.
pub(crate) async fn started(dir: &TempDir, service: &str, n: usize) -> Vec<Process> {
    let first = Process::start(dir).await;
    wait_for_rollout(&first, service, WAIT, |v| v["leader"] == true).await;
    let mut gateways = vec![first];
    for _ in 1..n {
        gateways.push(Process::start(dir).await);
    }
    gateways
}

/// Starts two gateway processes, the first one leading.
pub(crate) async fn two(s: &Setup) -> (Process, Process) {
    let mut gateways = started(&s.dir, "svc", 2).await.into_iter();
    (gateways.next().unwrap(), gateways.next().unwrap())
}

/// Every state written to `svc`'s state key, oldest first, read from etcd's history.
pub(crate) async fn history(etcd: &Etcd) -> Vec<(i64, State)> {
    history_of(etcd, "svc").await
}

/// Every state written to `service`'s state key, oldest first, read from etcd's history.
pub(crate) async fn history_of(etcd: &Etcd, service: &str) -> Vec<(i64, State)> {
    let key = format!("/gray/rollouts/{service}/state");
    let mut client = etcd.client().await;
    let last = client.get(key.as_str(), None).await.unwrap().kvs()[0].mod_revision();
    let mut stream = client
        .watch(
            key.as_str(),
            Some(WatchOptions::new().with_start_revision(1)),
        )
        .await
        .unwrap();
    let mut states = Vec::new();
    tokio::time::timeout(WAIT, async {
        while states.last().is_none_or(|(rev, _)| *rev < last) {
            let res = stream.message().await.unwrap().expect("the watch goes on");
            for e in res.events() {
                let kv = e.kv().unwrap();
                assert_eq!(e.event_type(), EventType::Put, "the state is never deleted");
                let state: State = serde_json::from_slice(kv.value()).unwrap();
                states.push((kv.mod_revision(), state));
            }
        }
    })
    .await
    .expect("the state's history is read in time");
    states
}

/// Each transition was written once: no two states number the same transition
/// differently, and the step never moves by more than one.
pub(crate) fn written_once(states: &[(i64, State)]) {
    for pair in states.windows(2) {
        let ((_, a), (rev, b)) = (&pair[0], &pair[1]);
        assert!(b.transitions >= a.transitions, "at {rev}: {a:?} then {b:?}");
        if b.transitions == a.transitions {
            assert_eq!(a.last_transition, b.last_transition, "at {rev}");
        }
        if let (Some(x), Some(y)) = (a.step, b.step) {
            assert!(y <= x + 1, "at {rev}: step {x} then {y}");
        }
    }
}

/// Two gateways, load through both, until `requests` requests were answered; then the
/// view of the gateway that leads.
pub(crate) async fn two_under_load(
    s: &Setup,
    requests: usize,
    users: u32,
) -> (Process, Process, Value) {
    let (a, b) = two(s).await;
    admin(&a, "POST", "/rollouts/svc").await;
    let (stop, [seen, seen_b], tasks) = load_both(&a, &b, users, 3);
    wait_until_seen(&seen, requests / 2).await;
    wait_until_seen(&seen_b, requests / 2).await;
    stop_load(&stop, tasks).await;
    let view = settled(&a).await;
    (a, b, view)
}

/// A load of `users` sticky users over both gateways, `per_gateway` requests at a time
/// through each: what each gateway's part saw, and the tasks to stop.
pub(crate) fn load_both(
    a: &Process,
    b: &Process,
    users: u32,
    per_gateway: u32,
) -> (
    Arc<AtomicBool>,
    [Arc<Seen>; 2],
    Vec<tokio::task::JoinHandle<()>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let (seen_a, mut tasks) = load(a, users, per_gateway, false, stop.clone());
    let (seen_b, more) = load(b, users, per_gateway, false, stop.clone());
    tasks.extend(more);
    (stop, [seen_a, seen_b], tasks)
}
