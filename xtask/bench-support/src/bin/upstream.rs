//! Run with: cargo run --profile dist -p bench-support --bin upstream -- --listen 127.0.0.1:9001 --id base-1
//!
//! A minimal HTTP/1.1 upstream for `cargo xtask bench-gateway`: it answers every request `200`
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

use std::{net::SocketAddr, process::ExitCode};

use http::HeaderValue;
use tokio::net::TcpListener;

const USAGE: &str =
    "usage: upstream --listen ADDR --id NAME [--listen ADDR --id NAME ...] [--threads N]";

#[derive(Debug)]
struct Options {
    /// Each listener with the id it answers.
    instances: Vec<(SocketAddr, HeaderValue)>,
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
                match HeaderValue::from_str(&raw) {
                    Ok(value) if !raw.is_empty() => id.push(value),
                    _ => {
                        return Err(format!(
                            "`--id {raw}`: expected a non-empty printable ASCII name"
                        ));
                    }
                }
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
    bench_support::run("upstream", options.threads, false, serve(options))
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
        instances.spawn(bench_support::serve_upstream(listener, id));
    }
    while instances.join_next().await.is_some() {}
    Ok(())
}
