//! What the abuse tests share: an upstream that counts what it is sent, the gateway binary
//! as a child process (its memory and descriptors read from /proc), the raw-frame HTTP/2
//! client (`tests/python/h2_abuse.py`), and well-behaved clients that measure their latency
//! meanwhile.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use gray_test_support::{TempDir, WAIT, child::read_stdout_until};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, StreamBody, combinators::BoxBody};
use hyper::{body::Frame, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

/// What the upstream counts.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Connections accepted.
    pub(crate) accepted: AtomicUsize,
    /// Connections open now.
    pub(crate) open: AtomicUsize,
    /// Requests received (heads read): requests the gateway forwarded.
    pub(crate) requests: AtomicUsize,
}

/// An HTTP/1.1 upstream on loopback: `/big` answers 4 MiB, `/upload` reads the request
/// body to its end, then answers `ok`; anything else is `ok` at once.
pub(crate) async fn upstream() -> (SocketAddr, Arc<Counts>) {
    // A thousand upstream connections need more descriptors than a default soft limit.
    gray_gateway::raise_nofile_limit();
    // Small send buffers (accepted connections inherit them): a thousand responses that
    // nobody reads fill the kernel with a few hundred MiB, not gigabytes.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(64 * 1024).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1024).unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let shared = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors: the connection waits in the backlog.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            shared.accepted.fetch_add(1, Ordering::SeqCst);
            shared.open.fetch_add(1, Ordering::SeqCst);
            let counts = shared.clone();
            tokio::spawn(async move {
                let per_request = counts.clone();
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    per_request.requests.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let body: BoxBody<Bytes, hyper::Error> = match req.uri().path() {
                            "/big" => BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
                                (0..64).map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; 65536])))),
                            ))),
                            "/upload" => {
                                req.into_body().collect().await?;
                                text("ok")
                            }
                            _ => text("ok"),
                        };
                        Ok::<_, hyper::Error>(Response::new(body))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                counts.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, counts)
}

fn text(s: &'static str) -> BoxBody<Bytes, hyper::Error> {
    http_body_util::Full::new(Bytes::from_static(s.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// The gateway binary, running; killed when dropped.
pub(crate) struct Gateway {
    child: Child,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    _dir: TempDir,
}

impl Gateway {
    /// Starts the gateway in front of `upstream` (service `svc`) with the `limits` keys,
    /// under a descriptor limit of `nofile` when given (with `prlimit`).
    pub(crate) async fn start(upstream: SocketAddr, limits: &str, nofile: Option<u64>) -> Gateway {
        let dir = TempDir::new("h2-abuse");
        std::fs::write(
            dir.path().join("instances.toml"),
            format!("[[services.svc]]\nid = \"svc-1\"\naddress = \"{upstream}\"\n"),
        )
        .unwrap();
        let config = dir.path().join("gateway.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ninstances = \"instances.toml\"\nworkers = 1\n\
                 {limits}\n[services.svc]\n"
            ),
        )
        .unwrap();
        let bin = env!("CARGO_BIN_EXE_gray-gateway");
        let mut command = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway binary starts");
        let addr = read_stdout_until(&mut child, |line| {
            line.strip_prefix("gateway listening on http://")
                .map(|addr| addr.parse().unwrap())
        })
        .await;
        Gateway {
            child,
            addr,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("the gateway runs")
    }

    /// Its resident memory, in bytes.
    pub(crate) fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kb * 1024
    }

    /// Its open file descriptors.
    pub(crate) fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

/// Runs the raw-frame client (`h2_abuse.py MODE ADDR PATH ARGS…`) to its end; its summary.
pub(crate) async fn attack(
    mode: &str,
    addr: SocketAddr,
    path: &str,
    args: &[&str],
) -> serde_json::Value {
    let mut child = python(mode, addr, path, args)
        .spawn()
        .expect("python3 runs");
    let out = tokio::time::timeout(Duration::from_secs(120), async {
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut last = None;
        while let Some(line) = lines.next_line().await.unwrap() {
            last = Some(line);
        }
        last
    })
    .await
    .expect("the attack ends in time")
    .expect("the attack printed its summary (is h2 installed? scripts/test installs it)");
    serde_json::from_str(&out).unwrap()
}

/// The raw-frame client as a command, its stdout piped.
pub(crate) fn python(mode: &str, addr: SocketAddr, path: &str, args: &[&str]) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/h2_abuse.py");
    let mut command = Command::new("python3");
    command
        .arg(script)
        .arg(mode)
        .arg(addr.to_string())
        .arg(path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// The client IP the well-behaved clients' requests come from, behind a trusted proxy
/// (the gateway's loopback peer) when the gateway trusts it.
pub(crate) const PROBE_CLIENT: &str = "198.51.100.7";

/// The client IP of the attacks, likewise.
pub(crate) const ATTACKER: &str = "203.0.113.9";

/// Well-behaved clients (HTTP/1.1 and HTTP/2) asking `GET /svc/x` in a loop until stopped.
pub(crate) struct Probe {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    seen: Arc<Mutex<Vec<(Duration, Result<u16, String>)>>>,
}

/// What the well-behaved clients saw.
#[derive(Debug)]
pub(crate) struct Seen {
    /// Answers with their status.
    pub(crate) statuses: Vec<u16>,
    /// Requests that failed, with why.
    pub(crate) errors: Vec<String>,
    /// The 99th percentile of their latency.
    pub p99: Duration,
}

impl Seen {
    /// Asserts that every request of the well-behaved clients was answered (none failed),
    /// and, with `all_200`, every one with 200.
    pub(crate) fn assert_served(&self, all_200: bool) {
        assert!(
            self.errors.is_empty(),
            "probes failed: {:?}",
            &self.errors[..self.errors.len().min(5)]
        );
        assert!(
            !all_200 || self.statuses.iter().all(|s| *s == 200),
            "probes got non-200 answers"
        );
    }
}

impl Counts {
    /// Waits (at most `WAIT`) until at most `n` upstream connections are open.
    pub(crate) async fn until_open_at_most(&self, n: usize) {
        let deadline = std::time::Instant::now() + WAIT;
        while self.open.load(Ordering::SeqCst) > n {
            assert!(
                std::time::Instant::now() < deadline,
                "upstream connections left open: {}",
                self.open.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Probe {
    pub(crate) fn start(gateway: SocketAddr) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let uri: http::Uri = format!("http://{gateway}/svc/x").parse().unwrap();
        let tasks = [false, true]
            .into_iter()
            .map(|h2| {
                let client = Client::builder(TokioExecutor::new())
                    .http2_only(h2)
                    .build_http::<Empty<Bytes>>();
                let (stop, seen, uri) = (stop.clone(), seen.clone(), uri.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let began = Instant::now();
                        let result = tokio::time::timeout(WAIT, async {
                            let request = Request::get(uri.clone())
                                .header("x-forwarded-for", PROBE_CLIENT)
                                .body(Empty::new())?;
                            let response = client.request(request).await?;
                            let status = response.status().as_u16();
                            response.into_body().collect().await?;
                            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(status)
                        })
                        .await
                        .map_err(|_| "timed out".to_owned())
                        .and_then(|r| r.map_err(|e| format!("{e:?}")));
                        seen.lock().unwrap().push((began.elapsed(), result));
                        // About 100 requests a second from each client.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        Probe { stop, tasks, seen }
    }

    pub(crate) async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        let mut latencies: Vec<Duration> = seen.iter().map(|(d, _)| *d).collect();
        latencies.sort();
        let p99 = latencies
            .get((latencies.len() * 99 / 100).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default();
        let (mut statuses, mut errors) = (Vec::new(), Vec::new());
        for (_, result) in seen {
            match result {
                Ok(status) => statuses.push(status),
                Err(e) => errors.push(e),
            }
        }
        Seen {
            statuses,
            errors,
            p99,
        }
    }
}
