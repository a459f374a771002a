//! What an etcd watch pays when it connects again, against a real etcd on loopback (the
//! `etcd` binary; started by `gray-test-support`).
//!
//! - `check/keys_only`: the request a watch makes on every new connection before it
//!   resumes: the keys under the prefix at the revision handed out, without their values,
//!   for 100 and 10,000 keys (instance records of ~90 bytes).
//! - `check/full_listing`: the whole prefix with its values, for comparison: what a reset
//!   costs, and what listing everything again at every reconnection would cost.
//! - `reconnect`: a prefix watch whose connection is cut, from the moment it is restored
//!   until the watch follows changes again (the connection, the check, the watch
//!   creation), for 0 and 10,000 keys: the difference is the check's share.
//!
//! Run with: cargo bench -p gray-source --features etcd --bench reconnect

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use etcd_client::{Client, GetOptions, Txn, TxnOp};
use futures_util::StreamExt;
use gray_core::backoff::Backoff;
use gray_source::{
    Source, Update,
    etcd::{EtcdConfig, EtcdSource},
};
use gray_test_support::etcd::{Etcd, Proxy};
use tokio::runtime::Runtime;

const SIZES: [usize; 2] = [100, 10_000];

/// Writes `n` instance records under `prefix`, 100 to a transaction; returns the store
/// revision after the last one.
async fn fill(client: &mut Client, prefix: &str, n: usize) -> i64 {
    let mut revision = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|i| {
                TxnOp::put(
                    format!("{prefix}orders-{i:05}"),
                    format!(
                        r#"{{"address": "10.0.{}.{}:8080", "labels": {{"version": "1.{}"}}}}"#,
                        i / 250,
                        i % 250,
                        i % 3
                    ),
                    None,
                )
            })
            .collect();
        let response = client
            .txn(Txn::new().and_then(ops))
            .await
            .expect("write the records");
        revision = response.header().map_or(0, |h| h.revision());
    }
    revision
}

fn check(c: &mut Criterion) {
    let rt = Runtime::new().expect("a runtime");
    let etcd = rt.block_on(Etcd::start());
    let mut client = rt.block_on(etcd.client());
    let mut group = c.benchmark_group("check");
    group.sample_size(20);
    for n in SIZES {
        let prefix = format!("/bench/{n}/");
        let revision = rt.block_on(fill(&mut client, &prefix, n));
        group.bench_with_input(BenchmarkId::new("keys_only", n), &n, |b, &n| {
            b.iter(|| {
                let options = GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_revision(revision);
                let response = rt
                    .block_on(client.get(prefix.as_str(), Some(options)))
                    .expect("list the keys");
                assert_eq!(response.kvs().len(), n);
            });
        });
        group.bench_with_input(BenchmarkId::new("full_listing", n), &n, |b, &n| {
            b.iter(|| {
                let options = GetOptions::new().with_prefix();
                let response = rt
                    .block_on(client.get(prefix.as_str(), Some(options)))
                    .expect("list the prefix");
                assert_eq!(response.kvs().len(), n);
            });
        });
    }
    group.finish();
}

fn reconnect(c: &mut Criterion) {
    let rt = Runtime::new().expect("a runtime");
    let etcd = rt.block_on(Etcd::start());
    let proxy = rt.block_on(Proxy::start(etcd.addr()));
    let mut client = rt.block_on(etcd.client());
    let mut group = c.benchmark_group("reconnect");
    group.sample_size(10);
    for n in [0, 10_000] {
        let prefix = format!("/reconnect/{n}/");
        rt.block_on(fill(&mut client, &prefix, n));
        let config = EtcdConfig::new([proxy.endpoint()]).with_backoff(Backoff::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ));
        let source = EtcdSource::prefix(config, prefix.as_str());
        let mut updates = rt.block_on(async { source.watch() });
        let status = updates.status_handle();
        let first = rt.block_on(updates.next());
        assert!(matches!(first, Some(Update::Reset(_))));
        // The watch is polled by a task of its own, as a consumer does.
        let task = rt.spawn(async move { while updates.next().await.is_some() {} });
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut changes = status.subscribe();
                    proxy.cut();
                    rt.block_on(changes.wait_for(|s| !s.connected))
                        .expect("the watch notices the cut");
                    let restored = Instant::now();
                    proxy.restore();
                    rt.block_on(changes.wait_for(|s| s.connected))
                        .expect("the watch follows again");
                    total += restored.elapsed();
                }
                total
            });
        });
        task.abort();
    }
    group.finish();
}

criterion_group!(benches, check, reconnect);
criterion_main!(benches);
