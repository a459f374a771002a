//! Several gateways, one rollout (feature `etcd`): gateway processes (the real binary) on
//! one real etcd, real upstream instances, load spread over the gateways by sticky users.
//! A gray that starts failing is rolled back on every gateway; two aborts at once make one
//! transition; a leader killed mid-step hands over without a double advance; etcd frozen:
//! the weight is held, dropped to 0 after the partition hold, and put back when etcd
//! answers again; every gateway restarted resumes the same step with the same evidence.
//! Every wait is a bounded poll.

mod rollouts;

use std::{
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, atomic::AtomicBool, atomic::Ordering},
    time::{Duration, Instant},
};

use etcd_client::{EventType, WatchOptions};
use gray_rollout::State;
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use rollouts::{
    Addrs, RULES, Upstream, admin, load, settled, stop_load, upstream, wait_for, wait_until_seen,
};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

const STATE: &str = "/gray/rollouts/svc/state";
const LEADER: &str = "/gray/rollouts/svc/leader";

/// A gateway process.
struct Process {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Addrs for Process {
    fn proxy(&self) -> SocketAddr {
        self.proxy
    }
    fn admin(&self) -> SocketAddr {
        self.admin
    }
}

impl Process {
    /// Starts the binary on `dir`'s `gateway.toml`; returns once it serves.
    async fn start(dir: &TempDir) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
            .arg("--config")
            .arg(dir.path().join("gateway.toml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (proxy, admin) = tokio::time::timeout(WAIT, async {
            let mut proxy = None;
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(addr) = line.strip_prefix("gateway listening on http://") {
                    proxy = Some(addr.parse().unwrap());
                }
                if let Some(rest) = line.strip_prefix("admin on http://") {
                    let addr = rest.split_whitespace().next().unwrap();
                    return (proxy.unwrap(), addr.parse().unwrap());
                }
            }
            panic!("the gateway exited before it listened")
        })
        .await
        .expect("the gateway listens in time");
        // Keep reading stdout, so the gateway never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Process {
            child,
            proxy,
            admin,
        }
    }

    /// SIGKILL: no lease revoked, no key deleted.
    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

struct Setup {
    etcd: Etcd,
    gray: Upstream,
    base: Upstream,
    dir: TempDir,
}

/// A real etcd with a baseline and a gray instance of `svc`, and a gateway configuration
/// whose rollout has the keys `rollout`, with `[rollouts]` keys `settings`.
async fn setup(tag: &str, rollout: &str, settings: &str) -> Setup {
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
            "listen = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nrules = \"rules.toml\"\n\n\
             [etcd]\nendpoints = [\"{}\"]\nprefix = \"/gray\"\nconnect_timeout_ms = 1000\n\
             request_timeout_ms = 1000\nprogress_deadline_ms = 1500\n\n\
             [rollouts]\ninterval_ms = 100\nlease_ttl_ms = 2000\n{settings}\n\
             [services.svc]\npreset = \"seed-000\"\n\n[services.svc.rollout]\nrule = \"canary\"\n{rollout}",
            etcd.endpoint()
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

/// Starts two gateway processes, the first one leading.
async fn two(s: &Setup) -> (Process, Process) {
    let a = Process::start(&s.dir).await;
    wait_for(&a, WAIT, |v| v["leader"] == true).await;
    let b = Process::start(&s.dir).await;
    (a, b)
}

/// Every state written to `svc`'s state key, oldest first, read from etcd's history.
async fn history(etcd: &Etcd) -> Vec<(i64, State)> {
    let mut client = etcd.client().await;
    let last = client.get(STATE, None).await.unwrap().kvs()[0].mod_revision();
    let mut stream = client
        .watch(STATE, Some(WatchOptions::new().with_start_revision(1)))
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
fn written_once(states: &[(i64, State)]) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gray_failing_5_percent_is_rolled_back_on_every_gateway() {
    let s = setup(
        "rollout-etcd-fault",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
        "",
    )
    .await;
    let (a, b) = two(&s).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, mut tasks) = load(&a, 400, 4, false, stop.clone());
    let (seen_b, more) = load(&b, 400, 4, false, stop.clone());
    tasks.extend(more);
    // started through the gateway that does not lead
    let (status, view) = admin(&b, "POST", "/rollouts/svc").await;
    assert_eq!(
        (status, view["weight"].as_f64()),
        (200, Some(20.0)),
        "{view}"
    );
    wait_for(&a, WAIT, |v| v["weight"] == 20.0).await;
    wait_until_seen(&seen, 500).await;
    wait_until_seen(&seen_b, 500).await;

    let fault = Instant::now();
    s.gray.fail_per_mille.store(50, Ordering::Relaxed);
    let bound = Duration::from_secs(60);
    let on_a = wait_for(&a, bound, |v| {
        v["phase"] == "rolled_back" && v["weight"] == 0.0
    })
    .await;
    let on_b = wait_for(&b, bound, |v| {
        v["phase"] == "rolled_back" && v["weight"] == 0.0
    })
    .await;
    eprintln!("fault to weight 0 on both gateways: {:?}", fault.elapsed());
    for seen in [&seen, &seen_b] {
        let after = seen.0.lock().unwrap().len();
        wait_until_seen(seen, after + 200).await;
    }
    stop_load(&stop, tasks).await;
    let reason = on_a["last_transition"]["reason"]["kind"].as_str().unwrap();
    assert!(["alarm", "kill_switch"].contains(&reason), "{on_a:#}");
    assert_eq!(on_a["last_transition"], on_b["last_transition"]);
    // the last requests through either gateway went to baseline
    for seen in [&seen, &seen_b] {
        let all = seen.0.lock().unwrap();
        assert!(
            all[all.len() - 50..]
                .iter()
                .all(|(_, _, by)| by == "base-1")
        );
    }
    assert!(s.base.count.load(Ordering::Relaxed) > 0);
    written_once(&history(&s.etcd).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_aborting_at_once_make_one_transition() {
    let s = setup(
        "rollout-etcd-abort",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
        "",
    )
    .await;
    let (a, b) = two(&s).await;
    admin(&a, "POST", "/rollouts/svc").await;
    wait_for(&b, WAIT, |v| v["weight"] == 20.0).await;

    let (one, other) = tokio::join!(
        admin(&a, "POST", "/rollouts/svc/abort"),
        admin(&b, "POST", "/rollouts/svc/abort")
    );
    let mut won = 0;
    for (status, body) in [&one, &other] {
        match status {
            200 => {
                won += 1;
                assert_eq!(body["phase"], "rolled_back", "{body}");
            }
            409 => assert!(
                body["error"].as_str().unwrap().contains("rolled_back"),
                "{body}"
            ),
            _ => panic!("{status}: {body}"),
        }
    }
    assert!(won >= 1, "{one:?} {other:?}");
    for g in [&a, &b] {
        wait_for(g, WAIT, |v| {
            v["phase"] == "rolled_back" && v["weight"] == 0.0
        })
        .await;
    }
    let states = history(&s.etcd).await;
    written_once(&states);
    let rolled_back = states
        .iter()
        .filter(|(_, st)| {
            st.last_transition
                .as_ref()
                .is_some_and(|t| t.reason.as_str() == "abort")
        })
        .map(|(_, st)| st.transitions)
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(rolled_back.len(), 1, "{states:#?}");
    let last = &states.last().unwrap().1;
    assert_eq!(
        (last.transitions, last.weight),
        (2, 0.0),
        "start, then one abort"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_step_hands_over_without_a_double_advance() {
    let s = setup(
        "rollout-etcd-leader",
        "steps = [10, 20, 30, 50, 100]\nhold_ms = 1000\nmin_users = 10\n",
        "",
    )
    .await;
    let (a, b) = two(&s).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_, mut tasks) = load(&a, 400, 3, false, stop.clone());
    let (seen_b, more) = load(&b, 400, 3, false, stop.clone());
    tasks.extend(more);
    admin(&a, "POST", "/rollouts/svc").await;
    let bound = Duration::from_secs(60);
    wait_for(&b, bound, |v| v["step"].as_u64() >= Some(1)).await;
    assert_eq!(admin(&b, "GET", "/rollouts/svc").await.1["leader"], false);

    // the leader dies mid-step: its lease expires, the other gateway leads and goes on
    let killed = Instant::now();
    stop_load(&stop, tasks).await;
    a.kill().await;
    let stop = Arc::new(AtomicBool::new(false));
    let (_, tasks) = load(&b, 400, 4, false, stop.clone());
    wait_for(&b, bound, |v| v["leader"] == true).await;
    eprintln!("leader killed to another leading: {:?}", killed.elapsed());
    let view = wait_for(&b, bound, |v| {
        v["phase"] == "promoted" || v["phase"] == "rolled_back"
    })
    .await;
    stop_load(&stop, tasks).await;
    assert_eq!(view["phase"], "promoted", "{view:#}");
    assert!(!seen_b.0.lock().unwrap().is_empty());

    let mut client = s.etcd.client().await;
    let leader = client.get(LEADER, None).await.unwrap();
    let pid = b.child.id().unwrap().to_string();
    assert!(
        leader.kvs()[0]
            .value_str()
            .unwrap()
            .starts_with(&format!("{pid}-")),
        "{:?}",
        leader.kvs()
    );
    let states = history(&s.etcd).await;
    written_once(&states);
    // every step was entered once, in order
    let mut entered: Vec<usize> = states
        .iter()
        .filter_map(|(_, st)| st.last_transition.as_ref())
        .filter(|t| t.reason.as_str() == "advance" || t.reason.as_str() == "start")
        .filter_map(|t| t.step)
        .collect();
    entered.dedup();
    assert_eq!(entered, [0, 1, 2, 3], "{states:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_frozen_the_weight_is_held_then_dropped_then_put_back() {
    let hold = Duration::from_secs(3);
    let s = setup(
        "rollout-etcd-partition",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
        &format!("partition_hold_ms = {}\n", hold.as_millis()),
    )
    .await;
    let (a, b) = two(&s).await;
    admin(&a, "POST", "/rollouts/svc").await;
    for g in [&a, &b] {
        wait_for(g, WAIT, |v| v["weight"] == 20.0).await;
    }

    let frozen = s.etcd.freeze();
    let at = Instant::now();
    let bound = Duration::from_secs(30);
    for g in [&a, &b] {
        let view = wait_for(g, bound, |v| v["weight"] == 0.0).await;
        // held for the partition hold first (contact was fresh when etcd froze)
        assert!(
            at.elapsed() >= hold - Duration::from_millis(300),
            "{:?}",
            at.elapsed()
        );
        assert_eq!(
            (view["cut_off"].as_bool(), view["phase"].as_str()),
            (Some(true), Some("step")),
            "{view:#}"
        );
    }
    drop(frozen);
    for g in [&a, &b] {
        let view = wait_for(g, bound, |v| v["weight"] == 20.0).await;
        assert_eq!(view["cut_off"], false, "{view:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_restarted_resumes_the_same_step_with_the_same_evidence() {
    let s = setup(
        "rollout-etcd-restart",
        "steps = [20, 50, 100]\nhold_ms = 600000\nmin_users = 10\n",
        "",
    )
    .await;
    let (a, b) = two(&s).await;
    admin(&b, "POST", "/rollouts/svc").await;
    for g in [&a, &b] {
        wait_for(g, WAIT, |v| v["weight"] == 20.0).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, mut tasks) = load(&a, 400, 3, false, stop.clone());
    let (seen_b, more) = load(&b, 400, 3, false, stop.clone());
    tasks.extend(more);
    wait_until_seen(&seen, 600).await;
    wait_until_seen(&seen_b, 600).await;
    stop_load(&stop, tasks).await;
    let before: Value = settled(&a).await;
    // the leader summed both gateways' counts: every request of the load is evidence once
    let sent = seen.0.lock().unwrap().len() + seen_b.0.lock().unwrap().len();
    let requests = &before["evidence"]["requests"];
    let counted = requests["gray"].as_u64().unwrap() + requests["baseline"].as_u64().unwrap();
    assert_eq!(counted, sent as u64, "{before:#}");
    assert!(requests["gray"].as_u64() > Some(0), "{before:#}");
    a.kill().await;
    b.kill().await;

    let (a, b) = (Process::start(&s.dir).await, Process::start(&s.dir).await);
    for g in [&a, &b] {
        let (_, after) = admin(g, "GET", "/rollouts/svc").await;
        for key in ["phase", "weight", "step", "evidence"] {
            assert_eq!(after[key], before[key], "{key}: {after:#} vs {before:#}");
        }
    }
}
