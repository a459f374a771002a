//! `--instructions`: each target alone under valgrind's callgrind, user-space instructions
//! per request.
//!
//! For each target in turn (only one runs at a time): start it under
//! `valgrind --tool=callgrind` (nginx with `master_process off`, so that its one process is
//! the one counted), check its routing, warm it up for `INS_WARMUP` seconds, zero the
//! counters (`callgrind_control -z`), run `INS_DURATION` seconds of wrk, dump
//! (`callgrind_control -d`), stop it, and divide the dump's instructions (Ir) by the
//! requests wrk completed. The count is deterministic enough to compare targets on a noisy
//! machine, but it is user-space only (the kernel's share, about 60% of each target's time
//! here, is not counted), valgrind runs a process's threads one at a time, and the requests
//! in flight when wrk stops (at most `CONNECTIONS`) are in the instructions but not in the
//! requests. Rust targets built with line tables (`PROFILE=profiling`) are also broken down
//! by crate.

use std::{
    ffi::OsString,
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::{
    Mode,
    callgrind::{self, Profile},
};
use crate::bench::{
    Result,
    harness::Bench,
    report::{label_width, load_average},
    step,
    tools::Tool,
};

/// User-space instructions per request (`--instructions`).
#[derive(Debug)]
pub(crate) struct Instructions;

impl Mode for Instructions {
    fn flag(&self) -> Option<&'static str> {
        Some("--instructions")
    }

    fn about(&self) -> &'static str {
        "each target alone under valgrind's callgrind: user-space instructions per\n\
         request, its top functions and, for Rust targets built with line tables\n\
         (PROFILE=profiling), instructions per crate"
    }

    fn tools(&self) -> Vec<Tool> {
        ["valgrind", "callgrind_control"]
            .into_iter()
            .map(|command| Tool {
                command,
                package: "valgrind",
            })
            .collect()
    }

    fn one_process(&self) -> bool {
        true
    }

    fn slow_targets(&self) -> bool {
        true
    }

    fn run(&self, bench: &mut Bench<'_>) -> Result<()> {
        let s = bench.settings;
        let mut rows = Vec::new();
        for i in 0..bench.targets.len() {
            let label = bench.targets[i].label.clone();
            let out = bench.dir.join(format!("{label}.cg.%p"));
            let mut wrapper: Vec<OsString> = vec![
                "valgrind".into(),
                "--tool=callgrind".into(),
                format!("--callgrind-out-file={}", out.display()).into(),
            ];
            if s.ins_cache_sim {
                wrapper.push("--cache-sim=yes".into());
            }
            let pid = bench.start_target(i, &wrapper)?;
            bench.wait_target(i)?;
            bench.alive("after startup", &[])?;
            step(&format!(
                "{label}: routing checks (20 requests per lane), {}s warm-up, {}s measured",
                s.ins_warmup, s.ins_duration
            ));
            bench.check_target(i)?;
            if s.ins_warmup > 0 {
                bench.load(i, s.ins_warmup)?;
            }
            bench.alive("during the warm-up", &[i])?;
            control(&bench.dir, &label, pid, "-z")?;
            let wrk = bench.load(i, s.ins_duration)?;
            // Let the target finish with the connections wrk closed, so that each target's
            // count includes them.
            thread::sleep(Duration::from_secs(1));
            bench.alive("during the measured run", &[i])?;
            control(&bench.dir, &label, pid, "-d")?;
            // The dump asked for is part 1; the one callgrind writes at exit (no suffix) is
            // not used.
            let dump = bench.dir.join(format!("{label}.cg.{pid}.1"));
            wait_for_dump(&dump, &label)?;
            bench.stop_target(i);
            let requests = wrk.requests_of(&label)?;
            println!("  {label}: {requests} requests");
            rows.push((requests, callgrind::read(&dump)?));
        }
        step(&format!(
            "user-space instructions per request (callgrind; load: {})",
            load_average()
        ));
        print_results(bench, &rows);
        Ok(())
    }
}

/// With `INS_CACHE_SIM=1`: the simulated caches' references and misses per request.
fn print_cache(labels: &[&str], rows: &[(u64, Profile)], w: usize) {
    // (column, the events it adds up)
    const COLUMNS: [(&str, &[&str]); 5] = [
        ("data refs", &["Dr", "Dw"]),
        ("D1 misses", &["D1mr", "D1mw"]),
        ("LL data misses", &["DLmr", "DLmw"]),
        ("I1 misses", &["I1mr"]),
        ("LL instr misses", &["ILmr"]),
    ];
    println!(
        "\nSimulated caches (callgrind --cache-sim=yes: this machine's cache sizes, no prefetch), per request:"
    );
    let mut header = format!("{:>w$}", "target");
    for (name, _) in COLUMNS {
        header += &format!("  {name:>15}");
    }
    println!("{header}");
    for (label, (requests, profile)) in labels.iter().zip(rows) {
        let mut line = format!("{label:>w$}");
        for (_, events) in COLUMNS {
            let sum: u64 = profile
                .events
                .iter()
                .filter(|(name, _)| events.contains(&name.as_str()))
                .map(|(_, n)| n)
                .sum();
            line += &format!("  {:>15.1}", sum as f64 / (*requests).max(1) as f64);
        }
        println!("{line}");
    }
}

/// Sends `callgrind_control <command>` (`-z` zeroes, `-d` dumps) to the target's process; it
/// answers "OK." when done.
fn control(dir: &Path, label: &str, pid: u32, command: &str) -> Result<()> {
    let output = Command::new("callgrind_control")
        .args([command, &pid.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = fs::write(dir.join(format!("{label}.callgrind_control.log")), &text);
    if text.contains("OK.") && !text.lines().any(|l| l.starts_with("Error")) {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {command} {pid} failed for {label}:\n{text}"
        ))
    }
}

/// Waits (10 s at most) for callgrind to write the dump `callgrind_control -d` asked for.
fn wait_for_dump(dump: &Path, label: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if dump.metadata().is_ok_and(|m| m.len() > 0) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "{label}: no callgrind dump {} after callgrind_control -d",
        dump.display()
    ))
}

fn print_results(bench: &Bench<'_>, rows: &[(u64, Profile)]) {
    let s = bench.settings;
    let labels = bench.labels();
    let refs = bench.reference_columns();
    let w = label_width(labels.iter().copied());
    let per_request =
        |(requests, profile): &(u64, Profile)| profile.total as f64 / *requests as f64;

    let mut header = format!(
        "{:>w$}  {:>9}  {:>15}",
        "target", "requests", "k instr/request"
    );
    for (_, r) in &refs {
        header += &format!("  {:>9}", format!("÷ {r}"));
    }
    println!("{header}");
    for (label, row) in labels.iter().zip(rows) {
        let per = per_request(row);
        let mut line = format!("{label:>w$}  {:>9}  {:>15.1}", row.0, per / 1000.0);
        for &(r, _) in &refs {
            line += &format!("  {:>9.3}", per / per_request(&rows[r]));
        }
        println!("{line}");
    }

    if s.ins_cache_sim {
        print_cache(&labels, rows, w);
    }

    for (label, (requests, profile)) in labels.iter().zip(rows) {
        let requests = *requests as f64;
        println!(
            "\n{label}: top functions, instructions per request (self, {:.1} k in all)",
            profile.total as f64 / requests / 1000.0
        );
        for (name, cost) in profile.by_function.most_common(s.ins_top) {
            let name: String = name.chars().take(150).collect();
            println!("  {:>8.0}  {name}", cost as f64 / requests);
        }
    }

    let lined: Vec<(&str, u64, &callgrind::Profile)> = labels
        .iter()
        .zip(rows)
        .filter(|(_, (_, p))| p.by_crate.is_some())
        .map(|(label, (requests, p))| (*label, *requests, p))
        .collect();
    if !lined.is_empty() {
        println!(
            "\nInstructions per request by crate of the source line (inlined code counted where it was"
        );
        println!("written; libc and other code without line tables by object):");
        let mut names: Vec<&str> = Vec::new();
        for (_, _, profile) in &lined {
            if let Some(by_crate) = &profile.by_crate {
                for (name, _) in by_crate.most_common(s.ins_top) {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        let mut header = format!("  {:<width$}", "");
        for (label, _, _) in &lined {
            header += &format!("  {label:>16}");
        }
        println!("{header}");
        for name in names {
            let mut line = format!("  {name:<width$}");
            for (_, requests, profile) in &lined {
                let cost = profile.by_crate.as_ref().map_or(0, |c| c.get(name));
                line += &format!("  {:>16.0}", cost as f64 / *requests as f64);
            }
            println!("{line}");
        }
    }

    let smallest = rows.iter().map(|(r, _)| *r).min().unwrap_or(1).max(1);
    println!();
    println!(
        "User-space instructions only: the kernel's share (about 60% of each target's time here,"
    );
    println!("sockets and epoll) is not counted. Valgrind runs a process's threads one at a time.");
    println!(
        "The requests in flight when wrk stops (at most {}, {:.1}% of the smallest run) are in the",
        s.connections,
        100.0 * s.connections as f64 / smallest as f64
    );
    println!("instructions but not in the requests.");
}
