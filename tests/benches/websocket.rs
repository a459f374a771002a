//! WebSocket through the gateway against a direct connection and nginx (when `nginx` is on
//! the `PATH`): message round trips on one connection (p50, p99), CPU per message, and
//! memory per idle WebSocket connection.
//!
//! ```text
//! cargo bench -p gray-tests --bench websocket            # 20,000 messages, 5,000 idle connections
//! WS_MESSAGES=2000 WS_IDLE=500 cargo bench -p gray-tests --bench websocket
//! ```
//!
//! The echo instance and the gateway run in child processes (this binary, `--echo` and
//! `--gateway DIR`; the gateway on tokio's current-thread scheduler, as its binary runs
//! with `workers = 1`), and nginx (one worker) in its own: the CPU per message and the memory
//! per connection of the gateway and of nginx are read from their `/proc` entries (the
//! gateway's process, nginx's worker). A custom harness: criterion reports neither
//! percentiles nor memory.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures_util::{SinkExt, StreamExt};
use gray_test_support::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::{WebSocketStream, tungstenite::Message};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The echo instance: prints its address, then echoes every message of every connection.
async fn echo_server() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    while let Ok((tcp, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                return;
            };
            while let Some(Ok(message)) = ws.next().await {
                if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The gateway of `dir`: prints its address, then serves until killed.
async fn gateway_server(dir: &str) {
    let gateway = gray_tests::start_gateway(std::path::Path::new(dir)).await;
    println!("{}", gateway.addr());
    std::future::pending::<()>().await;
}

/// This binary as a child process with `args`, and the address it printed.
fn spawn_child(args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().expect("its address"))
}

/// The CPU time (user and system) of the process `pid`, from `/proc/{pid}/stat`.
fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, rest)| rest.split(' ').collect());
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// Resident memory of `pid`, in bytes (`VmRSS`).
fn rss_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn connect(addr: SocketAddr, path: &str) -> WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}{path}"), tcp)
        .await
        .expect("a WebSocket");
    ws
}

/// What the rounds of one target measured.
#[derive(Default)]
struct Run {
    times: Vec<Duration>,
    cpu: Duration,
}

impl Run {
    fn add(&mut self, other: Run) {
        self.times.extend(other.times);
        self.cpu += other.cpu;
    }

    /// p50 and p99, in µs; CPU per message, in µs.
    fn line(&mut self) -> String {
        self.times.sort();
        let at = |q: usize| self.times[self.times.len() * q / 100].as_secs_f64() * 1e6;
        let cpu = self.cpu.as_secs_f64() * 1e6 / self.times.len() as f64;
        format!(
            "p50 {:>7.1} µs  p99 {:>7.1} µs  CPU {cpu:>6.2} µs a message",
            at(50),
            at(99)
        )
    }
}

/// `messages` round trips of 32 bytes on one connection to `addr`; `cpu` is the CPU time
/// `pids` spent meanwhile.
async fn round_trips(addr: SocketAddr, path: &str, messages: usize, pids: &[String]) -> Run {
    let mut ws = connect(addr, path).await;
    let payload = "x".repeat(32);
    for _ in 0..200 {
        ws.send(Message::text(payload.clone())).await.unwrap();
        ws.next().await.unwrap().unwrap();
    }
    let cpu = |pids: &[String]| pids.iter().map(|p| cpu_of(p)).sum::<Duration>();
    let before = cpu(pids);
    let mut times = Vec::with_capacity(messages);
    for _ in 0..messages {
        let start = Instant::now();
        ws.send(Message::text(payload.clone())).await.unwrap();
        ws.next().await.unwrap().unwrap();
        times.push(start.elapsed());
    }
    let cpu = cpu(pids) - before;
    Run { times, cpu }
}

/// Memory of `pid` grown by `n` idle WebSocket connections to `addr` (held until return).
async fn idle_growth(addr: SocketAddr, path: &str, n: usize, pid: &str) -> u64 {
    let before = rss_of(pid);
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(connect(addr, path).await);
    }
    // One message on each: every tunnel is past its first frames.
    for ws in &mut held {
        ws.send(Message::text("hi")).await.unwrap();
        ws.next().await.unwrap().unwrap();
    }
    let grown = rss_of(pid).saturating_sub(before);
    for mut ws in held {
        let _ = ws.close(None).await;
    }
    grown
}

fn nginx(dir: &TempDir, echo: SocketAddr) -> Option<(Child, SocketAddr, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/error.log;\n\
             events {{ worker_connections 12000; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {dir};\n  proxy_temp_path {dir};\n\
               fastcgi_temp_path {dir};\n  uwsgi_temp_path {dir};\n  scgi_temp_path {dir};\n\
               server {{\n    listen 127.0.0.1:{port};\n    location /svc/ {{\n\
                 proxy_pass http://{echo}/;\n      proxy_http_version 1.1;\n\
                 proxy_set_header Upgrade $http_upgrade;\n\
                 proxy_set_header Connection \"upgrade\";\n      proxy_read_timeout 3600s;\n\
               }}\n  }}\n}}\n",
            dir = dir.path().display()
        ),
    )
    .ok()?;
    let child = Command::new("nginx")
        .args(["-c", conf.to_str()?, "-p", dir.path().to_str()?])
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
    // Its worker: the master's child.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::net::TcpStream::connect(addr).is_ok() {
            let children = std::fs::read_to_string(format!(
                "/proc/{}/task/{}/children",
                child.id(),
                child.id()
            ))
            .unwrap_or_default();
            if let Some(worker) = children.split_whitespace().next() {
                return Some((child, addr, worker.to_owned()));
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--echo") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(echo_server());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--gateway") {
        let dir = args.get(i + 1).expect("--gateway DIR").clone();
        // As the gateway's binary runs `workers = 1`: tokio's current-thread scheduler.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(gateway_server(&dir));
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once, briefly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let messages = if quick {
        200
    } else {
        env("WS_MESSAGES", 20_000)
    };
    let idle = if quick { 50 } else { env("WS_IDLE", 5_000) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (mut echo, echo_addr) = spawn_child(&["--echo"]);
        let dir = TempDir::new("bench-ws");
        std::fs::write(
            dir.path().join("instances.toml"),
            format!("[[services.svc]]\nid = \"base-1\"\naddress = \"{echo_addr}\"\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("gateway.toml"),
            "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\nmax_upgraded = 0\n\
             [services.svc]\npreset = \"seed-000\"\n",
        )
        .unwrap();
        let (mut gateway, gateway_addr) = spawn_child(&["--gateway", dir.path().to_str().unwrap()]);
        let gateway_pid = gateway.id().to_string();
        let nginx = nginx(&dir, echo_addr);

        const ROUNDS: usize = 5;
        println!(
            "WebSocket, 32-byte text messages, one connection, {messages} round trips each, \
             in {ROUNDS} interleaved rounds:"
        );
        let (mut direct, mut through, mut proxied) =
            (Run::default(), Run::default(), Run::default());
        let each = messages / ROUNDS;
        for _ in 0..ROUNDS {
            direct.add(round_trips(echo_addr, "/", each, &[]).await);
            let pid = std::slice::from_ref(&gateway_pid);
            through.add(round_trips(gateway_addr, "/svc/", each, pid).await);
            if let Some((_, addr, worker)) = &nginx {
                proxied.add(round_trips(*addr, "/svc/", each, std::slice::from_ref(worker)).await);
            }
        }
        println!(
            "  direct    {} (no proxy: its CPU is not read)",
            direct.line()
        );
        println!(
            "  gateway   {} (its process, the current-thread scheduler)",
            through.line()
        );
        if nginx.is_some() {
            println!("  nginx     {} (its one worker)", proxied.line());
        } else {
            println!("  nginx     not on the PATH: skipped");
        }

        println!("Memory per idle WebSocket connection, {idle} connections:");
        let through = idle_growth(gateway_addr, "/svc/", idle, &gateway_pid).await;
        println!(
            "  gateway   {:.1} kB (its process's growth)",
            through as f64 / idle as f64 / 1000.0
        );
        if let Some((_, addr, worker)) = &nginx {
            let grown = idle_growth(*addr, "/svc/", idle, worker).await;
            println!(
                "  nginx     {:.1} kB (its worker's growth)",
                grown as f64 / idle as f64 / 1000.0
            );
        }
        let _ = gateway.kill();
        let _ = gateway.wait();
        if let Some((mut child, _, worker)) = nginx {
            // Its worker first: killed, the master would leave it running.
            let _ = Command::new("kill").args(["-9", &worker]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = echo.kill();
        let _ = echo.wait();
    });
}
