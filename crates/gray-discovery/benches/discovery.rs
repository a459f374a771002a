//! Discovery costs.
//!
//! - `registry/watch_event`: one etcd-style put (a relabelled instance) among 100 and among
//!   10,000 instances, from the source to a subscriber of the registry: the update crosses
//!   the registry's task (decode, apply, publish) and reaches the discover stream. It
//!   should not grow with the number of instances.
//! - `registry/relist`: the same change arriving as a whole new listing (etcd after a
//!   compaction): every value decoded, the set diffed, one change published. O(n).
//! - `registry/file_edit`: the same change as an edit of a JSON instance file: the file
//!   parsed, the set diffed, one change published. O(n).
//! - `registry/initial_load`: `Registry::start` over 10,000 instances (etcd keys, and a
//!   JSON file).
//! - `set/*`: the same operations on an [`InstanceSet`] alone (decode and apply, diff,
//!   initial list), the figures `docs/performance.md` gave before the registry existed.
//!
//! Run with: cargo bench -p gray-discovery --bench discovery

use std::{
    future::Future,
    hint::black_box,
    pin::Pin,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use futures_util::StreamExt;
use gray_discovery::{
    Instance, InstanceId, InstanceSet, Layout, Record, Registry,
    source::{Entry, Revision, Snapshot, Source, SourceError, StatusHandle, Update, Updates},
};
use tokio::sync::mpsc;

/// A label value never used before: every update built with it is a change.
fn fresh() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The record of instance `i`; `relabelled` gives it another `version` label, new each time.
fn record(i: usize, relabelled: bool) -> String {
    let gray = if i.is_multiple_of(10) {
        "true"
    } else {
        "false"
    };
    let version = if relabelled {
        format!("2.{}", fresh())
    } else {
        format!("1.{}", i % 3)
    };
    format!(
        r#"{{"address": "10.{}.{}.{}:8080", "labels": {{"gray": "{gray}", "version": "{version}"}}}}"#,
        i / 65536,
        (i / 256) % 256,
        i % 256,
    )
}

/// The etcd entries of `n` instances under `/gray/orders/`, instance 50 relabelled or not.
fn entries(n: usize, relabelled: bool) -> Vec<Entry> {
    (0..n)
        .map(|i| Entry {
            key: format!("/gray/orders/orders-{i}"),
            value: record(i, relabelled && i == 50).into_bytes(),
            revision: Revision::Manual(0),
        })
        .collect()
}

/// A JSON instance file of `n` instances, instance 50 relabelled or not.
fn document(n: usize, relabelled: bool) -> Vec<u8> {
    let list: Vec<String> = (0..n)
        .map(|i| {
            let record = record(i, relabelled && i == 50);
            format!(r#"{{"id": "orders-{i}", {}"#, &record[1..])
        })
        .collect();
    format!(r#"{{"services": {{"orders": [{}]}}}}"#, list.join(",\n")).into_bytes()
}

/// A source whose first content is given and whose updates the benchmark sends.
#[derive(Debug)]
struct Manual {
    first: Vec<Entry>,
    updates: Mutex<Option<mpsc::UnboundedReceiver<Update>>>,
}

impl Source for Manual {
    fn describe(&self) -> String {
        "bench".to_owned()
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(async move {
            Ok(Snapshot {
                entries: self.first.clone(),
                revision: Revision::Manual(0),
            })
        })
    }

    fn watch(&self) -> Updates {
        let rx = self.updates.lock().unwrap().take();
        let stream = futures_util::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            let update = rx.recv().await?;
            Some((update, Some(rx)))
        });
        Updates::new(stream, StatusHandle::new())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A registry of `first` in `layout`, and the sender of its updates.
async fn start(first: Vec<Entry>, layout: Layout) -> (Registry, mpsc::UnboundedSender<Update>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let source = Manual {
        first,
        updates: Mutex::new(Some(rx)),
    };
    let registry = Registry::start_with(source, layout).await.expect("starts");
    (registry, tx)
}

/// Times `iters` updates, each awaited on a subscriber; `make(i)` builds update `i` (before
/// the clock starts).
fn through_registry(
    rt: &tokio::runtime::Runtime,
    registry: &Registry,
    tx: &mpsc::UnboundedSender<Update>,
    iters: u64,
    make: impl Fn(u64) -> Update,
) -> Duration {
    let updates: Vec<Update> = (0..iters).map(make).collect();
    rt.block_on(async {
        let mut discover = registry.service("orders").expect("a name").discover();
        // The first inserts.
        while tokio::time::timeout(Duration::from_millis(1), discover.next())
            .await
            .is_ok()
        {}
        let start = Instant::now();
        for update in updates {
            tx.send(update).expect("the registry runs");
            black_box(discover.next().await);
        }
        start.elapsed()
    })
}

fn registry_changes(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("registry");
    for n in [100, 10_000] {
        let keys = entries(n, false);
        let (registry, tx) = rt.block_on(start(keys.clone(), Layout::keys("/gray")));
        group.bench_with_input(BenchmarkId::new("watch_event", n), &n, |b, _| {
            b.iter_custom(|iters| {
                through_registry(&rt, &registry, &tx, iters, |i| {
                    Update::Put(Entry {
                        key: "/gray/orders/orders-50".to_owned(),
                        value: record(50, true).into_bytes(),
                        revision: Revision::Manual(i),
                    })
                })
            })
        });
        group.bench_with_input(BenchmarkId::new("relist", n), &n, |b, _| {
            b.iter_custom(|iters| {
                through_registry(&rt, &registry, &tx, iters, |i| {
                    let mut entries = keys.clone();
                    entries[50].value = record(50, true).into_bytes();
                    Update::Reset(Snapshot {
                        entries,
                        revision: Revision::Manual(i),
                    })
                })
            })
        });
        drop(registry);

        let file = |relabelled| {
            vec![Entry {
                key: "instances.json".to_owned(),
                value: document(n, relabelled),
                revision: Revision::Manual(0),
            }]
        };
        let (registry, tx) = rt.block_on(start(
            file(false),
            Layout::document(gray_config::Format::Json),
        ));
        group.bench_with_input(BenchmarkId::new("file_edit", n), &n, |b, _| {
            b.iter_custom(|iters| {
                through_registry(&rt, &registry, &tx, iters, |i| {
                    Update::Reset(Snapshot {
                        entries: file(true),
                        revision: Revision::Manual(i),
                    })
                })
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("registry/initial_load");
    group.sample_size(20);
    let keys = entries(10_000, false);
    group.bench_function("etcd_keys/10000", |b| {
        b.iter_batched(
            || keys.clone(),
            |keys| rt.block_on(start(keys, Layout::keys("/gray"))),
            BatchSize::LargeInput,
        )
    });
    let file = vec![Entry {
        key: "instances.json".to_owned(),
        value: document(10_000, false),
        revision: Revision::Manual(0),
    }];
    group.bench_function("json_file/10000", |b| {
        b.iter_batched(
            || file.clone(),
            |file| rt.block_on(start(file, Layout::document(gray_config::Format::Json))),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// What a key source does with one value: decode the record into an instance.
fn decode(id: &str, value: &[u8]) -> Instance {
    let record: Record = serde_json::from_slice(value).expect("valid record");
    record.into_instance(InstanceId::new(id).expect("valid id"))
}

fn set_of(n: usize) -> InstanceSet {
    (0..n)
        .map(|i| decode(&format!("orders-{i}"), record(i, false).as_bytes()))
        .collect()
}

fn set_changes(c: &mut Criterion) {
    let mut group = c.benchmark_group("set");
    for n in [100, 10_000] {
        let relabelled = record(50, true);
        let original = record(50, false);
        assert_ne!(relabelled, original);
        // A watch event: one put, decoded and applied to a set of n instances.
        let mut set = set_of(n);
        let mut flip = false;
        group.bench_with_input(BenchmarkId::new("watch_event", n), &n, |b, _| {
            b.iter(|| {
                flip = !flip;
                let value = if flip { &relabelled } else { &original };
                black_box(set.insert(decode("orders-50", value.as_bytes())))
            })
        });
        // A re-list: the whole new list (decoded before), diffed against the set.
        let base = set_of(n);
        let mut next: Vec<Instance> = base.iter().cloned().collect();
        next.sort_by(|a, b| a.id().cmp(b.id()));
        next[50] = decode(next[50].id().as_str(), relabelled.as_bytes());
        group.bench_with_input(BenchmarkId::new("relist_diff", n), &n, |b, _| {
            b.iter_batched(
                || (base.clone(), next.clone()),
                |(mut set, next)| black_box(set.replace(next)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();

    let values: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("orders-{i}"), record(i, false)))
        .collect();
    c.bench_function("set/initial_list/10000", |b| {
        b.iter(|| {
            let mut set = InstanceSet::new();
            let changes = set.replace(values.iter().map(|(id, v)| decode(id, v.as_bytes())));
            assert_eq!(changes.len(), 10_000);
            black_box(changes)
        })
    });
}

criterion_group!(benches, registry_changes, set_changes);
criterion_main!(benches);
