//! Copies only while the gateway has time for them: every [`SAMPLE_EVERY`], a sampler on
//! the runtime that serves the users' requests reads how much of that time the worker
//! thread it runs on wanted the CPU (the time it ran, and the time it waited, runnable,
//! for a CPU to run on: Linux's `/proc/thread-self/schedstat`), and while that share
//! (averaged over about three samples) is over `mirror_max_busy`, the mirrors make no
//! copies: each one declined is counted `dropped_busy`. On a multi-thread runtime the
//! sampler reads the worker it happens to run on, each against its own last reading; on
//! the current-thread runtime the binary runs with `workers = 1`, it reads the one thread
//! that serves every user. Where there is no `/proc` (not Linux), copies are never shed.
//!
//! The copies' thread runs at the lowest priority, but that alone does not keep copies
//! off a busy gateway's back: a copy is first a clone of the request's head and a
//! hand-over on the users' thread, and the copies' work (theirs, the kernel's for their
//! sockets, their caches) shares the machine with the users' requests even when it gets
//! only idle time. Measured on two cores with the users' thread busy about 85 % of its
//! time, copying every request cost the users about 10 % of their throughput and 20 % of
//! their p99, with the copies' thread at nice 19 or at SCHED_IDLE alike
//! (docs/performance.md).
//!
//! The time waited counts with the time run: work that takes the CPU from under the
//! users' thread makes it run a smaller share of its time, not a larger one. tokio's own
//! busy time would not do either: it counts the time workers poll tasks, not the time they
//! spend in the I/O driver, a good part of a proxy's work (tokio said 75 % where the
//! thread ran 85 %).

use std::{collections::HashMap, sync::Weak, time::Duration};

use gray_tower::mirror::Shed;
use tokio::time::Instant;

/// How often the users' share of the CPU is read.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The weight of the newest sample in the share that is judged (an exponential average
/// over about three samples): a load that hovers at the limit does not turn copies on and
/// off every sample.
const SMOOTHING: f64 = 0.4;

/// Turns `shed` on while the worker threads of the current runtime (the users') want the
/// CPU more than `max_busy` of their time (a share; 1 or more: never), until `alive` is
/// gone (the copies' thread).
pub(crate) fn when_busy(shed: Shed, max_busy: f64, alive: Weak<()>) {
    if max_busy < 1.0 && demand().is_some() {
        tokio::spawn(sample(shed, max_busy, alive));
    }
}

/// The calling thread's id, and the time it ran or waited to run, in nanoseconds (the
/// first two fields of `/proc/thread-self/schedstat`).
fn demand() -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut fields = stat.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(ran)), Some(Ok(waited))) = (fields.next(), fields.next()) else {
        return None;
    };
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    Some((tid, ran.saturating_add(waited)))
}

/// Samples until `alive` is gone.
async fn sample(shed: Shed, max_busy: f64, alive: Weak<()>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each worker's last reading (a multi-thread runtime moves the sampler between them).
    let mut last: HashMap<i32, (Instant, u64)> = HashMap::new();
    let mut smoothed: Option<f64> = None;
    loop {
        tick.tick().await;
        if alive.strong_count() == 0 {
            return;
        }
        let Some((tid, wanted)) = demand() else {
            continue;
        };
        let now = Instant::now();
        if let Some((then, before)) = last.insert(tid, (now, wanted)) {
            let wall = now.duration_since(then).as_secs_f64();
            if wall > 0.0 {
                let share = wanted.saturating_sub(before) as f64 / 1e9 / wall;
                let share = smoothed.map_or(share, |s| SMOOTHING.mul_add(share - s, s));
                smoothed = Some(share);
                shed.set(share > max_busy);
            }
        }
    }
}
