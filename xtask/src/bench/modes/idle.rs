//! `--idle-memory`: memory per idle keep-alive connection, plaintext and TLS.
//!
//! Each round starts each target afresh (an allocator keeps what a process freed, so a
//! second measurement in the same process would reuse the first one's memory), checks it
//! answers, reads the resident memory of its serving processes (`VmRSS` in
//! `/proc/<pid>/status`: nginx's worker, the gateway), then a client (Python's `socket` and
//! `ssl`, in the run's directory) opens `IDLE_CONNECTIONS` connections one after the other,
//! sends one request on each (`GET /svc/bench`, HTTP/1.1, half of them gray), reads its
//! response and keeps the connection open; once all are open and have been idle for
//! `IDLE_SETTLE` seconds, the resident memory is read again. The figure is the growth over
//! the number of connections. TLS targets are measured on both listeners (each in a process
//! of its own): plaintext, then TLS (a full handshake per connection, ALPN `http/1.1`, TLS
//! 1.3). The connections stay well within every target's idle timeout.

use std::{
    io::{BufRead, BufReader, Write as _},
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use super::Mode;
use crate::bench::{
    Result,
    harness::Bench,
    report::{label_width, load_average, median, spread},
    step,
    tools::Tool,
};

/// The client: opens the connections, says `READY <n>`, and holds them until its input
/// closes.
const CLIENT: &str = r#"import resource, socket, ssl, sys
host, port, n, cafile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ctx = None
if cafile != "-":
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(["http/1.1"])
conns = []
for i in range(n):
    s = socket.create_connection((host, port), timeout=30)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname="localhost")
    lane = "x-gray-lane: gray\r\n" if i % 2 else ""
    s.sendall(("GET /svc/bench HTTP/1.1\r\nhost: bench\r\n" + lane + "\r\n").encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("connection %d closed before its response" % i)
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        sys.exit("connection %d: %r" % (i, head[:80]))
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += s.recv(4096)
    conns.append(s)
print("READY %d" % len(conns), flush=True)
sys.stdin.read()
"#;

/// Memory per idle keep-alive connection (`--idle-memory`).
#[derive(Debug)]
pub(crate) struct IdleMemory;

impl Mode for IdleMemory {
    fn flag(&self) -> Option<&'static str> {
        Some("--idle-memory")
    }

    fn about(&self) -> &'static str {
        "memory per idle keep-alive connection: each target started afresh per round,\n\
         IDLE_CONNECTIONS connections opened after one request each (plaintext, and TLS\n\
         for the TLS targets), growth of VmRSS of the serving processes per connection"
    }

    fn tools(&self) -> Vec<Tool> {
        vec![Tool {
            command: "python3",
            package: "python3",
        }]
    }

    fn run(&self, bench: &mut Bench<'_>) -> Result<()> {
        let s = bench.settings;
        let n = s.idle_connections;
        let limit = open_files_limit()?;
        if n + 1024 > limit {
            return Err(format!(
                "IDLE_CONNECTIONS={n} needs a limit of open files above {}: raise `ulimit -n` (it is {limit})",
                n + 1024
            ));
        }
        let client = bench.dir.join("idle-client.py");
        std::fs::write(&client, CLIENT)
            .map_err(|e| format!("cannot write {}: {e}", client.display()))?;
        let cert = bench.dir.join("tls-cert.pem");
        step(&format!(
            "{} rounds: each target started afresh, {n} idle connections per listener",
            s.rounds
        ));
        // (target, tls) → kB per connection, per round.
        let mut kb: Vec<(usize, bool, Vec<f64>)> = Vec::new();
        for (i, t) in bench.targets.iter().enumerate() {
            kb.push((i, false, Vec::new()));
            if t.tls.is_some() {
                kb.push((i, true, Vec::new()));
            }
        }
        for round in 1..=s.rounds {
            for (i, tls, values) in &mut kb {
                let (i, tls) = (*i, *tls);
                bench.start_target(i, &[])?;
                bench.wait_target(i)?;
                let t = &bench.targets[i];
                let addr = if tls {
                    t.tls.unwrap_or(t.listen)
                } else {
                    t.listen
                };
                let pids = bench.serving_pids(i)?;
                let before = rss_kb(&pids)?;
                let cafile = if tls { Some(cert.as_path()) } else { None };
                let after = hold(&client, addr, n, cafile, || {
                    // Idle for a while, as idle connections are: the gateway parks them
                    // (drops their buffers) seconds after their last response.
                    std::thread::sleep(Duration::from_secs(s.idle_settle));
                    rss_kb(&pids)
                })
                .map_err(|e| format!("{}: {e}", bench.targets[i].label))?;
                let label = bench.targets[i].label.clone();
                bench.alive(&format!("after round {round} ({label})"), &[i])?;
                bench.stop_target(i);
                values.push((after.saturating_sub(before)) as f64 / n as f64);
            }
            println!(
                "  round {round}/{} done (load: {})",
                s.rounds,
                load_average()
            );
        }
        step(&format!("results (load: {})", load_average()));
        print_results(bench, &kb);
        Ok(())
    }
}

/// Opens `n` connections to `addr` with the client (TLS when `cafile` is given), calls
/// `measure` once all are open and idle, then closes them.
fn hold(
    client: &std::path::Path,
    addr: SocketAddr,
    n: u64,
    cafile: Option<&std::path::Path>,
    measure: impl FnOnce() -> Result<u64>,
) -> Result<u64> {
    let mut child = Command::new("python3")
        .arg(client)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(n.to_string())
        .arg(cafile.map_or("-".into(), |p| p.display().to_string()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("the client: {e}"))?;
    let result = if line.starts_with("READY") {
        measure()
    } else {
        Err(format!("the client did not open its {n} connections"))
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.flush();
    }
    let _ = child.wait();
    result
}

/// The resident memory of `pids`, kB (`VmRSS`).
fn rss_kb(pids: &[u32]) -> Result<u64> {
    let mut total = 0;
    for pid in pids {
        let path = format!("/proc/{pid}/status");
        let status =
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| format!("no VmRSS in {path}"))?;
        total += kb;
    }
    Ok(total)
}

/// This process's limit of open files (its children inherit it), from `/proc/self/limits`.
fn open_files_limit() -> Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits")
        .map_err(|e| format!("cannot read /proc/self/limits: {e}"))?;
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse().ok())
        .ok_or_else(|| "no `Max open files` in /proc/self/limits".to_owned())
}

fn print_results(bench: &Bench<'_>, kb: &[(usize, bool, Vec<f64>)]) {
    let width = label_width(bench.labels());
    let refs = bench.options.refs();
    println!("Memory per idle keep-alive connection, kB: median (min–max) over rounds");
    println!(
        "{:>width$}  {:>9}  {:>24}  ratio to",
        "target", "listener", "kB/connection"
    );
    for (i, tls, values) in kb {
        let label = &bench.targets[*i].label;
        // The first REFS target measured on the same kind of listener.
        let reference = kb
            .iter()
            .find(|(j, t, _)| *t == *tls && refs.contains(&bench.targets[*j].label.as_str()));
        let ratio = match reference {
            Some((j, _, r)) if median(r) > 0.0 => format!(
                "{:.2} × {}",
                median(values) / median(r),
                bench.targets[*j].label
            ),
            _ => "-".to_owned(),
        };
        println!(
            "{label:>width$}  {:>9}  {:>24}  {ratio}",
            if *tls { "tls" } else { "plaintext" },
            spread(values, 2)
        );
    }
}
