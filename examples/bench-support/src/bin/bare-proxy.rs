//! Run with: cargo run --release -p example-bench-support --bin bare-proxy -- --listen 127.0.0.1:9000 --upstream 127.0.0.1:9001 --upstream 127.0.0.1:9002
//!
//! The "bare hyper reverse proxy" baseline of `scripts/bench-gateway`: no routing, no
//! staining, no metrics. It does the URL and header work every reverse proxy does and nothing
//! else, so the gateway's cost over it is the cost of its features:
//!
//! - round-robin over the `--upstream` addresses, with hyper-util's legacy pooled client
//!   (HTTP/1.1 keep-alive to the upstreams, `TCP_NODELAY` both sides);
//! - the first path segment is stripped (`/svc/x?q` → `/x?q`), as the gateway strips the
//!   service name;
//! - hop-by-hop headers (RFC 9110 §7.6.1, and those named in `Connection`) are removed both
//!   ways;
//! - bodies stream both ways: the server's `Incoming` body is the client's request body and
//!   the client's `Incoming` response body is the server's response body. The only per-request
//!   allocations are hyper's own and the rewritten path.
//!
//! An upstream failure answers `502` with an empty body, logged to stderr.
//!
//! Options: `--listen ADDR` (required), `--upstream ADDR` (one or more), `--threads N` (tokio
//! worker threads, default 1), `--multi-thread` (use tokio's multi-thread scheduler even
//! with one thread; by default one thread means the current-thread scheduler),
//! `--client legacy|gray` (default `legacy`: hyper-util's pooled client, what a hyper proxy
//! is usually written with; `gray`: gray-discovery's `HttpEndpoints`, the connections the
//! gateway uses, to separate the cost of the client from the cost of the gateway's features).

use std::{
    convert::Infallible,
    net::SocketAddr,
    process::ExitCode,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use bytes::Bytes;
use gray_core::Labels;
use gray_discovery::{
    Instance,
    http::{HttpEndpoint, HttpEndpoints, ResponseBody},
};
use http::{
    HeaderMap, HeaderName, Request, Response, StatusCode, Uri, Version,
    header::{
        CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING,
        UPGRADE,
    },
    uri::{Authority, PathAndQuery, Scheme},
};
use http_body_util::{Either, Empty};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use tokio::net::TcpListener;
use tower::{BoxError, Service};

const USAGE: &str = "usage: bare-proxy --listen ADDR --upstream ADDR [--upstream ADDR ...] \
                     [--threads N] [--multi-thread] [--client legacy|gray]";

/// `Keep-Alive` and `Proxy-Connection` have no constant in `http`.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The proxy's response body: the upstream's, streamed, or an empty one for a local error.
type ProxyBody = Either<Either<Incoming, ResponseBody>, Empty<Bytes>>;

#[derive(Debug)]
struct Options {
    listen: SocketAddr,
    upstreams: Vec<SocketAddr>,
    threads: usize,
    multi_thread: bool,
    gray_client: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut listen, mut upstreams, mut threads, mut multi_thread) = (None, Vec::new(), 1, false);
    let mut gray_client = false;
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("option `{flag}` expects a value"))
        };
        let addr = |raw: String| {
            raw.parse::<SocketAddr>()
                .map_err(|e| format!("`{flag} {raw}`: expected IP:PORT ({e})"))
        };
        match flag.as_str() {
            "--listen" => listen = Some(addr(value()?)?),
            "--upstream" => upstreams.push(addr(value()?)?),
            "--threads" => {
                let raw = value()?;
                threads = match raw.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(format!("`--threads {raw}`: expected a positive integer")),
                };
            }
            "--multi-thread" => multi_thread = true,
            "--client" => {
                gray_client = match value()?.as_str() {
                    "legacy" => false,
                    "gray" => true,
                    other => {
                        return Err(format!("`--client {other}`: expected `legacy` or `gray`"));
                    }
                }
            }
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    if upstreams.is_empty() {
        return Err("at least one `--upstream ADDR` is required".into());
    }
    Ok(Options {
        listen: listen.ok_or("missing `--listen ADDR`")?,
        upstreams,
        threads,
        multi_thread,
        gray_client,
    })
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("bare-proxy: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    example_bench_support::run(
        "bare-proxy",
        options.threads,
        options.multi_thread,
        serve(options),
    )
}

/// The client the proxy forwards with.
#[derive(Debug)]
enum Upstreams {
    /// hyper-util's pooled client.
    Legacy(Box<Client<HttpConnector, Incoming>>),
    /// gray-discovery's endpoints, one per upstream, in the same order as `upstreams`.
    Gray(Vec<HttpEndpoint<HttpConnector, Incoming>>),
}

/// What every request reads: the client and the upstreams to take turns on.
#[derive(Debug)]
struct Proxy {
    client: Upstreams,
    upstreams: Vec<Authority>,
    next: AtomicUsize,
}

impl Proxy {
    fn new(upstreams: &[SocketAddr], gray_client: bool) -> Result<Self, String> {
        let client = if gray_client {
            let endpoints = HttpEndpoints::new();
            let mut list = Vec::new();
            for (i, addr) in upstreams.iter().enumerate() {
                let instance = Instance::new(
                    format!("upstream-{i}")
                        .parse()
                        .map_err(|e| format!("{e}"))?,
                    addr.to_string()
                        .parse()
                        .map_err(|e| format!("{addr}: {e}"))?,
                    Labels::new(),
                );
                list.push(endpoints.endpoint(instance));
            }
            Upstreams::Gray(list)
        } else {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            Upstreams::Legacy(Box::new(
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .build(connector),
            ))
        };
        let upstreams = upstreams
            .iter()
            .map(|addr| {
                Authority::try_from(addr.to_string())
                    .map_err(|e| format!("upstream {addr} is not a valid authority: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            client,
            upstreams,
            next: AtomicUsize::new(0),
        })
    }

    /// The upstream URI for `uri`: upstream `turn`, first path segment stripped.
    fn upstream_uri(&self, uri: &Uri, turn: usize) -> Result<Uri, http::Error> {
        let path_and_query = match uri.path_and_query().map(PathAndQuery::as_str) {
            Some(pq) => strip_first_segment(pq)?,
            None => PathAndQuery::from_static("/"),
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.upstreams[turn].clone());
        parts.path_and_query = Some(path_and_query);
        Ok(Uri::from_parts(parts)?)
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Result<Response<ProxyBody>, Infallible> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.upstreams.len();
        match self.upstream_uri(req.uri(), turn) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(_) => return Ok(local_response(StatusCode::BAD_REQUEST)),
        }
        *req.version_mut() = Version::HTTP_11;
        remove_hop_by_hop(req.headers_mut());
        let response = match &self.client {
            Upstreams::Legacy(client) => client
                .request(req)
                .await
                .map(|res| res.map(Either::Left))
                .map_err(BoxError::from),
            Upstreams::Gray(endpoints) => endpoints[turn]
                .clone()
                .call(req)
                .await
                .map(|res| res.map(Either::Right)),
        };
        match response {
            Ok(mut res) => {
                remove_hop_by_hop(res.headers_mut());
                Ok(res.map(Either::Left))
            }
            Err(e) => {
                eprintln!("bare-proxy: upstream request failed: {e}");
                Ok(local_response(StatusCode::BAD_GATEWAY))
            }
        }
    }
}

/// `/svc/x?q` → `/x?q`, `/svc` → `/`, `/svc?q` → `/?q`; anything not starting with `/`
/// (`*` of `OPTIONS *`) is kept.
fn strip_first_segment(pq: &str) -> Result<PathAndQuery, http::uri::InvalidUri> {
    let Some(after_slash) = pq.strip_prefix('/') else {
        return PathAndQuery::try_from(pq);
    };
    match after_slash.find(['/', '?']) {
        Some(end) if after_slash.as_bytes()[end] == b'/' => {
            PathAndQuery::try_from(&after_slash[end..])
        }
        Some(end) => PathAndQuery::try_from(format!("/{}", &after_slash[end..])),
        None => Ok(PathAndQuery::from_static("/")),
    }
}

/// Removes the headers that describe one connection rather than the message: the fixed
/// hop-by-hop set and every header the `Connection` header names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::try_from(name.trim()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
        headers.remove(CONNECTION);
    }
    for name in [
        KEEP_ALIVE,
        PROXY_CONNECTION,
        PROXY_AUTHENTICATE,
        PROXY_AUTHORIZATION,
        TE,
        TRAILER,
        TRANSFER_ENCODING,
        UPGRADE,
    ] {
        headers.remove(name);
    }
}

fn local_response(status: StatusCode) -> Response<ProxyBody> {
    let mut res = Response::new(Either::Right(Empty::new()));
    *res.status_mut() = status;
    res
}

async fn serve(options: Options) -> Result<(), String> {
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.listen))?;
    // Lives as long as the process: every connection borrows it, no per-request refcount.
    let proxy: &'static Proxy = Box::leak(Box::new(Proxy::new(
        &options.upstreams,
        options.gray_client,
    )?));

    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                eprintln!("bare-proxy: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            // Clients resetting connections is normal at the end of a load round.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(|req| proxy.forward(req)))
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_first_segment() {
        for (input, expected) in [
            ("/svc/x", "/x"),
            ("/svc/x/y?q=1", "/x/y?q=1"),
            ("/svc/", "/"),
            ("/svc", "/"),
            ("/svc?q=1", "/?q=1"),
            ("/", "/"),
            ("*", "*"),
        ] {
            assert_eq!(
                strip_first_segment(input).unwrap().as_str(),
                expected,
                "{input}"
            );
        }
    }

    #[test]
    fn removes_hop_by_hop_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(CONNECTION, "keep-alive, x-private".parse().unwrap());
        headers.insert(KEEP_ALIVE, "timeout=5".parse().unwrap());
        headers.insert("x-private", "1".parse().unwrap());
        headers.insert(TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert("x-gray-lane", "gray".parse().unwrap());
        remove_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers["x-gray-lane"], "gray");
    }
}
