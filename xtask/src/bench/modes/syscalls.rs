//! `--syscalls`: system calls and context switches per request, each target measured alone
//! while the others idle.
//!
//! The targets start normally and are checked and warmed up; then, for each target in turn,
//! `perf stat -e 'syscalls:sys_enter_*'` (or `strace -c -f` where tracepoints are not
//! available, which slows the target: then only the counts mean something) attaches to the
//! processes that serve its requests (nginx: the worker), the bench reads
//! `voluntary/nonvoluntary_ctxt_switches` of each of their threads (and the upstreams'
//! voluntary ones: how often the target woke them) in /proc, runs
//! `SYS_DURATION` seconds of wrk, waits a second for the closed connections, and divides by
//! the requests. A voluntary switch is the target blocking (in `epoll_wait` or a futex) and
//! being woken again; an involuntary one is a preemption.

use std::{
    ffi::OsString,
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use super::Mode;
use crate::bench::{
    Result,
    harness::{Bench, UPSTREAMS},
    procfs,
    report::{Tally, label_width, load_average},
    step,
    tools::{self, Tool},
};

/// The tracer's process name.
const TRACER: &str = "tracer";

/// System calls and context switches per request (`--syscalls`).
#[derive(Debug)]
pub(crate) struct Syscalls;

/// What counts the system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tracer {
    Perf,
    Strace,
}

impl Tracer {
    /// perf when its syscall tracepoints can be read here, else strace.
    fn choose() -> Self {
        let perf_works = tools::find("perf").is_some_and(|perf| {
            Command::new(perf)
                .args(["stat", "-e", "syscalls:sys_enter_read", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if perf_works {
            Tracer::Perf
        } else {
            Tracer::Strace
        }
    }

    fn name(self) -> &'static str {
        match self {
            Tracer::Perf => "perf",
            Tracer::Strace => "strace",
        }
    }
}

impl Mode for Syscalls {
    fn flag(&self) -> Option<&'static str> {
        Some("--syscalls")
    }

    fn about(&self) -> &'static str {
        "system calls per request (perf's syscalls:sys_enter_* tracepoints, or\n\
         `strace -c -f` where tracepoints are not available) and context switches\n\
         per request (voluntary: the target blocked and had to be woken; involuntary:\n\
         preempted), each target measured alone while the others idle"
    }

    fn tools(&self) -> Vec<Tool> {
        match Tracer::choose() {
            Tracer::Perf => Vec::new(),
            Tracer::Strace => vec![Tool {
                command: "strace",
                package: "strace",
            }],
        }
    }

    fn run(&self, bench: &mut Bench<'_>) -> Result<()> {
        let s = bench.settings;
        let tracer = Tracer::choose();
        bench.start_all()?;
        step(&format!(
            "system calls with {}, {}s per target, one target at a time",
            tracer.name(),
            s.sys_duration
        ));
        let mut rows = Vec::new();
        for i in 0..bench.targets.len() {
            let label = bench.targets[i].label.clone();
            let pids = bench.serving_pids(i)?;
            let out = bench.dir.join(format!("{label}.syscalls.txt"));
            let pid_list: Vec<String> = pids.iter().map(u32::to_string).collect();
            let (program, args): (&str, Vec<OsString>) = match tracer {
                // perf counts the pids for as long as its own command runs: the second before
                // the load, the load, and the second after it.
                Tracer::Perf => (
                    "perf",
                    [
                        "stat",
                        "-x,",
                        "-e",
                        "syscalls:sys_enter_*",
                        "-o",
                        &out.display().to_string(),
                        "-p",
                        &pid_list.join(","),
                        "--",
                        "sleep",
                        &(s.sys_duration + 2).to_string(),
                    ]
                    .map(OsString::from)
                    .to_vec(),
                ),
                Tracer::Strace => {
                    let mut args: Vec<OsString> = ["-c", "-f", "-o", &out.display().to_string()]
                        .map(OsString::from)
                        .to_vec();
                    for pid in &pid_list {
                        args.extend(["-p".into(), pid.into()]);
                    }
                    ("strace", args)
                }
            };
            let program = tools::find(program).ok_or_else(|| format!("{program} is missing"))?;
            bench
                .procs
                .start(TRACER, s.load_cpu, &program, &args, &[])?;
            // Let the tracer attach to every thread before the load starts.
            thread::sleep(Duration::from_secs(1));
            bench.procs.alive(TRACER, &format!("early for {label}"))?;
            let upstreams = [bench.procs.pid(UPSTREAMS)?];
            let (before, peers_before) = (
                procfs::ctxt_switches(&pids),
                procfs::ctxt_switches(&upstreams),
            );
            let wrk = bench.load(i, s.sys_duration)?;
            // Let the target finish with the connections wrk closed.
            thread::sleep(Duration::from_secs(1));
            let (after, peers_after) = (
                procfs::ctxt_switches(&pids),
                procfs::ctxt_switches(&upstreams),
            );
            match tracer {
                Tracer::Perf => {
                    let status = bench.procs.wait(TRACER, Duration::from_secs(30))?;
                    if !status.success() {
                        return Err(format!(
                            "perf stat failed for {label} ({status}):\n{}",
                            bench.procs.tail(TRACER)
                        ));
                    }
                }
                // strace detaches and prints its summary on SIGTERM.
                Tracer::Strace => bench.procs.stop(TRACER),
            }
            bench.alive("during the measured run", &[i])?;
            let counts = read_counts(&out, tracer)?;
            let requests = wrk.requests_of(&label)?;
            println!("  {label:<16} {requests} requests");
            rows.push(Row {
                requests,
                counts,
                voluntary: after.0.saturating_sub(before.0),
                nonvoluntary: after.1.saturating_sub(before.1),
                upstream_wakeups: peers_after.0.saturating_sub(peers_before.0),
            });
        }
        step(&format!(
            "system calls and context switches per request ({}; load: {})",
            tracer.name(),
            load_average()
        ));
        print_results(bench, tracer, &rows);
        Ok(())
    }
}

/// One target's measured run.
#[derive(Debug)]
struct Row {
    requests: u64,
    counts: Tally,
    voluntary: u64,
    nonvoluntary: u64,
    /// The upstreams' voluntary context switches: each is an upstream that waited for the
    /// target and was woken by it.
    upstream_wakeups: u64,
}

fn read_counts(out: &Path, tracer: Tracer) -> Result<Tally> {
    let text = fs::read_to_string(out).unwrap_or_default();
    if text.trim().is_empty() {
        return Err(format!(
            "no output from {} in {}",
            tracer.name(),
            out.display()
        ));
    }
    Ok(match tracer {
        Tracer::Perf => perf_counts(&text),
        Tracer::Strace => strace_counts(&text),
    })
}

/// System calls by name from `perf stat -x,` output: `count,unit,syscalls:sys_enter_NAME,...`.
fn perf_counts(text: &str) -> Tally {
    let mut counts = Tally::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.trim().split(',').collect();
        if fields.len() > 2
            && let (Some(name), Ok(n)) = (
                fields[2].strip_prefix("syscalls:sys_enter_"),
                fields[0].parse::<u64>(),
            )
        {
            counts.add(name, n);
        }
    }
    counts
}

/// System calls by name from `strace -c` output: `% time, seconds, usecs/call, calls,
/// [errors,] syscall`.
fn strace_counts(text: &str) -> Tally {
    let mut counts = Tally::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 5
            && fields[fields.len() - 1] != "total"
            && let Ok(n) = fields[3].parse::<u64>()
        {
            counts.add(fields[fields.len() - 1], n);
        }
    }
    counts
}

fn print_results(bench: &Bench<'_>, tracer: Tracer, rows: &[Row]) {
    let s = bench.settings;
    let labels = bench.labels();
    let refs = bench.reference_columns();
    let w = label_width(labels.iter().copied());
    let per_request = |row: &Row| row.counts.total() as f64 / row.requests as f64;

    let mut header = format!(
        "{:>w$}  {:>9}  {:>12}",
        "target", "requests", "syscalls/req"
    );
    for (_, r) in &refs {
        header += &format!("  {:>9}", format!("÷ {r}"));
    }
    header += &format!(
        "  {:>10}  {:>9}  {:>9}  {:>17}",
        "ctx sw/req", "voluntary", "involunt.", "upstream wakeups"
    );
    println!("{header}");
    for (label, row) in labels.iter().zip(rows) {
        let per = per_request(row);
        let mut line = format!("{label:>w$}  {:>9}  {per:>12.2}", row.requests);
        for &(r, _) in &refs {
            let reference = per_request(&rows[r]);
            let ratio = if reference == 0.0 {
                0.0
            } else {
                per / reference
            };
            line += &format!("  {ratio:>9.3}");
        }
        let requests = row.requests as f64;
        line += &format!(
            "  {:>10.3}  {:>9.3}  {:>9.3}  {:>17.3}",
            (row.voluntary + row.nonvoluntary) as f64 / requests,
            row.voluntary as f64 / requests,
            row.nonvoluntary as f64 / requests,
            row.upstream_wakeups as f64 / requests
        );
        println!("{line}");
    }
    println!();
    for (label, row) in labels.iter().zip(rows) {
        let top: Vec<String> = row
            .counts
            .most_common(s.sys_top)
            .into_iter()
            .map(|(name, n)| format!("{name} {:.2}", n as f64 / row.requests as f64))
            .collect();
        println!("{label}: {}", top.join(", "));
    }
    println!();
    println!(
        "Per request: system calls entered by the target's processes (nginx: its worker) during"
    );
    println!("the measured wrk run and the second after it; context switches of all their threads");
    println!(
        "(/proc/<pid>/task/*/status). A voluntary switch is the target blocking (in epoll_wait"
    );
    println!("or a futex) and being woken again. Upstream wakeups: the upstreams' voluntary");
    println!(
        "switches over the same time, each an upstream that waited and was woken by the target"
    );
    println!("(a target that sends to the upstreams together wakes them less often).");
    if tracer == Tracer::Strace {
        println!(
            "strace stops the target at every system call: these counts are right, its speed is not."
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_perf_stat_csv() {
        let text = "# started on Mon Dec  1 19:00:00 2026\n\n\
                    120034,,syscalls:sys_enter_read,5001234,100.00,,\n\
                    <not counted>,,syscalls:sys_enter_openat,0,100.00,,\n\
                    118000,,syscalls:sys_enter_write,5001234,100.00,,\n\
                    0,,syscalls:sys_enter_epoll_wait,5001234,100.00,,\n";
        let counts = perf_counts(text);
        assert_eq!(
            counts.most_common(5),
            [("read", 120034), ("write", 118000), ("epoll_wait", 0)]
        );
    }

    #[test]
    fn reads_strace_summary() {
        let text = "% time     seconds  usecs/call     calls    errors syscall\n\
                    ------ ----------- ----------- --------- --------- ----------------\n \
                    55.10    0.551000           4    120034           recvfrom\n \
                    44.90    0.449000           3    118000        12 sendto\n\
                    ------ ----------- ----------- --------- --------- ----------------\n\
                    100.00    1.000000                238034        12 total\n";
        let counts = strace_counts(text);
        assert_eq!(
            counts.most_common(5),
            [("recvfrom", 120034), ("sendto", 118000)]
        );
    }
}
