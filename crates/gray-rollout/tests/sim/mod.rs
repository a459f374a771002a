//! Simulations of rollouts on a simulated clock with seeded randomness.
//!
//! Two levels:
//!
//! - [`Requests`]: request by request through a real [`Recorder`] (histograms, user sets,
//!   thresholds, reports) and a real [`Rollout`], users assigned to arms by the sticky
//!   hash of `gray-core`; for minutes of traffic;
//! - [`aggregate`]: counts per 5 s drawn from Poisson distributions and fed to a real
//!   [`Rollout`] as a report; for thousands of hours.

#![allow(dead_code)] // each test file uses a part

use std::time::Duration;

use gray_core::rand::Rng;
use gray_rollout::evidence::{Counters, EpochCounts, Pair, Report};
use gray_rollout::{
    Arm, Observation, Outcome, Phase, Recorder, Rollout, RolloutConfig, Transition,
};
use gray_rules::sticky_bucket;

// === random draws ===

/// Uniform in [0, 1).
pub(crate) fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// True with probability `p`.
pub(crate) fn bernoulli(rng: &mut Rng, p: f64) -> bool {
    uniform(rng) < p
}

/// A standard normal draw (Box–Muller).
pub(crate) fn normal(rng: &mut Rng) -> f64 {
    let u = 1.0 - uniform(rng); // (0, 1]
    let v = uniform(rng);
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A Poisson draw: multiplication below a mean of 10, else Hörmann's transformed
/// rejection with squeeze (PTRS, 1993), as numpy does.
pub(crate) fn poisson(rng: &mut Rng, lambda: f64) -> u64 {
    if lambda <= 0.0 {
        return 0;
    }
    if lambda < 10.0 {
        let limit = (-lambda).exp();
        let (mut k, mut p) = (0, 1.0);
        loop {
            p *= uniform(rng);
            if p <= limit {
                return k;
            }
            k += 1;
        }
    }
    let slam = lambda.sqrt();
    let loglam = lambda.ln();
    let b = 2.53f64.mul_add(slam, 0.931);
    let a = 0.02483f64.mul_add(b, -0.059);
    let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
    let vr = 0.9277 - 3.6224 / (b - 2.0);
    loop {
        let u = uniform(rng) - 0.5;
        let v = uniform(rng);
        let us = 0.5 - u.abs();
        let k = ((2.0 * a / us + b).mul_add(u, lambda) + 0.43).floor();
        if us >= 0.07 && v <= vr {
            return k as u64;
        }
        if k < 0.0 || (us < 0.013 && v > us) {
            continue;
        }
        if v.ln() + inv_alpha.ln() - (a / (us * us) + b).ln()
            <= -lambda + k * loglam - log_gamma(k + 1.0)
        {
            return k as u64;
        }
    }
}

/// ln Γ(x) for x ≥ 1 (Stirling's series after shifting x to 7 or more).
fn log_gamma(x: f64) -> f64 {
    const A: [f64; 10] = [
        8.333333333333333e-02,
        -2.777777777777778e-03,
        7.936507936507937e-04,
        -5.952380952380952e-04,
        8.417508417508418e-04,
        -1.917526917526918e-03,
        6.410_256_410_256_41e-3,
        -2.955065359477124e-02,
        1.796443723688307e-01,
        -1.39243221690590e+00,
    ];
    if x == 1.0 || x == 2.0 {
        return 0.0;
    }
    let n = if x < 7.0 { (7.0 - x).floor() } else { 0.0 };
    let mut x0 = x + n;
    let x2 = 1.0 / (x0 * x0);
    let mut gl0 = A[9];
    for a in A[..9].iter().rev() {
        gl0 = gl0 * x2 + a;
    }
    let mut gl = (x0 - 0.5).mul_add(
        x0.ln(),
        0.5f64.mul_add(std::f64::consts::TAU.ln(), gl0 / x0),
    ) - x0;
    for _ in 0..n as u32 {
        x0 -= 1.0;
        gl -= x0.ln();
    }
    gl
}

/// Quantile `q` of `values` (sorted in place).
pub(crate) fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

// === request by request ===

/// The sticky bucket of a user, as the gateway's sticky rule computes it.
pub(crate) fn bucket(user: u64) -> u32 {
    sticky_bucket(b"sim", &user.to_le_bytes())
}

/// Whether `user` is in gray at `weight` percent.
pub(crate) fn in_gray(user: u64, weight: f64) -> bool {
    f64::from(bucket(user)) < (weight * 100.0).round()
}

/// The first user id from `from` whose bucket is below `below`.
pub(crate) fn user_with_bucket_below(from: u64, below: u32) -> u64 {
    (from..).find(|u| bucket(*u) < below).expect("some user")
}

/// Baseline latency: log-normal, median 20 ms, σ 0.5 (p99 ≈ 64 ms).
pub(crate) fn baseline_latency(rng: &mut Rng) -> Duration {
    Duration::from_secs_f64(0.020 * (0.5 * normal(rng)).exp())
}

/// How a scenario answers a request: its outcome and latency.
pub(crate) type Behaviour = Box<dyn FnMut(Req, &mut Rng) -> (Outcome, Duration)>;

/// A request's context for a scenario's behaviour.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Req {
    /// Simulated time since the simulation began.
    pub(crate) at: Duration,
    /// The arm the sticky rule sent it to.
    pub(crate) arm: Arm,
    /// The user.
    pub(crate) user: u64,
}

/// How an L4 balancer in front of several gateways spreads requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spread {
    /// Request after request to the next gateway: a user's requests reach every one.
    RoundRobin,
    /// Each request to a gateway drawn at random.
    Random,
}

/// A request-level simulation: Poisson arrivals at `rps`, users from `population`,
/// arms by the sticky hash at the rollout's weight, outcomes from `behaviour`; on one
/// gateway, or on several (a recorder each) whose reports the leader reads at each look.
pub(crate) struct Requests {
    pub(crate) rng: Rng,
    pub(crate) rollout: Rollout,
    pub(crate) recorders: Vec<Recorder>,
    pub(crate) spread: Spread,
    next: usize,
    pub(crate) rps: f64,
    /// A daily-style swing of the load: peak ÷ trough, and the period.
    swing: Option<(f64, Duration)>,
    pub(crate) now: Duration,
    pub(crate) transitions: Vec<Transition>,
}

impl Requests {
    pub(crate) fn new(seed: u64, config: RolloutConfig, rps: f64) -> Self {
        Requests {
            rng: Rng::seeded(seed),
            rollout: Rollout::new(config).expect("valid config"),
            recorders: vec![Recorder::new(1)],
            spread: Spread::RoundRobin,
            next: 0,
            rps,
            swing: None,
            now: Duration::ZERO,
            transitions: Vec::new(),
        }
    }

    /// On `n` gateways behind a balancer that spreads requests by `spread`.
    pub(crate) fn on_gateways(mut self, n: usize, spread: Spread) -> Self {
        self.recorders = (1..=n.max(1) as u64).map(Recorder::new).collect();
        self.spread = spread;
        self
    }

    /// The load swings as a sine around `rps`, from 2·rps/(1 + swing) to
    /// 2·rps·swing/(1 + swing) (peak ÷ trough = `swing`) every `period`, as the days of
    /// the aggregated calibration do.
    pub(crate) fn with_swing(mut self, swing: f64, period: Duration) -> Self {
        self.swing = Some((swing, period));
        self
    }

    /// The mean arrivals per second at `at`.
    fn rate(&self, at: Duration) -> f64 {
        match self.swing {
            None => self.rps,
            Some((swing, period)) => {
                let phase = std::f64::consts::TAU * at.as_secs_f64() / period.as_secs_f64();
                self.rps * ((swing - 1.0) / (swing + 1.0)).mul_add(phase.sin(), 1.0)
            }
        }
    }

    /// The gateway the next request reaches (no draw with one gateway: one-gateway runs
    /// see the same randomness as before gateways existed).
    fn gateway(&mut self) -> usize {
        let n = self.recorders.len();
        if n == 1 {
            return 0;
        }
        match self.spread {
            Spread::RoundRobin => {
                self.next = (self.next + 1) % n;
                self.next
            }
            Spread::Random => self.rng.below(n as u64) as usize,
        }
    }

    /// Runs for `duration` (in slices of 100 ms; the leader observes and ticks every
    /// second), or until the rollout is rolled back or promoted.
    pub(crate) fn run(
        &mut self,
        duration: Duration,
        population: &mut dyn FnMut(&mut Rng) -> u64,
        behaviour: &mut dyn FnMut(Req, &mut Rng) -> (Outcome, Duration),
    ) {
        let end = self.now + duration;
        let slice = Duration::from_millis(100);
        while self.now < end {
            let weight = self.rollout.state().weight;
            let mean = self.rate(self.now) * slice.as_secs_f64();
            let n = poisson(&mut self.rng, mean);
            for _ in 0..n {
                let user = population(&mut self.rng);
                let arm = if in_gray(user, weight) {
                    Arm::Gray
                } else {
                    Arm::Baseline
                };
                let (outcome, latency) = behaviour(
                    Req {
                        at: self.now,
                        arm,
                        user,
                    },
                    &mut self.rng,
                );
                let gateway = self.gateway();
                self.recorders[gateway].record(&Observation::new(arm, user, outcome, latency));
            }
            self.now += slice;
            if self.now.as_millis().is_multiple_of(1000) && self.look() {
                return;
            }
        }
    }

    /// The leader's look: observe every gateway's report, tick, and every recorder
    /// follows. True when the rollout ended.
    pub(crate) fn look(&mut self) -> bool {
        let reports: Vec<_> = self.recorders.iter().map(Recorder::report).collect();
        if let Some(t) = self.rollout.observe_all(self.now, &reports) {
            self.transitions.push(t);
        }
        if let Some(t) = self.rollout.tick(self.now) {
            self.transitions.push(t);
        }
        // the state is saved at every look: each recorder forgets what it consumed
        let state = self.rollout.state();
        for recorder in &self.recorders {
            recorder.follow(&self.rollout.epoch_spec());
            recorder.acknowledge(state.users.cursor(recorder.source()));
        }
        matches!(state.phase, Phase::RolledBack | Phase::Promoted) && state.transitions > 0
    }

    pub(crate) fn start(&mut self) {
        let t = self.rollout.start(self.now).expect("start");
        self.transitions.push(t);
        for recorder in &self.recorders {
            recorder.follow(&self.rollout.epoch_spec());
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.rollout.state().phase
    }

    /// When the rollout was rolled back, if it was.
    pub(crate) fn rolled_back_at(&self) -> Option<Duration> {
        self.transitions
            .iter()
            .find(|t| t.to == Phase::RolledBack)
            .map(|t| t.at)
    }
}

/// A population: `heavy_share` of the requests come from `heavy` regular users, the
/// rest from a million occasional ones.
pub(crate) fn population(heavy: u64, heavy_share: f64) -> impl FnMut(&mut Rng) -> u64 {
    move |rng| {
        if bernoulli(rng, heavy_share) {
            rng.below(heavy)
        } else {
            1_000_000 + rng.below(1_000_000)
        }
    }
}

// === aggregated counts ===

/// The world of the calibration: both arms alike.
#[derive(Debug, Clone)]
pub(crate) struct World {
    /// Mean requests per second; the load follows a daily sine between
    /// 2·mean/(1 + swing) and 2·mean·swing/(1 + swing): peak ÷ trough = `swing`.
    pub(crate) mean_rps: f64,
    pub(crate) swing: f64,
    /// The error rate outside bursts.
    pub(crate) error_rate: f64,
    /// Bursts of a shared dependency: the mean time between their starts, and their
    /// length and error rate ranges.
    pub(crate) burst_every: Duration,
    pub(crate) burst_length: (Duration, Duration),
    pub(crate) burst_error_rate: (f64, f64),
    /// How much above the epoch's p99 and p50 a request lands, as the load moves away
    /// from the load when the epoch's thresholds were set.
    pub(crate) p99_base: f64,
    pub(crate) p50_base: f64,
}

/// What one aggregated calibration run saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Calibration {
    pub(crate) rollouts: u64,
    pub(crate) promoted: u64,
    pub(crate) rolled_back: u64,
    pub(crate) kill_switch: u64,
    pub(crate) hours: f64,
    pub(crate) steps_entered: u64,
    pub(crate) pauses: u64,
}

/// Runs back-to-back rollouts of a healthy gray for `hours` of simulated time, counts
/// every 5 s drawn per arm from Poisson distributions with the same rates (a new user
/// per bad event), reported cumulatively per epoch to a real [`Rollout`].
pub(crate) fn aggregate(
    seed: u64,
    world: &World,
    config: &RolloutConfig,
    hours: f64,
) -> Calibration {
    let mut rng = Rng::seeded(seed);
    let dt = 5.0;
    let end = hours * 3600.0;
    let day = 86_400.0;
    let phase0 = uniform(&mut rng) * day;
    // load factor between lo and hi, lo·swing = hi, mean 1
    let (lo, hi) = (
        2.0 / (1.0 + world.swing),
        2.0 * world.swing / (1.0 + world.swing),
    );
    let load = |t: f64| {
        let s = ((t + phase0) / day * std::f64::consts::TAU).sin();
        lo + (hi - lo) * (s + 1.0) / 2.0
    };

    let mut out = Calibration::default();
    let mut rollout = Rollout::new(config.clone()).expect("valid config");
    let mut now = 0.0f64;
    let at = |t: f64| Duration::from_millis((t * 1000.0) as u64);
    rollout.start(at(now)).expect("start");
    out.rollouts += 1;
    let mut epoch = rollout.state().epoch.index;
    let mut epoch_load = load(now);
    let mut cumulative = Counters::default();
    let mut burst_until = -1.0f64;
    let mut burst_rate = 0.0;

    while now < end {
        now += dt;
        let f = load(now);
        if now >= burst_until && bernoulli(&mut rng, dt / world.burst_every.as_secs_f64()) {
            let (a, b) = world.burst_length;
            burst_until = uniform(&mut rng).mul_add((b - a).as_secs_f64(), now + a.as_secs_f64());
            let (lo, hi) = world.burst_error_rate;
            burst_rate = uniform(&mut rng).mul_add(hi - lo, lo);
        }
        let error_rate = if now < burst_until {
            burst_rate
        } else {
            world.error_rate
        };
        let rel = f / epoch_load;
        let p99 = (world.p99_base * rel * rel).min(0.5);
        let p50 = (world.p50_base * rel.sqrt()).min(0.95);
        let w = rollout.state().weight / 100.0;
        for (arm, share) in [(Arm::Gray, w), (Arm::Baseline, 1.0 - w)] {
            let lambda = world.mean_rps * f * dt * share;
            // a Poisson stream of requests, each failing with `error_rate`: failed and
            // good requests are independent Poisson streams
            let errors = poisson(&mut rng, lambda * error_rate);
            let requests = errors + poisson(&mut rng, lambda * (1.0 - error_rate));
            let slow99 = poisson(&mut rng, lambda * p99);
            let slow50 = poisson(&mut rng, lambda * p50);
            let c = &mut cumulative;
            let (r, e) = (Pair::new(requests, 0), Pair::new(errors, 0));
            let add = |p: &mut Pair, v: Pair| {
                *p = if arm == Arm::Gray {
                    Pair::new(p.gray + v.gray, p.baseline)
                } else {
                    Pair::new(p.gray, p.baseline + v.gray)
                }
            };
            add(&mut c.requests, r);
            add(&mut c.errors, e);
            add(&mut c.bad_users.errors, e);
            add(&mut c.bad_users.latency_p99, Pair::new(slow99, 0));
            add(&mut c.bad_users.latency_p50, Pair::new(slow50, 0));
            if arm == Arm::Gray {
                c.gray_users += requests;
            }
        }
        let report = Report::new(1, vec![EpochCounts::new(epoch, cumulative)]);
        let mut ts: Vec<Transition> = rollout.observe(at(now), &report).into_iter().collect();
        ts.extend(rollout.tick(at(now)));
        for t in &ts {
            match t.to {
                Phase::Step => out.steps_entered += 1,
                Phase::Paused => out.pauses += 1,
                Phase::Promoted => out.promoted += 1,
                Phase::RolledBack => {
                    out.rolled_back += 1;
                    if t.reason.as_str() == "kill_switch" {
                        out.kill_switch += 1;
                    }
                }
                _ => {}
            }
        }
        if matches!(rollout.state().phase, Phase::Promoted | Phase::RolledBack) && now < end {
            rollout.start(at(now)).expect("start again");
            out.rollouts += 1;
        }
        if rollout.state().epoch.index != epoch {
            epoch = rollout.state().epoch.index;
            epoch_load = f;
            cumulative = Counters::default();
        }
    }
    // the rollout still running at the end is not counted as finished
    out.rollouts = out.promoted + out.rolled_back;
    out.hours = hours;
    out
}

/// Seconds from a fault to the rollback, with counts drawn per second: a rollout held at
/// its first step with `rps` requests a second, every request a new user failing with
/// `error_rate` (both arms), and gray failing with `fault_rate` from `fault_after` on.
/// `None` when not rolled back within `give_up`.
pub(crate) fn aggregate_detection(
    seed: u64,
    config: &RolloutConfig,
    rps: f64,
    error_rate: f64,
    fault_rate: f64,
    fault_after: Duration,
    give_up: Duration,
) -> Option<f64> {
    let mut rng = Rng::seeded(seed);
    let mut rollout = Rollout::new(config.clone()).expect("valid config");
    rollout.start(Duration::ZERO).expect("start");
    let epoch = rollout.state().epoch.index;
    let w = rollout.state().weight / 100.0;
    let mut c = Counters::default();
    let fault_after = fault_after.as_secs();
    for s in 1..=fault_after + give_up.as_secs() {
        let gray_rate = if s > fault_after {
            fault_rate
        } else {
            error_rate
        };
        for (arm, share, rate) in [
            (Arm::Gray, w, gray_rate),
            (Arm::Baseline, 1.0 - w, error_rate),
        ] {
            let errors = poisson(&mut rng, rps * share * rate);
            let requests = errors + poisson(&mut rng, rps * share * (1.0 - rate));
            if arm == Arm::Gray {
                c.requests.gray += requests;
                c.errors.gray += errors;
                c.bad_users.errors.gray += errors;
                c.gray_users += requests;
            } else {
                c.requests.baseline += requests;
                c.errors.baseline += errors;
                c.bad_users.errors.baseline += errors;
            }
        }
        let now = Duration::from_secs(s);
        let report = Report::new(1, vec![EpochCounts::new(epoch, c)]);
        if let Some(t) = rollout.observe(now, &report) {
            assert_eq!(t.to, Phase::RolledBack);
            return Some(s as f64 - fault_after as f64);
        }
        rollout.tick(now);
    }
    None
}
