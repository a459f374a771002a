//! Discovery costs: one registry change applied to a set of 10,000 instances against the
//! same for 100 (it should not grow with the set), the diff of a whole new list with one
//! change (a file edit, a re-list; it does grow), and the initial list of 10,000 instances.
//!
//! Run with: cargo bench -p gray-discovery --bench discovery

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use gray_discovery::{Instance, InstanceId, InstanceSet, Record};

/// The etcd values of `n` instances, as `(id, JSON)`.
fn values(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let gray = if i % 10 == 0 { "true" } else { "false" };
            let value = format!(
                r#"{{"address": "10.{}.{}.{}:8080", "labels": {{"gray": "{gray}", "version": "1.{}"}}}}"#,
                i / 65536,
                (i / 256) % 256,
                i % 256,
                i % 3
            );
            (format!("orders-{i}"), value.into_bytes())
        })
        .collect()
}

/// What the etcd source does with one key/value: decode the record, update the set.
fn decode(id: &str, value: &[u8]) -> Instance {
    let record: Record = serde_json::from_slice(value).expect("valid record");
    record.into_instance(InstanceId::new(id).expect("valid id"))
}

fn set_of(values: &[(String, Vec<u8>)]) -> InstanceSet {
    values.iter().map(|(id, v)| decode(id, v)).collect()
}

fn one_change(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_change");
    for n in [100, 10_000] {
        let values = values(n);
        let relabelled =
            br#"{"address": "10.0.0.50:8080", "labels": {"gray": "true", "version": "2.0"}}"#;
        let original = values[50].1.clone();
        // A watch event: one put, decoded and applied to a set of n instances.
        let mut set = set_of(&values);
        let mut flip = false;
        group.bench_with_input(BenchmarkId::new("watch_event", n), &n, |b, _| {
            b.iter(|| {
                flip = !flip;
                let value: &[u8] = if flip { relabelled } else { &original };
                black_box(set.insert(decode("orders-50", value)))
            })
        });
        // A file edit or a re-list: the whole new list, diffed against the set.
        let base = set_of(&values);
        let mut next: Vec<Instance> = base.iter().cloned().collect();
        next.sort_by(|a, b| a.id().cmp(b.id()));
        next[50] = decode(next[50].id().as_str(), relabelled);
        group.bench_with_input(BenchmarkId::new("relist_diff", n), &n, |b, _| {
            b.iter_batched(
                || (base.clone(), next.clone()),
                |(mut set, next)| black_box(set.replace(next)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn initial_list(c: &mut Criterion) {
    let values = values(10_000);
    c.bench_function("initial_list/10000", |b| {
        b.iter(|| {
            let mut set = InstanceSet::new();
            let changes = set.replace(values.iter().map(|(id, v)| decode(id, v)));
            assert_eq!(changes.len(), 10_000);
            black_box(changes)
        })
    });
}

criterion_group!(benches, one_change, initial_list);
criterion_main!(benches);
