//! The statistical acceptance tests of automatic rollouts: seeded simulations on a
//! simulated clock, many runs each, bounds that fail when the property breaks.
//!
//! Figures are printed (run with `--nocapture`) for `docs/performance.md`.

mod sim;

use std::time::Duration;

use gray_core::rand::Rng;
use gray_rollout::machine::{Detect, Reason};
use gray_rollout::{Arm, Outcome, Phase, RolloutConfig};
use sim::{
    Req, Requests, Spread, World, baseline_latency, bernoulli, population, quantile, uniform,
};

const S: fn(u64) -> Duration = Duration::from_secs;
const ALPHA: f64 = 0.01;

/// The most false rollbacks `n` runs may show when each has a chance of at most `alpha`:
/// α·n plus three binomial standard deviations.
fn allowed(n: u64, alpha: f64) -> f64 {
    let n = n as f64;
    alpha.mul_add(n, 3.0 * (n * alpha * (1.0 - alpha)).sqrt())
}

/// A 95 % Wilson interval for `k` of `n`.
fn wilson(k: u64, n: u64) -> (f64, f64) {
    let (k, n, z) = (k as f64, n as f64, 1.96);
    let p = k / n;
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    (centre - half, centre + half)
}

fn healthy(req: Req, rng: &mut Rng) -> (Outcome, Duration) {
    let _ = req;
    let outcome = if bernoulli(rng, 0.001) {
        Outcome::Error
    } else {
        Outcome::Ok
    };
    (outcome, baseline_latency(rng))
}

// === calibration ===

#[test]
fn a_healthy_gray_over_4000_hours_is_rolled_back_at_most_alpha_of_the_time() {
    let world = World {
        mean_rps: 100.0,
        swing: 10.0,
        error_rate: 0.001,
        burst_every: Duration::from_secs(3600),
        burst_length: (S(10), S(120)),
        burst_error_rate: (0.02, 0.5),
        p99_base: 0.01,
        p50_base: 0.5,
    };
    let config = RolloutConfig::new("canary")
        .with_hold(Duration::from_secs(600))
        .with_min_users(100)
        .with_alpha(ALPHA);
    let mut total = sim::Calibration::default();
    for seed in 0..4 {
        let c = sim::aggregate(1000 + seed, &world, &config, 1000.0);
        total.rollouts += c.rollouts;
        total.rolled_back += c.rolled_back;
        total.kill_switch += c.kill_switch;
        total.promoted += c.promoted;
        total.hours += c.hours;
        total.steps_entered += c.steps_entered;
        total.pauses += c.pauses;
    }
    let (lo, hi) = wilson(total.rolled_back, total.rollouts);
    eprintln!(
        "calibration: {} rollouts over {} h ({} steps entered, {} automatic or gate pauses), \
         {} rolled back ({} by the kill switch): {:.3} % (95 % CI {:.3}–{:.3} %), {:.3} % of hours",
        total.rollouts,
        total.hours,
        total.steps_entered,
        total.pauses,
        total.rolled_back,
        total.kill_switch,
        100.0 * total.rolled_back as f64 / total.rollouts as f64,
        100.0 * lo,
        100.0 * hi,
        100.0 * total.rolled_back as f64 / total.hours,
    );
    assert!(total.hours >= 4000.0);
    assert!(total.rollouts >= 3000, "{total:?}");
    assert_eq!(total.kill_switch, 0, "{total:?}");
    assert!(
        (total.rolled_back as f64) <= allowed(total.rollouts, ALPHA),
        "{} false rollbacks in {} rollouts: more than α + 3σ",
        total.rolled_back,
        total.rollouts
    );
}

/// The request path for real: heavy and occasional users, user sets, thresholds from the
/// baseline, reports; a large α so that a few hundred runs can check it. On one gateway,
/// and on 3 and 10 whose recorders each count the users they see, the leader counting
/// the union of their user logs, under a load swinging ten-fold.
#[test]
fn users_hashed_into_arms_through_the_recorder_keep_the_bound() {
    let alpha = 0.3;
    for (gateways, spread, runs, seed0) in [
        (1, Spread::RoundRobin, 200u64, 0),
        (3, Spread::RoundRobin, 120, 5_000),
        (10, Spread::Random, 120, 5_000),
    ] {
        let mut false_rollbacks = 0;
        for seed in seed0..seed0 + runs {
            let config = RolloutConfig::new("canary")
                .with_steps([5.0, 10.0, 25.0, 50.0, 100.0])
                .with_hold(S(40))
                .with_min_users(20)
                .with_min_latency_samples(500)
                .with_alpha(alpha);
            let mut sim = Requests::new(seed, config, 50.0).on_gateways(gateways, spread);
            if gateways > 1 {
                sim = sim.with_swing(10.0, S(120));
            }
            let mut users = population(300, 0.3);
            let mut behaviour = healthy;
            sim.run(S(20), &mut users, &mut behaviour);
            sim.start();
            sim.run(S(240), &mut users, &mut behaviour);
            if sim.rolled_back_at().is_some() {
                false_rollbacks += 1;
            }
        }
        eprintln!(
            "request-level calibration at α = {alpha} on {gateways} gateways ({spread:?}): \
             {false_rollbacks} of {runs} rolled back"
        );
        assert!(
            false_rollbacks as f64 <= allowed(runs, alpha),
            "{gateways} gateways: {false_rollbacks} of {runs}"
        );
    }
}

// === detection ===

/// Runs `runs` seeded rollouts at 100 rps with 5 % in gray, request by request: 30 s of
/// baseline alone (its latencies set the thresholds), the start, a healthy minute, then
/// `fault` on gray. Returns the times from the fault to the rollback, in seconds.
fn time_to_rollback(
    runs: u64,
    seed0: u64,
    fault: fn(Req, &mut Rng) -> (Outcome, Duration),
) -> Vec<f64> {
    let fault_at = S(90);
    (0..runs)
        .map(|i| {
            let config = RolloutConfig::new("canary")
                .with_steps([5.0, 100.0])
                .with_hold(S(3600))
                .with_alpha(ALPHA);
            let mut sim = Requests::new(seed0 + i, config, 100.0);
            let mut users = population(200, 0.1);
            let mut behaviour = |req: Req, rng: &mut Rng| {
                if req.arm == Arm::Gray && req.at >= fault_at {
                    fault(req, rng)
                } else {
                    healthy(req, rng)
                }
            };
            sim.run(S(30), &mut users, &mut behaviour);
            sim.start();
            sim.run(S(600), &mut users, &mut behaviour);
            let at = sim.rolled_back_at().unwrap_or_else(|| {
                panic!(
                    "run {i}: not rolled back: {:?}",
                    sim.rollout.state().evidence.summary()
                )
            });
            assert!(
                at >= fault_at,
                "run {i}: rolled back before the fault, at {at:?}"
            );
            (at - fault_at).as_secs_f64()
        })
        .collect()
}

fn median_p95(times: &mut [f64]) -> (f64, f64) {
    (quantile(times, 0.5), quantile(times, 0.95))
}

#[test]
fn errors_from_0_1_to_5_percent_on_gray_are_rolled_back_within_40_s_p95() {
    let mut times = time_to_rollback(200, 20_000, |_, rng| {
        let outcome = if bernoulli(rng, 0.05) {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        (outcome, baseline_latency(rng))
    });
    let (median, p95) = median_p95(&mut times);
    eprintln!(
        "errors 0.1 % → 5 % on gray, a minute into the step: median {median:.0} s, p95 {p95:.0} s, \
         max {:.0} s over {} runs",
        quantile(&mut times, 1.0),
        times.len()
    );
    assert!(p95 < 40.0, "p95 {p95} s");
}

#[test]
fn thirty_percent_of_gray_slower_than_the_baseline_p99_is_rolled_back_within_10_s_p95() {
    let mut times = time_to_rollback(200, 30_000, |_, rng| {
        let latency = if bernoulli(rng, 0.3) {
            // 100–200 ms: above the baseline's p99 (≈ 64 ms)
            Duration::from_secs_f64(0.1f64.mul_add(uniform(rng), 0.1))
        } else {
            baseline_latency(rng)
        };
        let outcome = if bernoulli(rng, 0.001) {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        (outcome, latency)
    });
    let (median, p95) = median_p95(&mut times);
    eprintln!(
        "30 % of gray above the baseline p99, a minute into the step: median {median:.0} s, \
         p95 {p95:.0} s, max {:.0} s over {} runs",
        quantile(&mut times, 1.0),
        times.len()
    );
    assert!(p95 < 10.0, "p95 {p95} s");
}

#[test]
fn a_fault_long_into_a_step_is_still_caught_quickly() {
    // Counts per second (every request a new user): the same fault as above, at the
    // start of the step, 10 minutes and an hour into it; with onsets (the default) and
    // with the design's single mixture from the start.
    let with = RolloutConfig::new("canary")
        .with_steps([5.0, 100.0])
        .with_hold(S(100_000));
    let without = with.clone().with_onsets(Duration::ZERO, 1);
    let runs = 200;
    let mut p95 = Vec::new();
    for (name, config) in [("onsets", &with), ("single mixture", &without)] {
        for after in [0, 600, 3600] {
            let mut times: Vec<f64> = (0..runs)
                .map(|i| {
                    let seed = 70_000 + i + after;
                    sim::aggregate_detection(seed, config, 100.0, 0.001, 0.05, S(after), S(1000))
                        .unwrap_or_else(|| panic!("{name}, fault after {after} s: not rolled back"))
                })
                .collect();
            let (median, p) = median_p95(&mut times);
            eprintln!("{name}, fault {after} s into the step: median {median:.0} s, p95 {p:.0} s");
            p95.push(p);
        }
    }
    // with onsets: quick at any time
    assert!(p95[0] < 40.0 && p95[1] < 60.0 && p95[2] < 60.0, "{p95:?}");
    // the single mixture pays back its healthy hour first
    assert!(p95[5] > 2.0 * p95[2], "{p95:?}");
}

// === must not roll back ===

/// Runs `runs` rollouts through every default step with 20 s holds at 100 rps (for at most
/// half an hour: a step also waits until its evidence could catch a degradation, which at
/// 1 % and about one new gray user a second takes minutes); returns how many were
/// promoted, rolled back, and rolled back by the kill switch.
fn step_through(
    runs: u64,
    seed0: u64,
    population: &dyn Fn() -> Box<dyn FnMut(&mut Rng) -> u64>,
    behaviour: &dyn Fn(u64) -> sim::Behaviour,
) -> (u64, u64, u64) {
    step_through_on(1, Spread::RoundRobin, runs, seed0, population, behaviour)
}

/// [`step_through`] on `gateways` gateways behind a balancer that spreads by `spread`
/// (and, on more than one, under a load swinging ten-fold every 10 minutes).
fn step_through_on(
    gateways: usize,
    spread: Spread,
    runs: u64,
    seed0: u64,
    population: &dyn Fn() -> Box<dyn FnMut(&mut Rng) -> u64>,
    behaviour: &dyn Fn(u64) -> sim::Behaviour,
) -> (u64, u64, u64) {
    let (mut promoted, mut rolled_back, mut killed) = (0, 0, 0);
    for i in 0..runs {
        let config = RolloutConfig::new("canary")
            .with_hold(S(20))
            .with_min_users(20)
            .with_alpha(ALPHA);
        let mut sim = Requests::new(seed0 + i, config, 100.0).on_gateways(gateways, spread);
        if gateways > 1 {
            // on several gateways, under a load swinging ten-fold as in the calibration
            sim = sim.with_swing(10.0, S(600));
        }
        let mut users = population();
        let mut behaviour = behaviour(seed0 + i);
        sim.run(S(30), &mut users, &mut behaviour);
        sim.start();
        sim.run(S(1800), &mut users, &mut behaviour);
        match sim.phase() {
            Phase::Promoted => {
                promoted += 1;
                // step by step (a shared outage pauses and resumes at the same weight)
                let mut weights: Vec<f64> = sim.transitions.iter().map(|t| t.weight).collect();
                weights.dedup();
                assert_eq!(weights, [1.0, 5.0, 10.0, 25.0, 50.0, 100.0], "run {i}");
            }
            Phase::RolledBack => {
                rolled_back += 1;
                let last = sim.transitions.last().expect("a transition");
                if matches!(last.reason, Reason::KillSwitch(_)) {
                    killed += 1;
                }
                eprintln!("run {i} rolled back: {:?}", last.reason);
            }
            other => panic!("run {i} neither promoted nor rolled back: {other}"),
        }
    }
    (promoted, rolled_back, killed)
}

#[test]
fn a_healthy_gray_steps_through_to_promoted() {
    let runs = 100;
    let (promoted, rolled_back, killed) =
        step_through(runs, 40_000, &|| Box::new(population(200, 0.1)), &|_| {
            Box::new(healthy)
        });
    eprintln!("healthy, 20 s holds: {promoted} of {runs} promoted, {rolled_back} rolled back");
    assert_eq!(killed, 0);
    assert!(
        rolled_back as f64 <= allowed(runs, ALPHA),
        "{rolled_back} rolled back"
    );
}

/// An outage of a shared dependency at a random moment of run `seed`, 20–60 s long,
/// failing 30–90 % of every request in both arms and slowing the rest five-fold.
fn shared_outage(seed: u64) -> sim::Behaviour {
    let mut rng = Rng::seeded(seed ^ 0xdead);
    let start = 100.0f64.mul_add(uniform(&mut rng), 30.0);
    let end = 40.0f64.mul_add(uniform(&mut rng), start + 20.0);
    let rate = 0.6f64.mul_add(uniform(&mut rng), 0.3);
    Box::new(move |req: Req, rng: &mut Rng| {
        let t = req.at.as_secs_f64();
        if (start..end).contains(&t) {
            let outcome = if bernoulli(rng, rate) {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            (outcome, baseline_latency(rng) * 5)
        } else {
            healthy(req, rng)
        }
    })
}

/// One user in gray from the first step (1 %) sends about 17 requests a second, all
/// failing: at 1 % that is 95 % of gray's requests. On `gateways` gateways, spread by
/// `spread`, over `runs` runs: (promoted, rolled back, by the kill switch).
fn heavy_failing_user(gateways: usize, spread: Spread, runs: u64, seed0: u64) -> (u64, u64, u64) {
    let heavy = sim::user_with_bucket_below(5_000_000, 100);
    step_through_on(
        gateways,
        spread,
        runs,
        seed0,
        &|| {
            let mut others = population(200, 0.1);
            // 1 in 6 of the 100 requests a second is his: about 17 a second
            Box::new(move |rng: &mut Rng| {
                if bernoulli(rng, 1.0 / 6.0) {
                    heavy
                } else {
                    others(rng)
                }
            })
        },
        &|_| {
            Box::new(move |req: Req, rng: &mut Rng| {
                if req.user == heavy {
                    // in gray from the start (baseline before it, at weight 0)
                    (Outcome::Error, baseline_latency(rng))
                } else {
                    healthy(req, rng)
                }
            })
        },
    )
}

/// On one gateway, and behind an L4 balancer spreading him over 3 or 10: every gateway
/// sees him fail, and the leader still counts one user (the union of the gateways' user
/// logs), not one per gateway.
#[test]
fn one_heavy_user_failing_every_request_in_gray_does_not_roll_back() {
    let runs = 100;
    for (gateways, spread, seed0) in [
        (1, Spread::RoundRobin, 60_000),
        (3, Spread::RoundRobin, 61_000),
        (10, Spread::Random, 62_000),
    ] {
        let (promoted, rolled_back, killed) = heavy_failing_user(gateways, spread, runs, seed0);
        eprintln!(
            "heavy failing user on {gateways} gateways ({spread:?}): {promoted} of {runs} \
             promoted, {rolled_back} rolled back"
        );
        assert_eq!(
            killed, 0,
            "{gateways} gateways: the kill switch needs several failing users"
        );
        assert!(
            rolled_back as f64 <= allowed(runs, ALPHA),
            "{gateways} gateways: {rolled_back} of {runs} rolled back"
        );
    }
}

/// A shared outage, on one gateway and seen by 3: both arms fail alike on each.
#[test]
fn a_shared_dependency_failing_both_arms_does_not_roll_back() {
    for (gateways, runs, seed0) in [(1, 100, 50_000), (3, 50, 51_000)] {
        let (promoted, rolled_back, killed) = step_through_on(
            gateways,
            Spread::Random,
            runs,
            seed0,
            &|| Box::new(population(200, 0.1)),
            &shared_outage,
        );
        eprintln!(
            "shared outage on {gateways} gateways: {promoted} of {runs} promoted, \
             {rolled_back} rolled back"
        );
        assert_eq!(killed, 0, "{gateways} gateways");
        assert!(
            rolled_back as f64 <= allowed(runs, ALPHA),
            "{gateways} gateways: {rolled_back} rolled back"
        );
    }
}

// === never promotes what it would catch ===

/// Runs `runs` rollouts of a gray whose every request fails twice as often as baseline's
/// (4 % against 2 %, about one request per user: twice the users with an error), through
/// the default steps with 4 s holds and `min_users` 20, at 100 rps; returns how many were
/// promoted.
fn promoted_twice_as_bad(runs: u64, seed0: u64, detect: Detect) -> u64 {
    let mut promoted = 0;
    for i in 0..runs {
        let config = RolloutConfig::new("canary")
            .with_hold(S(4))
            .with_min_users(20)
            .with_alpha(ALPHA)
            .with_detect(detect);
        let mut sim = Requests::new(seed0 + i, config, 100.0);
        let mut users = population(200, 0.1);
        let mut behaviour = |req: Req, rng: &mut Rng| {
            let rate = if req.arm == Arm::Gray { 0.04 } else { 0.02 };
            let outcome = if bernoulli(rng, rate) {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            (outcome, baseline_latency(rng))
        };
        sim.run(S(30), &mut users, &mut behaviour);
        sim.start();
        sim.run(S(3600), &mut users, &mut behaviour);
        match sim.phase() {
            Phase::Promoted => promoted += 1,
            Phase::RolledBack => {}
            other => panic!("run {i} neither promoted nor rolled back after an hour: {other}"),
        }
    }
    promoted
}

#[test]
fn a_gray_twice_as_bad_as_baseline_is_promoted_less_than_one_time_in_ten() {
    // The configured degradation is the default: twice baseline's rate (2 % of users more
    // when baseline is clean), to be caught with a power of 0.9 at every step.
    let runs = 200;
    let promoted = promoted_twice_as_bad(runs, 70_000, Detect::new());
    let (_, upper) = wilson(promoted, runs);
    // the same gray, steps advancing on their 4 s holds alone
    let blind = promoted_twice_as_bad(runs / 4, 80_000, Detect::new().with_power(0.0));
    eprintln!(
        "a gray 2x as bad (4 % against 2 %), 4 s holds: promoted {promoted} of {runs} \
         (95 % interval up to {upper:.3}); with steps on their holds alone: {blind} of {}",
        runs / 4
    );
    assert!(upper <= 0.1, "{promoted} of {runs} promoted");
    assert!(
        blind * 4 > promoted,
        "the power requirement changes nothing here"
    );
}

#[test]
fn a_shared_outage_pauses_the_rollout_and_no_step_advances_during_it() {
    // 4 s holds, no power requirement (so that only the outage stands between a hold and
    // the next step), 20 s of every request failing in both arms at a random moment.
    let runs = 100;
    for i in 0..runs {
        let config = RolloutConfig::new("canary")
            .with_steps([10.0, 25.0, 50.0, 100.0])
            .with_hold(S(4))
            .with_min_users(20)
            .with_alpha(ALPHA)
            .with_detect(Detect::new().with_power(0.0));
        let mut sim = Requests::new(90_000 + i, config, 100.0);
        let mut rng = Rng::seeded(90_000 + i);
        let start = 5.0f64.mul_add(uniform(&mut rng), 31.0);
        let end = start + 20.0;
        let mut users = population(200, 0.1);
        let mut behaviour = move |req: Req, rng: &mut Rng| {
            if (start..end).contains(&req.at.as_secs_f64()) {
                (Outcome::Error, baseline_latency(rng))
            } else {
                healthy(req, rng)
            }
        };
        sim.run(S(30), &mut users, &mut behaviour);
        sim.start();
        sim.run(S(300), &mut users, &mut behaviour);
        assert_eq!(
            sim.phase(),
            Phase::Promoted,
            "run {i}: {:?}",
            sim.transitions
        );
        let reasons: Vec<&str> = sim.transitions.iter().map(|t| t.reason.as_str()).collect();
        let paused = sim
            .transitions
            .iter()
            .find(|t| t.reason.as_str() == "outage");
        let paused = paused.unwrap_or_else(|| panic!("run {i}: no outage pause: {reasons:?}"));
        let at = paused.at.as_secs_f64();
        assert!(
            at >= start && at <= start + 2.0,
            "run {i}: outage at {start:.1} s, paused at {at:.1} s"
        );
        // nothing entered a new step from 1 s into the outage until the recovery
        let moved = sim.transitions.iter().find(|t| {
            let t_at = t.at.as_secs_f64();
            t.weight > t.from_weight && t_at > start + 1.0 && t_at <= end
        });
        assert!(
            moved.is_none(),
            "run {i}: advanced in the outage: {moved:?}"
        );
        let recovered = sim
            .transitions
            .iter()
            .find(|t| t.reason.as_str() == "recovered")
            .unwrap_or_else(|| panic!("run {i}: never recovered: {reasons:?}"));
        assert!(recovered.at.as_secs_f64() >= end, "run {i}");
    }
}
