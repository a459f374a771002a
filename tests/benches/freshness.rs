//! How long a change of the instances takes to reach a balancer with no traffic at all: the
//! latency behind the docs' "a new, relabelled or deleted instance reaches every
//! balancer within a second", measured here rather than asserted in a test (the tests wait
//! with a bound no loaded machine reaches).
//!
//! Each trial adds or removes one instance (alternately) and measures from just before the
//! write to the moment the change is seen:
//!
//! - `etcd → registry`: an etcd put (or delete) to the change on a registry's discover
//!   stream (the put's round trip included);
//! - `etcd → balancer`: the same, to `Balance::len` showing it (read by a thread of its own
//!   every 50 µs, so that nothing drives the balancer but its own driver);
//! - `file (250 ms) → balancer`: an atomic rewrite of the instance file, polled at the
//!   default interval, to `Balance::len` (each edit after a random pause, so that edits
//!   fall anywhere between two polls, as an operator's do);
//! - `file (20 ms) → balancer`: the same, polled every 20 ms (the pipeline behind the
//!   polling).
//!
//! Prints, per case, the number of trials, the median, the 95th percentile and the maximum.
//!
//! Run with: cargo bench -p gray-tests --bench freshness
//! (`FRESHNESS_TRIALS=n` sets the trials per case; 200 by default, a quarter of that for
//! the default file interval).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use gray_balance::{Balance, BalanceLayer};
use gray_discovery::{
    InstanceId, Registry,
    source::{
        etcd::{EtcdConfig, EtcdSource},
        file::FileSource,
    },
};
use gray_policy::Policy;
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use gray_tests::write_instances;

/// A balancer over bare instances (no client: only the set matters here).
type Instances = Balance<InstanceId, gray_discovery::Instance>;

/// Latencies of one case.
struct Figures {
    case: &'static str,
    samples: Vec<Duration>,
}

impl Figures {
    fn print(mut self) {
        self.samples.sort();
        let n = self.samples.len();
        let at = |q: f64| self.samples[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<28} n={n:<4} median {:>8.2} ms   p95 {:>8.2} ms   max {:>8.2} ms",
            self.case,
            ms(at(0.5)),
            ms(at(0.95)),
            ms(at(1.0)),
        );
    }
}

/// Waits on a thread of its own (no task of the runtime) until `balance` holds `len`
/// instances; returns when it saw it.
fn watch_len(balance: &Instances, len: usize) -> std::thread::JoinHandle<Instant> {
    let balance = balance.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while balance.len() != len {
            assert!(Instant::now() < deadline, "the balancer never showed {len}");
            std::thread::sleep(Duration::from_micros(50));
        }
        Instant::now()
    })
}

fn record(port: u16) -> String {
    format!(r#"{{"address": "127.0.0.1:{port}", "labels": {{"gray": "true"}}}}"#)
}

async fn etcd_cases(trials: usize) -> [Figures; 2] {
    let etcd = Etcd::start().await;
    let config = EtcdConfig::new([etcd.endpoint()]);
    etcd.put("/gray/stock/s-1", record(7001)).await;
    let registry = Registry::start(EtcdSource::prefix(config, "/gray/"))
        .await
        .expect("the registry starts");
    let stock = registry.service("stock").expect("a name");
    let balance: Instances = BalanceLayer::new("stock", Policy::new()).build(stock.discover());
    let mut stream = stock.discover();
    stream.next().await.expect("s-1").expect("a change");

    let mut registry_figures = Vec::with_capacity(trials);
    let mut balancer_figures = Vec::with_capacity(trials);
    for trial in 0..trials {
        let add = trial % 2 == 0;
        let seen = watch_len(&balance, if add { 2 } else { 1 });
        let start = Instant::now();
        if add {
            etcd.put("/gray/stock/s-2", record(7002)).await;
        } else {
            etcd.delete("/gray/stock/s-2").await;
        }
        tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("the change within the bound")
            .expect("the stream goes on")
            .expect("a change");
        registry_figures.push(start.elapsed());
        balancer_figures.push(seen.join().expect("the watcher") - start);
    }
    [
        Figures {
            case: "etcd → registry",
            samples: registry_figures,
        },
        Figures {
            case: "etcd → balancer",
            samples: balancer_figures,
        },
    ]
}

async fn file_case(case: &'static str, interval: Duration, trials: usize) -> Figures {
    let dir = TempDir::new("freshness-bench");
    let path = dir.path().join("instances.toml");
    let one: SocketAddr = ([127, 0, 0, 1], 7001).into();
    let two: SocketAddr = ([127, 0, 0, 1], 7002).into();
    write_instances(&path, "stock", &[("s-1", one, false)]);
    let registry = Registry::start(FileSource::new(&path).with_interval(interval))
        .await
        .expect("the registry starts");
    let stock = registry.service("stock").expect("a name");
    let balance: Instances = BalanceLayer::new("stock", Policy::new()).build(stock.discover());
    let mut samples = Vec::with_capacity(trials);
    let mut rng = gray_core::rand::Rng::seeded(7);
    for trial in 0..trials {
        // A trial starts just after a poll saw the last one: without a random pause, every
        // edit would land a whole interval before the next poll.
        let pause = rng.below(interval.as_micros() as u64);
        tokio::time::sleep(Duration::from_micros(pause)).await;
        let add = trial % 2 == 0;
        let seen = watch_len(&balance, if add { 2 } else { 1 });
        let start = Instant::now();
        if add {
            write_instances(&path, "stock", &[("s-1", one, false), ("s-2", two, true)]);
        } else {
            write_instances(&path, "stock", &[("s-1", one, false)]);
        }
        let seen = tokio::task::spawn_blocking(move || seen.join().expect("the watcher"))
            .await
            .expect("joined");
        samples.push(seen - start);
    }
    Figures { case, samples }
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments of its own.
    let trials: usize = std::env::var("FRESHNESS_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let figures = runtime.block_on(async {
        let [registry, balancer] = etcd_cases(trials).await;
        let slow = file_case(
            "file (250 ms) → balancer",
            Duration::from_millis(250),
            (trials / 4).max(2),
        )
        .await;
        let fast = file_case("file (20 ms) → balancer", Duration::from_millis(20), trials).await;
        [registry, balancer, slow, fast]
    });
    for case in figures {
        case.print();
    }
}
