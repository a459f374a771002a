//! Run with: cargo run --profile dist -p bench-support --bin bare-proxy -- --listen 127.0.0.1:9000 --baseline 127.0.0.1:9001 --gray 127.0.0.1:9002
//!
//! The minimal hyper proxy that `cargo xtask bench-gateway` measures the gateway against: the
//! routing the gateway does in that benchmark, and nothing else the gateway does (no rules,
//! no stripping of untrusted stains, no `X-Forwarded-For`, no metrics, no timeouts, no
//! admin). What is left is what any hyper reverse proxy with header routing does:
//!
//! - tokio's current-thread runtime (the gateway's with `workers = 1`), one hyper HTTP/1
//!   server connection task per client, `TCP_NODELAY` both sides;
//! - `x-gray-lane: gray` (value compared ignoring ASCII case, as the gateway lowercases
//!   lanes) sends a request to the `--gray` upstreams, anything else to the `--baseline`
//!   ones; the header itself is forwarded as it came;
//! - round-robin within the lane;
//! - the first path segment is stripped (`/svc/x?q` → `/x?q`), as the gateway strips the
//!   service name;
//! - hop-by-hop headers (RFC 9110 §7.6.1, and those named in `Connection`) are removed both
//!   ways;
//! - bodies stream both ways: the server's `Incoming` body is the client's request body and
//!   the client's response body is the server's response body.
//!
//! The client is hyper-util's legacy pooled client (`--client legacy`, the default: what a
//! hyper proxy is usually written with), or gray-discovery's `HttpEndpoints`
//! (`--client gray`: the connections the gateway uses, which separates the cost of the
//! client from the cost of the gateway's features). An upstream failure answers `502` with
//! an empty body, logged to stderr.
//!
//! Options: `--listen ADDR` (required), `--baseline ADDR` and `--gray ADDR` (each one or
//! more), `--client legacy|gray`.

use std::{
    convert::Infallible,
    net::SocketAddr,
    process::ExitCode,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use bench_support::X_GRAY_LANE;
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

const USAGE: &str = "usage: bare-proxy --listen ADDR --baseline ADDR [--baseline ADDR ...] \
                     --gray ADDR [--gray ADDR ...] [--client legacy|gray]";

/// `Keep-Alive` and `Proxy-Connection` have no constant in `http`.
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The proxy's response body: the upstream's, streamed, or an empty one for a local error.
type ProxyBody = Either<Either<Incoming, ResponseBody>, Empty<Bytes>>;

#[derive(Debug)]
struct Options {
    listen: SocketAddr,
    baseline: Vec<SocketAddr>,
    gray: Vec<SocketAddr>,
    gray_client: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut listen, mut baseline, mut gray, mut gray_client) =
        (None, Vec::new(), Vec::new(), false);
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
            "--baseline" => baseline.push(addr(value()?)?),
            "--gray" => gray.push(addr(value()?)?),
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
    if baseline.is_empty() || gray.is_empty() {
        return Err("at least one `--baseline ADDR` and one `--gray ADDR` are required".into());
    }
    Ok(Options {
        listen: listen.ok_or("missing `--listen ADDR`")?,
        baseline,
        gray,
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
    bench_support::run("bare-proxy", 1, false, serve(options))
}

/// One lane's upstreams, taken in turn.
#[derive(Debug)]
struct Lane {
    /// Their authorities, for hyper-util's client (it wants absolute URIs).
    authorities: Vec<Authority>,
    /// Their endpoints, in the same order, with `--client gray`.
    endpoints: Vec<HttpEndpoint<HttpConnector, Incoming>>,
    next: AtomicUsize,
}

impl Lane {
    fn new(
        name: &str,
        upstreams: &[SocketAddr],
        endpoints: Option<&HttpEndpoints<HttpConnector, Incoming>>,
    ) -> Result<Self, String> {
        let mut lane = Lane {
            authorities: Vec::with_capacity(upstreams.len()),
            endpoints: Vec::new(),
            next: AtomicUsize::new(0),
        };
        for (i, addr) in upstreams.iter().enumerate() {
            lane.authorities.push(
                Authority::try_from(addr.to_string())
                    .map_err(|e| format!("upstream {addr} is not a valid authority: {e}"))?,
            );
            if let Some(endpoints) = endpoints {
                let id = format!("{name}-{i}").parse().map_err(|e| format!("{e}"))?;
                let address = addr
                    .to_string()
                    .parse()
                    .map_err(|e| format!("upstream {addr}: {e}"))?;
                lane.endpoints
                    .push(endpoints.endpoint(Instance::new(id, address, Labels::new())));
            }
        }
        Ok(lane)
    }

    /// The index of the upstream whose turn it is.
    fn turn(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.authorities.len()
    }
}

/// What every request reads: the client and the two lanes.
#[derive(Debug)]
struct Proxy {
    /// hyper-util's pooled client, unless `--client gray`.
    legacy: Option<Client<HttpConnector, Incoming>>,
    baseline: Lane,
    gray: Lane,
}

impl Proxy {
    fn new(options: &Options) -> Result<Self, String> {
        let endpoints = options.gray_client.then(HttpEndpoints::new);
        let legacy = (!options.gray_client).then(|| {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(connector)
        });
        Ok(Proxy {
            legacy,
            baseline: Lane::new("baseline", &options.baseline, endpoints.as_ref())?,
            gray: Lane::new("gray", &options.gray, endpoints.as_ref())?,
        })
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Result<Response<ProxyBody>, Infallible> {
        let is_gray = req
            .headers()
            .get(X_GRAY_LANE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gray"));
        let lane = if is_gray { &self.gray } else { &self.baseline };
        let turn = lane.turn();
        let path_and_query = match req.uri().path_and_query().map(PathAndQuery::as_str) {
            Some(pq) => match strip_first_segment(pq) {
                Ok(pq) => pq,
                Err(_) => return Ok(local_response(StatusCode::BAD_REQUEST)),
            },
            None => PathAndQuery::from_static("/"),
        };
        *req.version_mut() = Version::HTTP_11;
        remove_hop_by_hop(req.headers_mut());
        let response = match &self.legacy {
            Some(client) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = Some(Scheme::HTTP);
                parts.authority = Some(lane.authorities[turn].clone());
                parts.path_and_query = Some(path_and_query);
                match Uri::from_parts(parts) {
                    Ok(uri) => *req.uri_mut() = uri,
                    Err(_) => return Ok(local_response(StatusCode::BAD_REQUEST)),
                }
                client
                    .request(req)
                    .await
                    .map(|res| res.map(Either::Left))
                    .map_err(BoxError::from)
            }
            None => {
                // An endpoint sends origin-form requests to its own instance.
                *req.uri_mut() = Uri::from(path_and_query);
                let mut endpoint = lane.endpoints[turn].clone();
                match std::future::poll_fn(|cx| endpoint.poll_ready(cx)).await {
                    Ok(()) => endpoint.call(req).await.map(|res| res.map(Either::Right)),
                    Err(e) => Err(e),
                }
            }
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
    let proxy: &'static Proxy = Box::leak(Box::new(Proxy::new(&options)?));
    accept(listener, proxy).await;
    Ok(())
}

/// Serves each connection `listener` accepts through `proxy`, forever.
async fn accept(listener: TcpListener, proxy: &'static Proxy) {
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

    /// Four upstreams (base-1, base-2, gray-1, gray-2) on loopback, and options naming them.
    async fn upstreams(gray_client: bool) -> Options {
        let mut options = Options {
            listen: "127.0.0.1:0".parse().unwrap(),
            baseline: Vec::new(),
            gray: Vec::new(),
            gray_client,
        };
        for id in ["base-1", "base-2", "gray-1", "gray-2"] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(bench_support::serve_upstream(listener, id.parse().unwrap()));
            match id.starts_with("gray") {
                true => options.gray.push(addr),
                false => options.baseline.push(addr),
            }
        }
        options
    }

    #[tokio::test]
    async fn routes_by_lane_round_robin_with_the_service_stripped() {
        for gray_client in [false, true] {
            let options = upstreams(gray_client).await;
            let listener = TcpListener::bind(options.listen).await.unwrap();
            let addr = listener.local_addr().unwrap();
            let proxy: &'static Proxy = Box::leak(Box::new(Proxy::new(&options).unwrap()));
            tokio::spawn(accept(listener, proxy));
            let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
            for (lane, expected) in [
                (None, ["base-1", "base-2"]),
                (Some("canary"), ["base-1", "base-2"]),
                (Some("gray"), ["gray-1", "gray-2"]),
                (Some("GRAY"), ["gray-1", "gray-2"]),
            ] {
                let mut seen = Vec::new();
                for _ in 0..4 {
                    let mut req = Request::get(format!("http://{addr}/svc/x/y?q=1"));
                    if let Some(lane) = lane {
                        req = req.header(X_GRAY_LANE, lane);
                    }
                    let res = client
                        .request(req.body(Empty::new()).unwrap())
                        .await
                        .unwrap();
                    assert_eq!(
                        res.status(),
                        StatusCode::OK,
                        "{lane:?}, gray client: {gray_client}"
                    );
                    let headers = res.headers();
                    assert_eq!(headers[bench_support::X_SEEN_PATH], "/x/y?q=1");
                    assert_eq!(headers[bench_support::X_SEEN_LANE], lane.unwrap_or("-"));
                    seen.push(
                        headers[bench_support::X_INSTANCE]
                            .to_str()
                            .unwrap()
                            .to_owned(),
                    );
                }
                // Each lane takes turns from where it stopped: two requests per instance.
                seen.sort();
                let mut want: Vec<_> = expected
                    .iter()
                    .chain(&expected)
                    .map(|s| s.to_string())
                    .collect();
                want.sort();
                assert_eq!(seen, want, "{lane:?}, gray client: {gray_client}");
            }
        }
    }

    #[test]
    fn lanes_need_upstreams_on_both_sides() {
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let options = parse_args(
            args(&[
                "--listen",
                "127.0.0.1:1",
                "--baseline",
                "127.0.0.1:2",
                "--gray",
                "127.0.0.1:3",
                "--gray",
                "127.0.0.1:4",
            ])
            .into_iter(),
        )
        .unwrap();
        assert_eq!(options.baseline.len(), 1);
        assert_eq!(options.gray.len(), 2);
        let err =
            parse_args(args(&["--listen", "127.0.0.1:1", "--baseline", "127.0.0.1:2"]).into_iter())
                .unwrap_err();
        assert!(err.contains("--gray"), "{err}");
    }
}
