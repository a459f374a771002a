//! Run with: cargo run --release -p example-bench-support --bin upstream -- --listen 127.0.0.1:9001 --id base-1
//!
//! A minimal HTTP/1.1 upstream for `scripts/bench-gateway`: it answers every request `200`
//! with its id as the body and three headers that let the bench check the routing:
//!
//! - `x-instance`: its id;
//! - `x-seen-lane`: the `x-gray-lane` header it received, or `-`;
//! - `x-seen-path`: the path and query it received (to check the `/svc` prefix was stripped).
//!
//! Options: `--listen ADDR` (required), `--id NAME` (required), `--threads N` (tokio worker
//! threads, default 1: a current-thread runtime). `--listen ADDR --id NAME` may be repeated to
//! serve several instances from one process (the n-th `--id` names the n-th `--listen`): the
//! bench runs its four upstreams that way, so that the CPU it shares with the load generator
//! switches between two processes rather than five.

use std::{convert::Infallible, net::SocketAddr, process::ExitCode, time::Duration};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const X_GRAY_LANE: HeaderName = HeaderName::from_static("x-gray-lane");
const X_INSTANCE: HeaderName = HeaderName::from_static("x-instance");
const X_SEEN_LANE: HeaderName = HeaderName::from_static("x-seen-lane");
const X_SEEN_PATH: HeaderName = HeaderName::from_static("x-seen-path");
const NO_LANE: HeaderValue = HeaderValue::from_static("-");

const USAGE: &str =
    "usage: upstream --listen ADDR --id NAME [--listen ADDR --id NAME ...] [--threads N]";

#[derive(Debug)]
struct Options {
    /// Each listener with the id it answers.
    instances: Vec<(SocketAddr, String)>,
    threads: usize,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut listen, mut id, mut threads) = (Vec::new(), Vec::new(), 1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("option `{flag}` expects a value"))
        };
        match flag.as_str() {
            "--listen" => {
                let raw = value()?;
                let addr = raw
                    .parse()
                    .map_err(|e| format!("`--listen {raw}`: expected IP:PORT ({e})"))?;
                listen.push(addr);
            }
            "--id" => {
                let raw = value()?;
                if raw.is_empty() || HeaderValue::from_str(&raw).is_err() {
                    return Err(format!(
                        "`--id {raw}`: expected a non-empty printable ASCII name"
                    ));
                }
                id.push(raw);
            }
            "--threads" => {
                let raw = value()?;
                threads = match raw.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("`--threads {raw}`: expected a positive integer")),
                };
            }
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    if listen.is_empty() || listen.len() != id.len() {
        return Err(format!(
            "expected one `--id NAME` per `--listen ADDR`, got {} `--listen` and {} `--id`",
            listen.len(),
            id.len()
        ));
    }
    Ok(Options {
        instances: listen.into_iter().zip(id).collect(),
        threads,
    })
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("upstream: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    example_bench_support::run("upstream", options.threads, false, serve(options))
}

async fn serve(options: Options) -> Result<(), String> {
    // Bind every listener before serving any, so a taken port fails the whole process.
    let mut listeners = Vec::with_capacity(options.instances.len());
    for (addr, id) in options.instances {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listeners.push((listener, id));
    }
    let mut instances = tokio::task::JoinSet::new();
    for (listener, id) in listeners {
        instances.spawn(serve_instance(listener, id));
    }
    while instances.join_next().await.is_some() {}
    Ok(())
}

async fn serve_instance(listener: TcpListener, id: String) {
    // Validated in `parse_args`; built once, cloned per response (a refcount, no copy).
    let instance = HeaderValue::from_str(&id).unwrap_or(NO_LANE);
    let body = Bytes::from(id);

    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                eprintln!("upstream: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (instance, body) = (instance.clone(), body.clone());
        let service = service_fn(move |req: Request<Incoming>| {
            let lane = req.headers().get(X_GRAY_LANE).cloned().unwrap_or(NO_LANE);
            let path = req
                .uri()
                .path_and_query()
                .and_then(|pq| HeaderValue::from_str(pq.as_str()).ok());
            let mut res = Response::new(Full::new(body.clone()));
            let headers = res.headers_mut();
            headers.insert(X_INSTANCE, instance.clone());
            headers.insert(X_SEEN_LANE, lane);
            if let Some(path) = path {
                headers.insert(X_SEEN_PATH, path);
            }
            // The request body (if any) is dropped unread; hyper drains or closes as needed.
            std::future::ready(Ok::<_, Infallible>(res))
        });
        tokio::spawn(async move {
            // Clients resetting connections is normal at the end of a load round.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
