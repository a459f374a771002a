//! What a mirror costs the users' traffic: the gateway's `[services.svc.mirror]` against
//! nginx's `mirror` directive (when `nginx` is on the `PATH`), each with no mirror, with a
//! mirror to a slow shadow (10 × baseline's delay) and with a mirror to a dead shadow (it
//! accepts and never answers). Requests per second, p50 and p99 of the users' requests,
//! and each mirror scenario's throughput and p99 as a ratio to the same proxy's no-mirror
//! scenario of the same round: the figure the mirror's goal is about (within 5 %).
//!
//! ```text
//! cargo bench -p gray-tests --bench mirror                  # 3 rounds of 5 s, 1 and 64 connections
//! MIRROR_SECS=1 MIRROR_ROUNDS=1 MIRROR_CONNS=64 cargo bench -p gray-tests --bench mirror
//! ```
//!
//! Settings (environment): `MIRROR_CONNS` (connections, a comma-separated list; default
//! `1,64`), `MIRROR_SECS` (the measured seconds of each scenario in each round; default 5),
//! `MIRROR_ROUNDS` (default 3), `MIRROR_BASE_DELAY_MS` (baseline's delay; default 1; 0
//! answers at once, and the users' throughput is then bound by the machine's CPU, not by
//! the instances' timers), `MIRROR_SHADOW_DELAY_MS` (the slow shadow's; default 10 ×
//! baseline's),
//! `MIRROR_NGINX` (`0`: the gateway's rows only).
//!
//! The instances and the gateways run in child processes (this binary, `--instance MS`,
//! `--dead` and `--gateway DIR`; each gateway with `workers = 1`, on the runtime the
//! gateway's binary builds for it: tokio's current-thread scheduler), nginx (one worker) in
//! its own; the load is a closed loop in this process: hyper's HTTP/1.1 client, each
//! connection kept alive and sending its requests back to back. Every scenario has its
//! proxy process of its own, started once, and the rounds interleave the scenarios (their
//! order rotated from round to round); the table shows the median over the rounds, the
//! ratios as median (min–max). It is printed and written to `/tmp/mirror-bench.md`. The
//! gateway is the library in this binary, built with the bench profile, on the allocator
//! its binary ships with (mimalloc: the system's allocator takes a lock when a thread frees
//! what another allocated, as the copies' thread does with what the users' thread made).
//!
//! A request counts in the latencies when it starts within the measured window (the last
//! ones are awaited past it), in the throughput when it ends within it. *copies/req* is
//! what reached the shadow per user request (the slow shadow counts the requests it
//! answered, the dead one the connections that brought one); *CPU* is the time the threads
//! of the proxy's process (the gateway's, nginx's worker) and of the shadow's ran, per
//! request, from `/proc/{pid}/task/*/schedstat`. All of it shares the machine: on a small
//! one, a shadow's CPU is taken from the proxy and the load.
//!
//! All children are killed when the bench ends, also on a panic (a guard's `Drop`) and on
//! `SIGINT` or `SIGTERM` (no table then); this binary's own children also exit when their
//! standard input closes (this process gone).

use std::{
    collections::HashMap,
    fmt::Write as _,
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use gray_test_support::TempDir;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// The gateway's binary's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What both instances answer to `GET /item`.
const ITEM: &str = r#"{"id":7,"items":[1,2,3]}"#;
/// Unmeasured requests before each scenario's window.
const WARM_UP: Duration = Duration::from_millis(500);
/// A pause after each scenario: the copies still on their way reach the shadow.
const SETTLE: Duration = Duration::from_millis(300);
/// How long a user's request may take before it counts as an error (nginx's copy of it
/// times out after 5 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .filter(|&n| n > 0)
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

// ---------------------------------------------------------------------------------------
// The children

/// A child of this binary exits when its standard input closes: the bench is gone, even
/// killed before its guard could run.
#[allow(clippy::exit)] // the child's only way out of a runtime that never returns
fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Where the bench's processes run: with two CPUs or more (and `taskset`, and
/// `MIRROR_PIN` not `0`), each proxy (the gateway's process, both its threads; nginx) on
/// CPU 0, and the load, the instances and the shadows on CPU 1, as `cargo xtask
/// bench-gateway` places them: the proxy's CPU is then its own, and the rounds do not
/// switch between placements the scheduler happened to choose (unpinned, the same
/// scenario's rounds differed by half in CPU per request).
#[derive(Debug, Clone, Copy)]
struct Placement {
    pinned: bool,
    /// The shadows at the lowest priority (`chrt --idle`).
    idle_shadow: bool,
}

impl Placement {
    const PROXY_CPU: &str = "0";
    const LOAD_CPU: &str = "1";

    fn new() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let taskset = Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let wanted = std::env::var("MIRROR_PIN").as_deref() != Ok("0");
        let chrt = Command::new("chrt")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Placement {
            pinned: wanted && cpus >= 2 && taskset,
            idle_shadow: chrt && std::env::var("MIRROR_SHADOW_PRIORITY").as_deref() != Ok("normal"),
        }
    }

    /// `program` to run on the proxies' CPU (`proxy`) or the load's.
    fn command(self, program: &std::ffi::OsStr, proxy: bool) -> Command {
        if !self.pinned {
            return Command::new(program);
        }
        let mut command = Command::new("taskset");
        command
            .arg("-c")
            .arg(if proxy {
                Self::PROXY_CPU
            } else {
                Self::LOAD_CPU
            })
            .arg(program);
        command
    }

    /// This process (the load) on the load's CPU; its threads made from now on inherit it.
    fn pin_self(self) {
        if self.pinned {
            let _ = Command::new("taskset")
                .args(["-p", "-c", Self::LOAD_CPU, &std::process::id().to_string()])
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// Precise delays for an instance's answers: a thread of their own that sleeps until the
/// earliest deadline (the kernel's high-resolution timers) and completes each delay when
/// it is due. tokio's timers tick once a millisecond: every answer due within a tick goes
/// out at its end, together, so that the latencies fall into steps of a millisecond whose
/// phase against the load shifts from round to round, and a round's p99 jumps by more
/// than the 5 % the mirror's goal is about.
#[derive(Clone)]
struct Delays {
    queue: Arc<(
        std::sync::Mutex<std::collections::BinaryHeap<Due>>,
        std::sync::Condvar,
    )>,
}

/// A delay waiting in [`Delays`]: its deadline, and the sender that completes it.
struct Due(std::time::Instant, tokio::sync::oneshot::Sender<()>);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    /// The earliest first out of the (max-)heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.cmp(&self.0)
    }
}

impl Delays {
    fn start() -> Self {
        let delays = Delays {
            queue: Arc::default(),
        };
        let queue = delays.queue.clone();
        std::thread::spawn(move || {
            let (heap, woken) = &*queue;
            let mut heap = heap.lock().unwrap();
            loop {
                let now = std::time::Instant::now();
                while heap.peek().is_some_and(|due| due.0 <= now) {
                    if let Some(Due(_, done)) = heap.pop() {
                        let _ = done.send(());
                    }
                }
                heap = match heap.peek().map(|due| due.0 - now) {
                    Some(until) => woken.wait_timeout(heap, until).unwrap().0,
                    None => woken.wait(heap).unwrap(),
                };
            }
        });
        delays
    }

    /// Until `delay` from now.
    async fn after(&self, delay: Duration) {
        let (done, wait) = tokio::sync::oneshot::channel();
        let due = std::time::Instant::now() + delay;
        {
            let (heap, woken) = &*self.queue;
            let mut heap = heap.lock().unwrap();
            let earliest = heap.peek().is_none_or(|first| due < first.0);
            heap.push(Due(due, done));
            if earliest {
                woken.notify_one();
            }
        }
        let _ = wait.await;
    }
}

/// An instance: prints its address, then answers `GET /item` with [`ITEM`] after `delay`
/// (a precise one: [`Delays`]), and `GET /seen` with how many `/item` it answered and how
/// many connections it accepted.
async fn instance(delay: Duration) {
    let delays = Delays::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let warned = Arc::new(AtomicBool::new(false));
    while let Ok((tcp, _)) = listener.accept().await {
        let _ = tcp.set_nodelay(true);
        accepted.fetch_add(1, Ordering::Relaxed);
        let (seen, accepted, warned) = (seen.clone(), accepted.clone(), warned.clone());
        let delays = delays.clone();
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let (seen, accepted, warned) = (seen.clone(), accepted.clone(), warned.clone());
            let delays = delays.clone();
            async move {
                match request.uri().path() {
                    "/item" => {
                        if !delay.is_zero() {
                            delays.after(delay).await;
                        }
                        seen.fetch_add(1, Ordering::Relaxed);
                        Response::builder()
                            .header(header::CONTENT_TYPE, "application/json")
                            .body(Full::new(Bytes::from_static(ITEM.as_bytes())))
                    }
                    "/seen" => Response::builder().body(Full::new(Bytes::from(format!(
                        "{} {}",
                        seen.load(Ordering::Relaxed),
                        accepted.load(Ordering::Relaxed)
                    )))),
                    other => {
                        if !warned.swap(true, Ordering::Relaxed) {
                            eprintln!("instance: a request for {other:?}, not /item");
                        }
                        Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Full::new(Bytes::new()))
                    }
                }
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// The dead shadow: prints its address, then accepts connections and never answers them
/// (reads and holds each until its peer closes it), but for `GET /seen`: how many
/// connections brought a request, and how many it accepted.
async fn dead_shadow() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    while let Ok((mut tcp, _)) = listener.accept().await {
        accepted.fetch_add(1, Ordering::Relaxed);
        let (seen, accepted) = (seen.clone(), accepted.clone());
        tokio::spawn(async move {
            let mut buf = vec![0; 4096];
            let n = match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if buf[..n].starts_with(b"GET /seen ") {
                let count = format!(
                    "{} {}",
                    seen.load(Ordering::Relaxed),
                    accepted.load(Ordering::Relaxed)
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{count}",
                    count.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
                return;
            }
            seen.fetch_add(1, Ordering::Relaxed);
            while let Ok(n) = tcp.read(&mut buf).await {
                if n == 0 {
                    return;
                }
            }
        });
    }
}

/// The gateway of `dir`'s `gateway.toml`, on the runtime its `workers` asks for (as the
/// gateway's binary builds it: one worker is tokio's current-thread scheduler); prints its
/// address, then serves until killed.
fn gateway(dir: &str) {
    let config =
        gray_gateway::config::Config::load(&std::path::Path::new(dir).join("gateway.toml"))
            .expect("a valid config");
    gray_gateway::raise_nofile_limit();
    let mut runtime = match config.workers {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if config.workers > 1 {
        runtime.worker_threads(config.workers);
    }
    runtime.enable_all().build().unwrap().block_on(async {
        let gateway = gray_gateway::Gateway::start(config)
            .await
            .expect("the gateway starts");
        println!("{}", gateway.addr());
        std::future::pending::<()>().await;
    });
}

/// `kill -{signal} pid`.
fn kill(signal: &str, pid: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}").as_str(), pid])
        .stderr(Stdio::null())
        .status();
}

/// The processes of the bench, killed when dropped (also on a panic); then the
/// directories of their configurations are removed.
struct Children {
    placement: Placement,
    children: Vec<Child>,
    /// nginx's masters: told to stop (`SIGTERM`, its fast shutdown: the master stops its
    /// worker, then exits). Killed, a master would leave its worker running, and a worker
    /// killed first gets a new one from its master.
    nginx: Vec<Child>,
    _dirs: Vec<TempDir>,
}

impl Drop for Children {
    fn drop(&mut self) {
        for master in &self.nginx {
            kill("TERM", &master.id().to_string());
        }
        for child in &mut self.children {
            let _ = child.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for master in &mut self.nginx {
            while matches!(master.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(master.try_wait(), Ok(None)) {
                // Still running: its workers, then itself.
                let id = master.id();
                let workers = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children"))
                    .unwrap_or_default();
                kill("STOP", &id.to_string());
                for worker in workers.split_whitespace() {
                    kill("KILL", worker);
                }
                let _ = master.kill();
            }
        }
        for child in self.children.iter_mut().chain(&mut self.nginx) {
            let _ = child.wait();
        }
    }
}

impl Children {
    fn new(placement: Placement) -> Self {
        Children {
            placement,
            children: Vec::new(),
            nginx: Vec::new(),
            _dirs: Vec::new(),
        }
    }

    /// This binary as a child process with `args`, a proxy's when `proxy`: the address it
    /// printed, and its pid.
    fn spawn(&mut self, args: &[&str], proxy: bool) -> (SocketAddr, u32) {
        let command = self
            .placement
            .command(std::env::current_exe().unwrap().as_os_str(), proxy);
        self.start(command, args)
    }

    /// `command` (this binary, maybe behind `taskset` and `chrt`) with `args`: the address
    /// it printed, and its pid.
    fn start(&mut self, mut command: Command, args: &[&str]) -> (SocketAddr, u32) {
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the child starts");
        let stdout = child.stdout.take().unwrap();
        let pid = child.id();
        self.children.push(child);
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{args:?}: an address, not {line:?}"));
        (addr, pid)
    }

    /// A shadow (this binary with `args`), on the load's CPU: at the lowest priority
    /// (`chrt --idle`: it gets only the CPU the load and baseline leave) unless
    /// `MIRROR_SHADOW_PRIORITY=normal`, standing for the other host a shadow runs on. At
    /// the load's priority on a machine as small as two cores, a shadow's CPU comes out of
    /// the load generator's and baseline's, and the users' throughput falls for that alone.
    fn spawn_shadow(&mut self, args: &[&str]) -> (SocketAddr, u32) {
        let command = match self.placement.idle_shadow {
            true => {
                let mut idle = self.placement.command("chrt".as_ref(), false);
                idle.args(["--idle", "0"])
                    .arg(std::env::current_exe().unwrap());
                idle
            }
            false => self
                .placement
                .command(std::env::current_exe().unwrap().as_os_str(), false),
        };
        self.start(command, args)
    }

    /// A gateway whose `svc` has the instances `base` and `shadow` (labelled gray), with
    /// a mirror to gray when `mirror`.
    fn gateway(&mut self, base: SocketAddr, shadow: SocketAddr, mirror: bool) -> (SocketAddr, u32) {
        let dir = TempDir::new("bench-mirror-gateway");
        std::fs::write(
            dir.path().join("instances.toml"),
            format!(
                "[[services.svc]]\nid = \"base-1\"\naddress = \"{base}\"\n\n\
                 [[services.svc]]\nid = \"gray-1\"\naddress = \"{shadow}\"\n\
                 labels = {{ gray = true }}\n"
            ),
        )
        .unwrap();
        let mirror = if mirror {
            "mirror = { lane = \"gray\", timeout_ms = 5000 }\n"
        } else {
            ""
        };
        std::fs::write(
            dir.path().join("gateway.toml"),
            format!(
                "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\nworkers = 1\n\
                 [services.svc]\npreset = \"seed-000\"\n{mirror}"
            ),
        )
        .unwrap();
        let started = self.spawn(&["--gateway", dir.path().to_str().unwrap()], true);
        self._dirs.push(dir);
        started
    }

    /// nginx (one worker) proxying `/svc/` to `base`, with `mirror` to `shadow` when
    /// `shadow` is given; its address and its worker's pid.
    fn nginx(&mut self, base: SocketAddr, shadow: Option<SocketAddr>) -> (SocketAddr, u32) {
        let dir = TempDir::new("bench-mirror-nginx");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let (mirror, shadow) = match shadow {
            None => (String::new(), String::new()),
            Some(shadow) => (
                "      mirror /mirror;\n".to_owned(),
                format!(
                    "  upstream shadow {{ server {shadow}; keepalive 64; keepalive_requests 1000000; }}\n\
                     # the copy's path: the user's without its /svc\n\
                     map $request_uri $mirror_uri {{ ~^/svc(?<rest>/.*)$ $rest; default $request_uri; }}\n\
                     server {{\n    listen 127.0.0.1:{port};\n    location = /mirror {{\n\
                       internal;\n      proxy_pass http://shadow$mirror_uri;\n\
                       proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
                       proxy_read_timeout 5s;\n    }}\n"
                ),
            ),
        };
        // Without a mirror, the `server` block opens here.
        let server = if shadow.is_empty() {
            format!("  server {{\n    listen 127.0.0.1:{port};\n")
        } else {
            String::new()
        };
        // `keepalive_requests`: nginx closes a kept-alive connection after 1,000 requests
        // by default (a client's, an upstream's); the gateway does not. Raised: no
        // connection is opened anew within a window.
        let conf = format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 8192; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n\
               fastcgi_temp_path {d};\n  uwsgi_temp_path {d};\n  scgi_temp_path {d};\n\
               upstream base {{ server {base}; keepalive 64; keepalive_requests 1000000; }}\n{shadow}{server}\
                 location /svc/ {{\n{mirror}      proxy_pass http://base/;\n\
                   proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n\
               }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let child = self
            .placement
            .command("nginx".as_ref(), true)
            .args([
                "-p",
                dir.path().to_str().unwrap(),
                "-c",
                path.to_str().unwrap(),
            ])
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("nginx starts");
        let master = child.id();
        self.nginx.push(child);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Its worker: the master's child.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(addr).is_ok() {
                let children =
                    std::fs::read_to_string(format!("/proc/{master}/task/{master}/children"))
                        .unwrap_or_default();
                if let Some(worker) = children.split_whitespace().next() {
                    self._dirs.push(dir);
                    return (addr, worker.parse().unwrap());
                }
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}{}",
                std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default(),
                std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The load

/// The CPU time of the process `pid`: the time its threads ran, in nanoseconds (the first
/// field of each `/proc/{pid}/task/*/schedstat`; `/proc/{pid}/stat` counts in 10 ms ticks,
/// too coarse for the few requests of one connection); and of those, its threads named
/// `gray-mirror` (the gateway's copies' thread).
fn cpu_of(pid: u32) -> (Duration, Duration) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (Duration::ZERO, Duration::ZERO);
    };
    let (mut all, mut copies) = (0, 0);
    for task in tasks.filter_map(Result::ok) {
        let Some(nanos) = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        all += nanos;
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.trim() == "gray-mirror" {
            copies += nanos;
        }
    }
    (Duration::from_nanos(all), Duration::from_nanos(copies))
}

/// A kept-alive HTTP/1.1 connection to `addr`.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// What [`get`] got: the status, the body, and whether the server closes the connection
/// after it (`Connection: close`).
type Got = (StatusCode, Bytes, bool);

/// `GET path` of `addr`.
async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> Result<Got, Box<dyn std::error::Error + Send + Sync>> {
    sender.ready().await?;
    let request = Request::get(path)
        .header(header::HOST, addr.to_string())
        .body(Empty::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let close = response
        .headers()
        .get(header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body, close))
}

/// What the shadow at `addr` counted (`GET /seen`): the requests it got, and the
/// connections it accepted (this one's too).
async fn seen(addr: SocketAddr) -> (u64, u64) {
    let mut sender = connect(addr).await;
    let (_, body, _) = get(&mut sender, addr, "/seen").await.unwrap();
    let text = std::str::from_utf8(&body).unwrap();
    let (requests, connections) = text.split_once(' ').unwrap();
    (requests.parse().unwrap(), connections.parse().unwrap())
}

/// What one scenario measured in one round.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rps: f64,
    /// None when no request started within the window ended.
    p50: Option<Duration>,
    p99: Option<Duration>,
    /// p90 and p99.9, for the round's line.
    p90: Option<Duration>,
    p999: Option<Duration>,
    /// The proxy's CPU per request, in µs.
    cpu: f64,
    /// Of which the gateway's copies' thread's.
    copies_cpu: f64,
    /// The shadow's CPU per request, in µs.
    shadow_cpu: f64,
    /// What reached the shadow per user request.
    copies: f64,
    /// The connections the shadow accepted meanwhile.
    shadow_connections: u64,
    errors: usize,
    /// Connections the proxy closed after an answer, opened anew.
    reconnects: usize,
}

/// What one connection measured.
#[derive(Default)]
struct Conn {
    latencies: Vec<Duration>,
    /// Requests that ended within the window.
    completed: usize,
    /// All its requests, the warm-up's too.
    total: usize,
    errors: usize,
    reconnects: usize,
}

/// A proxy set up for a scenario.
struct Target {
    proxy: Proxy,
    scenario: Scenario,
    addr: SocketAddr,
    /// The process whose CPU is read: the gateway's, nginx's worker.
    pid: u32,
    /// Where the copies go, and its process.
    shadow: Option<(SocketAddr, u32)>,
}

/// `conns` connections to `target`, each sending `GET /svc/item` back to back: a warm-up,
/// then `secs` measured.
async fn load(target: &Target, conns: usize, secs: Duration) -> Sample {
    let addr = target.addr;
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(addr).await);
    }
    let shadow_before = match target.shadow {
        Some((shadow, _)) => seen(shadow).await,
        None => (0, 0),
    };
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let (from, to) = (start + WARM_UP, start + WARM_UP + secs);
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            tokio::spawn(async move {
                let mut conn = Conn::default();
                tokio::time::sleep_until(start).await;
                loop {
                    let began = tokio::time::Instant::now();
                    if began >= to {
                        return conn;
                    }
                    let result =
                        tokio::time::timeout(REQUEST_TIMEOUT, get(&mut sender, addr, "/svc/item"))
                            .await;
                    let ended = tokio::time::Instant::now();
                    conn.total += 1;
                    match result {
                        Ok(Ok((status, body, close))) => {
                            if status != StatusCode::OK || body != ITEM.as_bytes() {
                                conn.errors += 1;
                            }
                            if close {
                                // Not timed: a new connection before the next request.
                                conn.reconnects += 1;
                                sender = connect(addr).await;
                            }
                        }
                        // The connection is lost (or stuck): this one's count ends here.
                        Ok(Err(_)) | Err(_) => {
                            conn.errors += 1;
                            return conn;
                        }
                    }
                    if began >= from {
                        conn.latencies.push(ended - began);
                    }
                    if ended >= from && ended < to {
                        conn.completed += 1;
                    }
                }
            })
        })
        .collect();
    let shadow_pid = target.shadow.map(|(_, pid)| pid);
    let cpu = || {
        (
            cpu_of(target.pid),
            shadow_pid.map(|pid| cpu_of(pid).0).unwrap_or_default(),
        )
    };
    tokio::time::sleep_until(from).await;
    let cpu_before = cpu();
    tokio::time::sleep_until(to).await;
    let cpu_after = cpu();
    let mut all = Conn::default();
    for task in tasks {
        let conn = task.await.expect("a connection's task");
        all.latencies.extend(conn.latencies);
        all.completed += conn.completed;
        all.total += conn.total;
        all.errors += conn.errors;
        all.reconnects += conn.reconnects;
    }
    tokio::time::sleep(SETTLE).await;
    let (copies, shadow_connections) = match target.shadow {
        Some((shadow, _)) => {
            let after = seen(shadow).await;
            // Less the connection of the second `/seen`.
            (
                after.0 - shadow_before.0,
                (after.1 - shadow_before.1).saturating_sub(1),
            )
        }
        None => (0, 0),
    };
    all.latencies.sort();
    let at_per_mille = |q: usize| {
        let n = all.latencies.len();
        (n > 0).then(|| all.latencies[(n * q / 1000).min(n - 1)])
    };
    let at = |q: usize| at_per_mille(q * 10);
    let per_request = |d: Duration| d.as_secs_f64() * 1e6 / all.completed.max(1) as f64;
    Sample {
        rps: all.completed as f64 / secs.as_secs_f64(),
        p50: at(50),
        p99: at(99),
        p90: at(90),
        p999: at_per_mille(999),
        cpu: per_request(cpu_after.0.0.saturating_sub(cpu_before.0.0)),
        copies_cpu: per_request(cpu_after.0.1.saturating_sub(cpu_before.0.1)),
        shadow_cpu: per_request(cpu_after.1.saturating_sub(cpu_before.1)),
        copies: copies as f64 / all.total.max(1) as f64,
        shadow_connections,
        errors: all.errors,
        reconnects: all.reconnects,
    }
}

// ---------------------------------------------------------------------------------------
// The bench

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Proxy {
    Gateway,
    Nginx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scenario {
    Off,
    Slow,
    Dead,
}

const SCENARIOS: [Scenario; 3] = [Scenario::Off, Scenario::Slow, Scenario::Dead];

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Gateway => "gateway",
            Proxy::Nginx => "nginx",
        }
    }
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Off => "none",
            Scenario::Slow => "slow shadow",
            Scenario::Dead => "dead shadow",
        }
    }
}

/// The median of the numbers among `values` (NaN: none).
fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A figure with about three significant digits (two below 0.1).
fn fig(v: f64) -> String {
    if v.is_nan() {
        "n/a".to_owned()
    } else if v > 0.0 && v < 0.1 {
        let decimals = (1.0 - v.log10().floor()) as usize;
        format!("{v:.decimals$}")
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Milliseconds; NaN for none.
fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

/// Median (min–max).
fn spread(values: &[f64]) -> String {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => "n/a".to_owned(),
        1 => fig(sorted[0]),
        n => format!(
            "{} ({}–{})",
            fig(median(&sorted)),
            fig(sorted[0]),
            fig(sorted[n - 1])
        ),
    }
}

/// Until `SIGINT` or `SIGTERM`.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).unwrap();
    let mut term = signal(SignalKind::terminate()).unwrap();
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args.get(i + 1).cloned().unwrap_or_default())
    };
    if let Some(delay) = arg("--instance") {
        exit_with_parent();
        let delay = Duration::from_secs_f64(delay.parse::<f64>().expect("--instance MS") / 1e3);
        current_thread().block_on(instance(delay));
        return;
    }
    if args.iter().any(|a| a == "--dead") {
        exit_with_parent();
        current_thread().block_on(dead_shadow());
        return;
    }
    if let Some(dir) = arg("--gateway") {
        exit_with_parent();
        gateway(&dir);
        return;
    }

    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once, briefly.
    let quick = !args.iter().any(|a| a == "--bench");
    let (conns_set, secs, rounds) = if quick {
        (vec![1, 4], 0.5, 1)
    } else {
        (
            env_list("MIRROR_CONNS", &[1, 64]),
            env_f64("MIRROR_SECS", 5.0),
            env_f64("MIRROR_ROUNDS", 3.0).max(1.0) as usize,
        )
    };
    let secs = Duration::from_secs_f64(secs);
    let delay_ms = env_f64("MIRROR_BASE_DELAY_MS", 1.0);
    let shadow_delay_ms = env_f64("MIRROR_SHADOW_DELAY_MS", delay_ms * 10.0);
    let with_nginx = std::env::var("MIRROR_NGINX").as_deref() != Ok("0");
    let nginx_version = Command::new("nginx")
        .arg("-v")
        .output()
        .ok()
        .filter(|_| with_nginx)
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .replace("nginx version: ", "")
        });
    let began = Instant::now();

    let placement = Placement::new();
    placement.pin_self();
    // Dropped last: killed also when what follows panics.
    let mut children = Children::new(placement);
    let (base, _) = children.spawn(&["--instance", &delay_ms.to_string()], false);
    let slow = children.spawn_shadow(&["--instance", &shadow_delay_ms.to_string()]);
    let dead = children.spawn_shadow(&["--dead"]);
    let shadow_of = |scenario| match scenario {
        Scenario::Off => None,
        Scenario::Slow => Some(slow),
        Scenario::Dead => Some(dead),
    };
    let mut targets = Vec::new();
    for scenario in SCENARIOS {
        let shadow = shadow_of(scenario);
        // Without a mirror, the slow shadow is the gray instance all the same.
        let gray = shadow.unwrap_or(slow).0;
        let (addr, pid) = children.gateway(base, gray, shadow.is_some());
        targets.push(Target {
            proxy: Proxy::Gateway,
            scenario,
            addr,
            pid,
            shadow,
        });
    }
    if nginx_version.is_some() {
        for scenario in SCENARIOS {
            let shadow = shadow_of(scenario);
            let (addr, pid) = children.nginx(base, shadow.map(|(addr, _)| addr));
            targets.push(Target {
                proxy: Proxy::Nginx,
                scenario,
                addr,
                pid,
                shadow,
            });
        }
    } else {
        eprintln!("nginx is not on the PATH (or MIRROR_NGINX=0): its rows are skipped");
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // (conns, target) → one sample a round.
    let mut samples: HashMap<(usize, usize), Vec<Sample>> = HashMap::new();
    let finished = runtime.block_on(async {
        let bench = async {
            // Each target answers, with baseline's answer.
            for target in &targets {
                let mut sender = connect(target.addr).await;
                let (status, body, _) = get(&mut sender, target.addr, "/svc/item").await.unwrap();
                assert_eq!(
                    (status, &body[..]),
                    (StatusCode::OK, ITEM.as_bytes()),
                    "{:?} {:?}",
                    target.proxy,
                    target.scenario
                );
            }
            for round in 0..rounds {
                eprintln!("round {} of {rounds}", round + 1);
                for &conns in &conns_set {
                    // The proxies and the scenarios in an order of this round's.
                    let mut order: Vec<usize> = (0..targets.len()).collect();
                    order.sort_by_key(|&i| {
                        let t = &targets[i];
                        let proxy = (t.proxy as usize + round) % 2;
                        let scenario = (t.scenario as usize + round) % SCENARIOS.len();
                        (proxy, scenario)
                    });
                    for i in order {
                        let t = &targets[i];
                        let sample = load(t, conns, secs).await;
                        eprintln!(
                            "  {conns:>3} conns  {:<7} {:<11}  {:>6.0} req/s  p50 {:>7} ms  \
                             p90 {:>7} p99 {:>7} p99.9 {:>7} ms  CPU {:>5} µs/req (copies' thread {:>5})  shadow: {} copies/req, CPU {} µs/req, \
                             {} connections  errors {}  reconnects {}",
                            t.proxy.name(),
                            t.scenario.name(),
                            sample.rps,
                            fig(ms(sample.p50)),
                            fig(ms(sample.p90)),
                            fig(ms(sample.p99)),
                            fig(ms(sample.p999)),
                            fig(sample.cpu),
                            fig(sample.copies_cpu),
                            fig(sample.copies),
                            fig(sample.shadow_cpu),
                            sample.shadow_connections,
                            sample.errors,
                            sample.reconnects,
                        );
                        samples.entry((conns, i)).or_default().push(sample);
                    }
                }
            }
        };
        tokio::select! {
            () = bench => true,
            () = interrupted() => false,
        }
    });
    drop(runtime);
    if !finished {
        eprintln!("interrupted: no table");
        return;
    }

    let mut table = format!(
        "Mirror cost: `GET /svc/item`, closed loop over kept-alive HTTP/1.1 connections; \
         baseline answers after {} ms, the slow shadow after {} ms, the dead shadow never; \
         gateway `workers = 1` (mirror `timeout_ms = 5000`, `max_in_flight` 256), {} with \
         `worker_processes 1` (mirror `proxy_read_timeout 5s`); {rounds} interleaved \
         round(s) of {} s each; medians over the rounds; ratios to the same proxy's \
         no-mirror scenario of the same round, as median (min–max); *within 5 %*: both \
         median ratios within 5 % of 1; CPU per request of the proxy (the gateway's \
         process, nginx's worker), of the gateway's copies' thread within it, and of the \
         shadow; copies/req: what reached the shadow per user request; {}.\n\n\
         | conns | proxy | mirror | req/s | p50 ms | p99 ms | req/s ÷ no mirror | p99 ÷ no mirror | within 5 % | CPU µs/req | of which copies' thread | shadow CPU µs/req | copies/req |\n\
         |---:|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|\n",
        fig(delay_ms),
        fig(shadow_delay_ms),
        nginx_version
            .as_deref()
            .unwrap_or("nginx (not on the PATH)"),
        fig(secs.as_secs_f64()),
        match (placement.pinned, placement.idle_shadow) {
            (true, true) =>
                "each proxy on CPU 0, the load, the instances and the shadows on CPU 1, the shadows at the lowest priority (standing for another host)",
            (true, false) =>
                "each proxy on CPU 0, the load, the instances and the shadows on CPU 1, the shadows at the load's priority",
            (false, true) =>
                "unpinned, the shadows at the lowest priority (standing for another host)",
            (false, false) => "unpinned, the shadows at the load's priority",
        },
    );
    let mut errors = Vec::new();
    for &conns in &conns_set {
        for (i, t) in targets.iter().enumerate() {
            let runs = &samples[&(conns, i)];
            let off = targets
                .iter()
                .position(|b| b.proxy == t.proxy && b.scenario == Scenario::Off)
                .unwrap();
            let offs = &samples[&(conns, off)];
            let column =
                |f: &dyn Fn(&Sample) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
            let (rps_ratio, p99_ratio, within) = if t.scenario == Scenario::Off {
                ("—".to_owned(), "—".to_owned(), "")
            } else {
                let rps: Vec<f64> = runs.iter().zip(offs).map(|(s, o)| s.rps / o.rps).collect();
                let p99: Vec<f64> = runs
                    .iter()
                    .zip(offs)
                    .map(|(s, o)| ms(s.p99) / ms(o.p99))
                    .collect();
                let ok = median(&rps) >= 0.95 && median(&p99) <= 1.05;
                (spread(&rps), spread(&p99), if ok { "yes" } else { "no" })
            };
            let (shadow_cpu, copies) = match t.shadow {
                Some(_) => (fig(column(&|s| s.shadow_cpu)), fig(column(&|s| s.copies))),
                None => ("—".to_owned(), "—".to_owned()),
            };
            let _ = writeln!(
                table,
                "| {conns} | {} | {} | {} | {} | {} | {rps_ratio} | {p99_ratio} | {within} | {} | {} | {shadow_cpu} | {copies} |",
                t.proxy.name(),
                t.scenario.name(),
                fig(column(&|s| s.rps)),
                fig(column(&|s| ms(s.p50))),
                fig(column(&|s| ms(s.p99))),
                fig(column(&|s| s.cpu)),
                match t.proxy {
                    Proxy::Gateway => fig(column(&|s| s.copies_cpu)),
                    Proxy::Nginx => "—".to_owned(),
                },
            );
            let failed: usize = runs.iter().map(|s| s.errors).sum();
            if failed > 0 {
                errors.push(format!(
                    "{conns} connections, {} {}: {failed} failed requests",
                    t.proxy.name(),
                    t.scenario.name()
                ));
            }
            let reconnects: usize = runs.iter().map(|s| s.reconnects).sum();
            if reconnects > 0 {
                errors.push(format!(
                    "{conns} connections, {} {}: {reconnects} connections closed by the proxy \
                     after an answer (opened anew, untimed)",
                    t.proxy.name(),
                    t.scenario.name()
                ));
            }
        }
    }
    if nginx_version.is_none() {
        table += "\nnginx was not on the PATH (or MIRROR_NGINX=0): its rows are skipped.\n";
    }
    for e in &errors {
        let _ = writeln!(table, "\n{e}");
    }
    let _ = writeln!(
        table,
        "\n(the sitting took {:.0} s)",
        began.elapsed().as_secs_f64()
    );
    println!("{table}");
    if let Err(e) = std::fs::write("/tmp/mirror-bench.md", &table) {
        eprintln!("cannot write /tmp/mirror-bench.md: {e}");
    }
    drop(children);
}
