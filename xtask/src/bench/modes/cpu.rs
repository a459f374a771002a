//! The default mode: CPU time per request, over `ROUNDS` interleaved rounds.
//!
//! CPU per request is the target's user + system CPU time (all its threads; nginx: master
//! and workers, from `/proc/<pid>/stat`) over the requests wrk completed. On a shared 2-core
//! VM throughput tracks the share of `PROXY_CPU` the target got rather than its cost, and
//! the load side (wrk plus an upstream, about 14 µs per request) costs about what nginx
//! does, so `LOAD_CPU` is often saturated too: CPU per request is the figure that separates
//! the targets, and the table says which rounds were shared or load-bound (from the busy
//! time of both CPUs in `/proc/stat`). Every other round runs the targets in the reverse
//! order. Ratios are taken within each round, then the median (min–max) across rounds.

use std::time::Instant;

use super::Mode;
use crate::bench::{
    Result,
    harness::Bench,
    procfs,
    report::{label_width, load_average, median, spread},
    step,
    wrk::Summary,
};

/// CPU time per request (the default mode).
#[derive(Debug)]
pub(crate) struct Cpu;

impl Mode for Cpu {
    fn flag(&self) -> Option<&'static str> {
        None
    }

    fn about(&self) -> &'static str {
        "ROUNDS interleaved fixed-duration wrk rounds; CPU time per request of each\n\
         target (from /proc; user and system), throughput, and ratios to REFS\n\
         within each round"
    }

    fn run(&self, bench: &mut Bench<'_>) -> Result<()> {
        let s = bench.settings;
        let clock_ticks = procfs::clock_ticks()?;
        bench.start_all()?;
        step(&format!(
            "{} rounds × {}s per target, interleaved, every other round reversed (wrk -t1 -c{} on CPU {}; half the requests gray)",
            s.rounds, s.duration, s.connections, s.load_cpu
        ));
        let all: Vec<usize> = (0..bench.targets.len()).collect();
        let mut rounds: Vec<Vec<Sample>> = Vec::new();
        for round in 1..=s.rounds {
            // Every other round in the reverse order (A B, B A, ...): a drift in the
            // machine's speed during a round weighs on every target alike.
            let order: Vec<usize> = match round % 2 {
                1 => all.clone(),
                _ => all.iter().rev().copied().collect(),
            };
            let mut samples: Vec<Option<Sample>> = (0..all.len()).map(|_| None).collect();
            for &i in &order {
                let before = Snapshot::take(bench, i)?;
                let wrk = bench.load(i, s.duration)?;
                let after = Snapshot::take(bench, i)?;
                samples[i] = Some(Sample::new(wrk, &before, &after, clock_ticks));
                let when = format!("during round {round} (against {})", bench.targets[i].label);
                bench.alive(&when, &all)?;
            }
            rounds.push(samples.into_iter().flatten().collect());
            println!(
                "  round {round}/{} done (load: {})",
                s.rounds,
                load_average()
            );
        }
        step(&format!("results (load: {})", load_average()));
        print_results(bench, &rounds)
    }
}

/// The counters read before and after a round.
#[derive(Debug)]
struct Snapshot {
    /// The target's ticks: (user + system, user).
    target: (u64, u64),
    /// `PROXY_CPU`'s and `LOAD_CPU`'s ticks: (busy, total).
    proxy: (u64, u64),
    load: (u64, u64),
    at: Instant,
}

impl Snapshot {
    fn take(bench: &Bench<'_>, i: usize) -> Result<Self> {
        Ok(Snapshot {
            target: procfs::process_ticks(&bench.cpu_pids(i)?),
            proxy: procfs::cpu_ticks(bench.settings.proxy_cpu)?,
            load: procfs::cpu_ticks(bench.settings.load_cpu)?,
            at: Instant::now(),
        })
    }
}

/// One round against one target.
#[derive(Debug)]
struct Sample {
    wrk: Summary,
    /// The target's CPU, % of one CPU.
    target_cpu: f64,
    /// CPU µs per request, all and user.
    cpu_us: f64,
    user_us: f64,
    /// How busy `PROXY_CPU` and `LOAD_CPU` were, %.
    proxy_busy: f64,
    load_busy: f64,
}

impl Sample {
    fn new(wrk: Summary, before: &Snapshot, after: &Snapshot, clock_ticks: u64) -> Self {
        let seconds = |ticks: u64| ticks as f64 / clock_ticks as f64;
        let ticks = after.target.0.saturating_sub(before.target.0);
        let user = after.target.1.saturating_sub(before.target.1);
        let wall = after.at.duration_since(before.at).as_secs_f64();
        let per_request = |ticks: u64| match wrk.requests {
            0 => 0.0,
            n => 1e6 * seconds(ticks) / n as f64,
        };
        let busy = |b: (u64, u64), a: (u64, u64)| {
            let (busy, total) = (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1));
            if total == 0 {
                0.0
            } else {
                100.0 * busy as f64 / total as f64
            }
        };
        Sample {
            wrk,
            target_cpu: 100.0 * seconds(ticks) / wall,
            cpu_us: per_request(ticks),
            user_us: per_request(user),
            proxy_busy: busy(before.proxy, after.proxy),
            load_busy: busy(before.load, after.load),
        }
    }
}

fn print_results(bench: &Bench<'_>, rounds: &[Vec<Sample>]) -> Result<()> {
    let s = bench.settings;
    let labels = bench.labels();
    let refs = bench.reference_columns();
    let w = label_width(labels.iter().copied());
    let n = rounds.len();

    println!(
        "Per round: req/s, p50/p99 ms; target process CPU % / all of CPU {} % / all of CPU {} % \
         / target CPU µs per request (user + system)",
        s.proxy_cpu, s.load_cpu
    );
    for (r, samples) in rounds.iter().enumerate() {
        println!("round {}", r + 1);
        for (label, f) in labels.iter().zip(samples) {
            println!(
                "  {label:>w$}  {:>7.0} req/s  {:.2}/{:.2} ms  {:>3.0}/{:>3.0}/{:>3.0} %  {:>5.1} µs ({:.1} + {:.1})",
                f.wrk.rps(),
                f.wrk.p50_us as f64 / 1000.0,
                f.wrk.p99_us as f64 / 1000.0,
                f.target_cpu,
                f.proxy_busy,
                f.load_busy,
                f.cpu_us,
                f.user_us,
                f.cpu_us - f.user_us
            );
        }
    }

    let (mut shared, mut load_bound) = (Vec::new(), Vec::new());
    for (r, samples) in rounds.iter().enumerate() {
        for (label, f) in labels.iter().zip(samples) {
            if f.target_cpu < 85.0 && f.proxy_busy > 95.0 {
                shared.push(format!("round {} {label} ({:.0}%)", r + 1, f.target_cpu));
            } else if f.target_cpu < 85.0 && f.load_busy > 95.0 {
                load_bound.push(format!("round {} {label}", r + 1));
            }
        }
    }
    let both: Vec<String> = labels
        .iter()
        .enumerate()
        .filter_map(|(i, label)| {
            let rounds = rounds
                .iter()
                .filter(|samples| samples[i].target_cpu >= 85.0 && samples[i].load_busy > 95.0)
                .count();
            (rounds > 0).then(|| format!("{label} in {rounds}/{n} rounds"))
        })
        .collect();
    println!();
    if !both.is_empty() {
        println!(
            "note: CPU {} (wrk and upstreams) was saturated too, throughput may be capped by the \
             load side, compare CPU per request: {}",
            s.load_cpu,
            both.join(", ")
        );
    }
    if !shared.is_empty() {
        println!(
            "note: other processes shared CPU {} with the target, figures are noisy: {}",
            s.proxy_cpu,
            shared.join(", ")
        );
    }
    if !load_bound.is_empty() {
        println!(
            "note: CPU {} (wrk, upstreams and anything else there) was saturated while the \
             target was not, figures are not the target's: {}",
            s.load_cpu,
            load_bound.join(", ")
        );
    }

    println!();
    println!(
        "Median (min–max) across rounds; ratios are taken within each round; user and sys: medians."
    );
    let mut header = format!(
        "{:>w$}  {:>22}  {:>19}  {:>5}  {:>5}",
        "target", "req/s", "CPU µs/request", "user", "sys"
    );
    for (_, r) in &refs {
        header += &format!("  {:>21}", format!("CPU ÷ {r}"));
    }
    for (_, r) in &refs {
        header += &format!("  {:>21}", format!("req/s ÷ {r}"));
    }
    println!("{header}");
    for (i, label) in labels.iter().enumerate() {
        let of = |field: fn(&Sample) -> f64| -> Vec<f64> {
            rounds.iter().map(|s| field(&s[i])).collect()
        };
        let mut line = format!(
            "{label:>w$}  {:>22}  {:>19}  {:>5.1}  {:>5.1}",
            spread(&of(|f| f.wrk.rps()), 0),
            spread(&of(|f| f.cpu_us), 1),
            median(&of(|f| f.user_us)),
            median(&of(|f| f.cpu_us - f.user_us)),
        );
        for &(r, _) in &refs {
            let cost: Vec<f64> = rounds
                .iter()
                .filter(|s| s[r].cpu_us != 0.0)
                .map(|s| s[i].cpu_us / s[r].cpu_us)
                .collect();
            let cell = if cost.is_empty() {
                "-".into()
            } else {
                spread(&cost, 3)
            };
            line += &format!("  {cell:>21}");
        }
        for &(r, _) in &refs {
            let ratio: Vec<f64> = rounds
                .iter()
                .map(|s| s[i].wrk.rps() / s[r].wrk.rps())
                .collect();
            line += &format!("  {:>21}", spread(&ratio, 3));
        }
        println!("{line}");
    }

    let mut bad = Vec::new();
    for (r, samples) in rounds.iter().enumerate() {
        for (label, f) in labels.iter().zip(samples) {
            let errors = f.wrk.errors();
            if !errors.is_empty() {
                let errors: Vec<String> = errors.iter().map(|(k, v)| format!("{k}={v}")).collect();
                bad.push(format!("round {}, {label}: {}", r + 1, errors.join(", ")));
            }
        }
    }
    println!();
    if !bad.is_empty() {
        println!("FAILED: targets answered errors:\n  {}", bad.join("\n  "));
        return Err(format!("targets answered errors: {}", bad.join("; ")));
    }
    println!("non-2xx responses and socket errors: 0 in every round");
    Ok(())
}
