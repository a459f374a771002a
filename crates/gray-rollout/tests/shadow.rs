//! The shadow's judge (`gray_rollout::shadow`), by seeded simulation over many runs: no
//! more false alarms than `alpha` allows with learned noise between 0 and 5 % (and with
//! baseline's instances differing in a field on every answer), and a gray that differs on
//! 2 % of its answers in a field baseline never varies caught within a minute at 100
//! requests a second, while one that differs only in the noisy field is not.
//!
//! Figures are printed (run with `--nocapture`) for `docs/performance.md`.

mod sim;

use std::time::Duration;

use gray_core::rand::Rng;
use gray_rollout::{
    Arm,
    shadow::{Comparison, Judge},
};
use sim::{bernoulli, quantile};

const ALPHA: f64 = 0.05;
/// Requests a second, and the share of them that also get a control.
const RATE: u64 = 100;
const CONTROLS: f64 = 0.2;

/// The most false alarms `n` runs may show when each has a chance of at most `alpha`:
/// α·n plus three binomial standard deviations.
fn allowed(n: u64, alpha: f64) -> f64 {
    let n = n as f64;
    alpha.mul_add(n, 3.0 * (n * alpha * (1.0 - alpha)).sqrt())
}

/// What one comparison of `arm` finds: `json /ts` with probability `noise`, a field both
/// arms vary in alike (`json /shared`, the null's own mismatches) with probability
/// `shared`, and for gray only `json /id` with probability `bug`; slow with probability
/// `slow` in either arm.
struct World {
    noise: f64,
    shared: f64,
    bug: f64,
    slow: f64,
}

impl World {
    fn compare(&self, rng: &mut Rng, arm: Arm) -> Comparison {
        let mut differences = Vec::new();
        if bernoulli(rng, self.noise) {
            differences.push("json /items/3/ts");
        }
        if bernoulli(rng, self.shared) {
            differences.push("json /shared");
        }
        if arm == Arm::Gray && bernoulli(rng, self.bug) {
            differences.push("json /id");
        }
        Comparison::new(arm, differences, bernoulli(rng, self.slow))
    }

    /// Runs `seconds` of traffic, a look each second; the second of the first alarm.
    fn run(&self, seed: u64, seconds: u64) -> Option<u64> {
        let mut rng = Rng::seeded(seed);
        let mut judge = Judge::new(ALPHA).unwrap();
        for second in 1..=seconds {
            for _ in 0..RATE {
                let copy = self.compare(&mut rng, Arm::Gray);
                if bernoulli(&mut rng, CONTROLS) {
                    let control = self.compare(&mut rng, Arm::Baseline);
                    judge.observe_pair(&copy, &control);
                } else {
                    judge.observe(&copy);
                }
            }
            if judge.look(Duration::from_secs(second)).is_some() {
                return Some(second);
            }
        }
        None
    }
}

#[test]
fn false_alarms_stay_within_alpha_with_learned_noise_up_to_five_percent() {
    let runs = 200;
    let mut total = 0;
    for (i, noise) in [0.0, 0.01, 0.02, 0.05, 1.0].into_iter().enumerate() {
        let world = World {
            noise,
            shared: 0.01,
            bug: 0.0,
            slow: 0.05,
        };
        let alarms = (0..runs)
            .filter(|run| world.run(1_000 * i as u64 + run, 300).is_some())
            .count() as u64;
        println!("noise {noise}: {alarms} false alarms in {runs} runs of 300 s");
        assert!(
            alarms as f64 <= allowed(runs, ALPHA),
            "noise {noise}: {alarms} false alarms in {runs} runs"
        );
        total += alarms;
    }
    assert!(
        total as f64 <= allowed(5 * runs, ALPHA),
        "{total} false alarms in {} runs",
        5 * runs
    );
}

#[test]
fn a_gray_differing_on_two_percent_of_answers_is_caught_within_a_minute() {
    // Baseline's instances differ in `ts` on every answer; gray also in `id` on 2 %.
    let world = World {
        noise: 1.0,
        shared: 0.0,
        bug: 0.02,
        slow: 0.0,
    };
    let runs = 100;
    let mut seconds: Vec<f64> = (0..runs)
        .map(|run| {
            world
                .run(50_000 + run, 120)
                .map_or(f64::INFINITY, |s| s as f64)
        })
        .collect();
    let caught = seconds.iter().filter(|s| s.is_finite()).count();
    let p95 = quantile(&mut seconds, 0.95);
    let p50 = quantile(&mut seconds, 0.5);
    println!("2 % bug at {RATE}/s: caught in {caught} of {runs} runs, p50 {p50} s, p95 {p95} s");
    assert_eq!(caught, runs as usize);
    assert!(p95 < 60.0, "p95 {p95} s");

    // Differing only in the noisy field: never.
    let noisy = World {
        noise: 1.0,
        shared: 0.0,
        bug: 0.0,
        slow: 0.0,
    };
    let alarms = (0..runs)
        .filter(|run| noisy.run(60_000 + run, 120).is_some())
        .count();
    assert_eq!(alarms, 0);
}

#[test]
fn a_slower_gray_is_caught_on_its_own_stream() {
    let world = World {
        noise: 0.0,
        shared: 0.0,
        bug: 0.0,
        slow: 0.0,
    };
    let mut rng = Rng::seeded(7);
    let mut judge = Judge::new(ALPHA).unwrap();
    let mut alarm = None;
    for second in 1..=120 {
        for _ in 0..RATE {
            let mut copy = world.compare(&mut rng, Arm::Gray);
            // A tenth of gray's answers are slow; baseline's never.
            if bernoulli(&mut rng, 0.1) {
                copy = Comparison::new(Arm::Gray, Vec::<String>::new(), true);
            }
            if bernoulli(&mut rng, CONTROLS) {
                judge.observe_pair(&copy, &world.compare(&mut rng, Arm::Baseline));
            } else {
                judge.observe(&copy);
            }
        }
        alarm = judge.look(Duration::from_secs(second));
        if alarm.is_some() {
            break;
        }
    }
    assert_eq!(alarm, Some("slow"));
    assert!(judge.summary().slow_log_m >= judge.summary().alarm_at);
}

/// `gateways` gateways, each with a judge of its own (its own noise learned), a third of
/// the traffic each, their cumulative counts merged every `report_every` seconds as a
/// rollout's leader does (`ShadowCounts::since` and `feed`, one batch per gateway's
/// report); the second of the first alarm.
fn fleet(
    world: &World,
    seed: u64,
    gateways: usize,
    report_every: u64,
    seconds: u64,
) -> Option<u64> {
    use gray_rollout::sequential::{DEFAULT_MULTIPLIERS, MixtureTest};
    use gray_rollout::shadow::ShadowCounts;
    let mut rng = Rng::seeded(seed);
    let mut judges: Vec<Judge> = (0..gateways).map(|_| Judge::new(ALPHA).unwrap()).collect();
    let mut consumed = vec![ShadowCounts::default(); gateways];
    let test = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, ALPHA / 2.0).unwrap();
    let (mut mismatch, mut slow) = (test.clone(), test);
    for second in 1..=seconds {
        for _ in 0..RATE {
            // An L4 balancer spreads the requests over the gateways.
            let judge = &mut judges[rng.index(gateways)];
            let copy = world.compare(&mut rng, Arm::Gray);
            if bernoulli(&mut rng, CONTROLS) {
                judge.observe_pair(&copy, &world.compare(&mut rng, Arm::Baseline));
            } else {
                judge.observe(&copy);
            }
        }
        let now = Duration::from_secs(second);
        for judge in &mut judges {
            judge.look(now);
        }
        if second % report_every == 0 {
            for (judge, before) in judges.iter().zip(&mut consumed) {
                let counts = judge.counts();
                if counts.since(before).feed(now, &mut mismatch, &mut slow) {
                    return Some(second);
                }
                *before = counts;
            }
        }
    }
    None
}

#[test]
fn on_three_gateways_merged_counts_keep_alpha_and_catch_the_bug() {
    let runs = 200;
    let mut alarms = 0;
    for (i, noise) in [0.0, 0.02, 0.05, 1.0].into_iter().enumerate() {
        let world = World {
            noise,
            shared: 0.01,
            bug: 0.0,
            slow: 0.05,
        };
        let n = (0..runs)
            .filter(|run| fleet(&world, 70_000 + 1_000 * i as u64 + run, 3, 10, 300).is_some())
            .count() as u64;
        println!("3 gateways, noise {noise}: {n} false alarms in {runs} runs of 300 s");
        alarms += n;
    }
    assert!(
        alarms as f64 <= allowed(4 * runs, ALPHA),
        "{alarms} false alarms in {} runs",
        4 * runs
    );
    let world = World {
        noise: 1.0,
        shared: 0.0,
        bug: 0.02,
        slow: 0.0,
    };
    let mut seconds: Vec<f64> = (0..100)
        .map(|run| fleet(&world, 90_000 + run, 3, 10, 180).map_or(f64::INFINITY, |s| s as f64))
        .collect();
    let caught = seconds.iter().filter(|s| s.is_finite()).count();
    let p95 = quantile(&mut seconds, 0.95);
    println!("3 gateways, 2 % bug: caught in {caught} of 100 runs, p95 {p95} s");
    assert_eq!(caught, 100);
    assert!(p95 < 90.0, "p95 {p95} s");
}
