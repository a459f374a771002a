//! The cost of recording one request of a rollout: [`Recorder::record`], which is a
//! latency histogram record plus the user-level evidence (gray users seen, bad users per
//! stream and arm), single-threaded and with 2 threads recording into one recorder at
//! once.
//!
//! The traffic is a steady mix: 5 % of users in gray, 1 % of requests failing, latencies
//! spread so that about half exceed the p50 threshold and 1 % the p99 one, over 100,000
//! users (most records find their user already counted, as in a long epoch).
//!
//! The contended figure is wall time per request with 2 threads each recording `iters`
//! requests (total time / (2 × iters)): below the single-thread figure means the two
//! threads scale, above means they fight over cache lines.
//!
//! Run with: `cargo bench -p gray-rollout --bench record`

#![allow(clippy::disallowed_methods, reason = "a benchmark times itself")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gray_core::rand::Rng;
use gray_rollout::evidence::{Arm, EpochSpec, Observation, Outcome, Recorder, Thresholds};

const USERS: u64 = 100_000;

fn observations(seed: u64, n: usize) -> Vec<Observation> {
    let mut rng = Rng::seeded(seed);
    (0..n)
        .map(|_| {
            let user = rng.below(USERS);
            let arm = if user.is_multiple_of(20) {
                Arm::Gray
            } else {
                Arm::Baseline
            };
            let outcome = if rng.below(100) == 0 {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            // 99 % between 1 and 40 ms (p50 at 20.5), 1 % at 100–200 ms
            let micros = if rng.below(100) == 0 {
                100_000 + rng.below(100_000)
            } else {
                1_000 + rng.below(39_000)
            };
            Observation::new(arm, user, outcome, Duration::from_micros(micros))
        })
        .collect()
}

fn recorder() -> Recorder {
    let recorder = Recorder::new(1);
    let thresholds = Thresholds::new(Duration::from_millis(80), Duration::from_micros(20_500));
    recorder.follow(&EpochSpec::new(1).with_thresholds(Some(thresholds)));
    recorder
}

fn bench(c: &mut Criterion) {
    let obs = observations(7, 1 << 16);
    let mut group = c.benchmark_group("record");

    group.bench_function("histogram_only", |b| {
        let h = gray_rollout::Histogram::new();
        let mut i = 0;
        b.iter(|| {
            h.record(black_box(obs[i & (obs.len() - 1)].latency));
            i += 1;
        })
    });

    group.bench_function("1_thread", |b| {
        let r = recorder();
        // warm the user sets, as in the middle of an epoch
        for o in &obs {
            r.record(o);
        }
        let mut i = 0;
        b.iter(|| {
            r.record(black_box(&obs[i & (obs.len() - 1)]));
            i += 1;
        })
    });

    group.bench_function("2_threads", |b| {
        let r = Arc::new(recorder());
        for o in &obs {
            r.record(o);
        }
        let other = Arc::new(observations(8, 1 << 16));
        b.iter_custom(|iters| {
            let start = Instant::now();
            let helper = {
                let (r, other) = (r.clone(), other.clone());
                std::thread::spawn(move || {
                    for i in 0..iters as usize {
                        r.record(black_box(&other[i & (other.len() - 1)]));
                    }
                })
            };
            for i in 0..iters as usize {
                r.record(black_box(&obs[i & (obs.len() - 1)]));
            }
            helper.join().expect("recording thread");
            start.elapsed() / 2
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
