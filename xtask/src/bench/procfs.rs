//! What the bench reads from /proc: CPU time of processes and of CPUs, children, context
//! switches. A process that has gone counts as nothing (it is checked for separately).

use std::{fs, process::Command};

use super::Result;

/// Clock ticks used so far by the processes `pids`, all their threads: (user + system, user).
pub(crate) fn process_ticks(pids: &[u32]) -> (u64, u64) {
    let mut ticks = (0, 0);
    for pid in pids {
        if let Some((user, system)) = read(&format!("/proc/{pid}/stat")).and_then(|s| times(&s)) {
            ticks.0 += user + system;
            ticks.1 += user;
        }
    }
    ticks
}

/// Clock ticks of CPU `cpu` so far, all processes: (busy, total). Busy is all but idle and
/// iowait.
pub(crate) fn cpu_ticks(cpu: u64) -> Result<(u64, u64)> {
    let stat = read("/proc/stat").ok_or("cannot read /proc/stat")?;
    cpu_line(&stat, cpu).ok_or_else(|| format!("no line for CPU {cpu} in /proc/stat"))
}

/// The processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            read(&format!("/proc/{child}/stat"))
                .and_then(|s| parent(&s))
                .is_some_and(|parent| parent == pid)
        })
        .collect();
    children.sort_unstable();
    children
}

/// Context switches so far of every thread of the processes `pids`: (voluntary,
/// nonvoluntary).
pub(crate) fn ctxt_switches(pids: &[u32]) -> (u64, u64) {
    let mut switches = (0, 0);
    for pid in pids {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Some(status) = read(&task.path().join("status").display().to_string()) {
                let (voluntary, nonvoluntary) = switches_of(&status);
                switches.0 += voluntary;
                switches.1 += nonvoluntary;
            }
        }
    }
    switches
}

/// Clock ticks per second (`getconf CLK_TCK`).
pub(crate) fn clock_ticks() -> Result<u64> {
    let output = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .map_err(|e| format!("cannot run getconf CLK_TCK: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    match text.trim().parse::<u64>() {
        Ok(n) if n > 0 && output.status.success() => Ok(n),
        _ => Err(format!("getconf CLK_TCK answered `{}`", text.trim())),
    }
}

fn read(path: &str) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// The fields of a `/proc/<pid>/stat` line after `pid (comm) `, from the state on (the
/// command may hold spaces and parentheses: the last `)` ends it).
fn fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(") ")? + 2..];
    Some(after.split_whitespace().collect())
}

/// (utime, stime) of a `/proc/<pid>/stat` line: fields 14 and 15.
fn times(stat: &str) -> Option<(u64, u64)> {
    let f = fields(stat)?;
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// The parent pid of a `/proc/<pid>/stat` line: field 4.
fn parent(stat: &str) -> Option<u32> {
    fields(stat)?.get(1)?.parse().ok()
}

/// (busy, total) of the `cpuN` line of `/proc/stat`.
fn cpu_line(stat: &str, cpu: u64) -> Option<(u64, u64)> {
    let name = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let total: u64 = values.iter().sum();
    Some((total - values.get(3)? - values.get(4)?, total))
}

/// (voluntary, nonvoluntary) context switches of a `/proc/<pid>/task/<tid>/status`.
fn switches_of(status: &str) -> (u64, u64) {
    let mut switches = (0, 0);
    for line in status.lines() {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let value: u64 = value.parse().unwrap_or(0);
        match key {
            "voluntary_ctxt_switches:" => switches.0 += value,
            "nonvoluntary_ctxt_switches:" => switches.1 += value,
            _ => {}
        }
    }
    switches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_times_and_parent_of_a_stat_line_with_an_awkward_command() {
        let stat = "4242 (nginx: a) b) S 4200 4242 4242 0 -1 4194560 120 0 0 0 \
                    731 254 0 0 20 0 1 0 9071 11554816 1234 18446744073709551615";
        assert_eq!(times(stat), Some((731, 254)));
        assert_eq!(parent(stat), Some(4200));
    }

    #[test]
    fn busy_is_all_but_idle_and_iowait() {
        let stat = "cpu  10 0 10 100 5 0 0 0 0 0\n\
                    cpu0 100 2 30 400 20 3 4 1 0 0\n\
                    cpu1 7 0 3 90 0 0 0 0 0 0\n";
        assert_eq!(cpu_line(stat, 0), Some((140, 560)));
        assert_eq!(cpu_line(stat, 1), Some((10, 100)));
        assert_eq!(cpu_line(stat, 2), None);
    }

    #[test]
    fn counts_both_kinds_of_context_switch() {
        let status = "Name:\tnginx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(switches_of(status), (12, 3));
    }

    #[test]
    fn this_process_has_cpu_time_and_a_child_is_found() {
        let me = std::process::id();
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let found = children(me).contains(&child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found, "the child {} of {me} was not found", child.id());
        // Spin until the process has used a clock tick (bounded: a loaded machine may not
        // run this thread at once).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (all, user) = loop {
            let (all, user) = process_ticks(&[me]);
            if all > 0 || std::time::Instant::now() > deadline {
                break (all, user);
            }
        };
        assert!(all >= user && all > 0, "{all} {user}");
        let (busy, total) = cpu_ticks(0).unwrap();
        assert!(busy <= total && total > 0);
    }
}
