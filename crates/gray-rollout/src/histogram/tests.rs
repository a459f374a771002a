use super::*;

#[test]
fn buckets_tile_the_range_without_gaps() {
    assert_eq!(BUCKETS, 418);
    for i in 0..BUCKETS - 1 {
        let lo = lower_ns(i);
        let hi = nanos(upper_bound(i).unwrap());
        assert!(lo < hi, "bucket {i}");
        assert_eq!(bucket_of(lo), i, "lower edge of {i}");
        assert_eq!(bucket_of(hi - 1), i, "last value of {i}");
        assert_eq!(bucket_of(hi), i + 1, "upper edge of {i}");
        if i > 0 {
            // the relative width promised in the docs
            assert!(
                (hi - lo) as f64 / lo as f64 <= 1.0 / 16.0 + 1e-12,
                "bucket {i}"
            );
        }
    }
    assert_eq!(upper_bound(BUCKETS - 1), None);
    assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    assert_eq!(bucket_of(0), 0);
    // about 1 µs .. about 60 s
    assert_eq!(upper_bound(0), Some(Duration::from_nanos(1024)));
    assert!(upper_bound(BUCKETS - 2).unwrap() > Duration::from_secs(60));
}

#[test]
fn quantiles_stay_within_one_bucket_of_the_exact_value() {
    let h = Histogram::new();
    // a skewed spread from 3 µs to about 20 s
    let mut values: Vec<u64> = (0..5000u64)
        .map(|i| 3_000 + i * i * i / 6_000 + i * 17)
        .collect();
    for &v in &values {
        h.record(Duration::from_nanos(v));
    }
    values.sort_unstable();
    let snap = h.snapshot();
    for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0] {
        let rank = ((q * values.len() as f64).ceil() as usize).max(1);
        let exact = values[rank - 1] as f64;
        let est = nanos(snap.quantile(q).unwrap()) as f64;
        assert!(
            (est - exact).abs() <= exact / 16.0,
            "q {q}: estimate {est} ns, exact {exact} ns"
        );
    }
}

#[test]
fn extremes_land_in_the_edge_buckets() {
    let h = Histogram::new();
    h.record(Duration::from_nanos(10));
    h.record(Duration::from_secs(3600));
    let snap = h.snapshot();
    assert_eq!(snap.counts()[0], 1);
    assert_eq!(snap.counts()[BUCKETS - 1], 1);
    assert_eq!(snap.quantile(1.0), Some(Duration::from_nanos(1 << MAX_EXP)));
    assert!(snap.quantile(0.0).unwrap() < Duration::from_nanos(1024));
    assert_eq!(Snapshot::empty().quantile(0.5), None);
}

#[test]
fn concurrent_records_sum_exactly() {
    let h = std::sync::Arc::new(Histogram::new());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                for i in 0..25_000u64 {
                    h.record(Duration::from_micros(1 + (i * 7 + t) % 5_000));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("recording thread");
    }
    let snap = h.snapshot();
    assert_eq!(snap.count(), 100_000);
    let expected: u64 = (0..4u64)
        .flat_map(|t| (0..25_000u64).map(move |i| (1 + (i * 7 + t) % 5_000) * 1_000))
        .sum();
    assert_eq!(snap.sum(), Duration::from_nanos(expected));
}

#[test]
fn merge_adds_and_since_subtracts() {
    let (a, b) = (Histogram::new(), Histogram::new());
    for i in 1..=1000u64 {
        a.record(Duration::from_micros(i));
        b.record(Duration::from_millis(i));
    }
    let before = a.snapshot();
    for i in 1..=10u64 {
        a.record(Duration::from_secs(i));
    }
    let window = a.snapshot().since(&before);
    assert_eq!(window.count(), 10);
    assert_eq!(window.sum(), Duration::from_secs(55));

    let mut merged = a.snapshot();
    merged.merge(&b.snapshot());
    assert_eq!(merged.count(), 2010);
    // one histogram that saw everything has the same counts
    let all = Histogram::new();
    for i in 1..=1000u64 {
        all.record(Duration::from_micros(i));
        all.record(Duration::from_millis(i));
    }
    for i in 1..=10u64 {
        all.record(Duration::from_secs(i));
    }
    assert_eq!(merged, all.snapshot());

    // an empty snapshot is neutral and equal to a histogram's empty snapshot
    let empty = Snapshot::empty();
    assert_eq!(empty, Histogram::new().snapshot());
    let mut m = empty.clone();
    m.merge(&merged);
    assert_eq!(m, merged);
    m.merge(&Snapshot::empty());
    assert_eq!(m, merged);
    assert_eq!(merged.since(&empty), merged);
    assert_eq!(empty.since(&merged), empty);
    assert_eq!(empty.counts().len(), BUCKETS);
    assert_eq!(empty.cumulative().last(), Some((None, 0)));
}

#[test]
fn cumulative_counts_and_export_bounds() {
    let h = Histogram::new();
    for ms in [1u64, 2, 3, 50, 700] {
        h.record(Duration::from_millis(ms));
    }
    let snap = h.snapshot();
    let cumulative: Vec<_> = snap.cumulative().collect();
    assert_eq!(cumulative.len(), BUCKETS);
    assert_eq!(cumulative.last(), Some(&(None, 5)));
    assert!(cumulative.windows(2).all(|w| w[0].1 <= w[1].1));
    // rounding down to an edge never counts a latency above the bound
    assert_eq!(snap.count_below(Duration::from_millis(10)), 3);
    assert_eq!(snap.count_below(Duration::from_secs(1)), 5);
    assert_eq!(snap.count_below(Duration::ZERO), 0);
    // an exact edge is exact
    let edge = upper_bound(bucket_of(50_000_000)).unwrap();
    assert_eq!(snap.count_below(edge), 4);
}

#[test]
fn snapshots_serialise_sparsely_and_round_trip() {
    let h = Histogram::new();
    h.record(Duration::from_millis(5));
    h.record(Duration::from_millis(5));
    h.record(Duration::from_secs(2));
    let snap = h.snapshot();
    let json = serde_json::to_string(&snap).unwrap();
    assert_eq!(json.matches('[').count(), 3, "{json}");
    let back: Snapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snap);
    let err = serde_json::from_str::<Snapshot>(r#"{"sum_ns":0,"buckets":[[9999,1]]}"#).unwrap_err();
    assert!(
        err.to_string().contains("bucket 9999 does not exist"),
        "{err}"
    );
}
