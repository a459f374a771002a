//! What the two benchmark binaries (`upstream`, `bare-proxy`) share: running their server on
//! a tokio runtime of the requested size and turning the outcome into an exit code, and the
//! upstream instance itself (which the proxy's tests route to).

use std::{convert::Infallible, future::Future, process::ExitCode, time::Duration};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::Full;
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::net::TcpListener;

/// The lane header the benchmark's clients send.
pub const X_GRAY_LANE: HeaderName = HeaderName::from_static("x-gray-lane");
/// The response header naming the upstream instance that answered.
pub const X_INSTANCE: HeaderName = HeaderName::from_static("x-instance");
/// The response header echoing the `x-gray-lane` the upstream received (`-` without one).
pub const X_SEEN_LANE: HeaderName = HeaderName::from_static("x-seen-lane");
/// The response header echoing the path and query the upstream received.
pub const X_SEEN_PATH: HeaderName = HeaderName::from_static("x-seen-path");
const NO_LANE: HeaderValue = HeaderValue::from_static("-");

/// Runs `serve` on tokio's current-thread scheduler when `threads` is 1 and
/// `multi_thread` is false, else on the multi-thread scheduler with `threads` workers; an
/// error (the runtime's or `serve`'s) is printed as `name: message` and exits with 1.
///
/// ```
/// let code = bench_support::run("demo", 1, false, async { Ok(()) });
/// assert_eq!(code, std::process::ExitCode::SUCCESS);
/// ```
pub fn run(
    name: &str,
    threads: usize,
    multi_thread: bool,
    serve: impl Future<Output = Result<(), String>>,
) -> ExitCode {
    let runtime = if threads == 1 && !multi_thread {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let result = runtime
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))
        .and_then(|runtime| runtime.block_on(serve));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{name}: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Serves one upstream instance on `listener`, forever: every request is answered `200`
/// with `id` as the body and in [`X_INSTANCE`], the lane header it received in
/// [`X_SEEN_LANE`] and the path and query it received in [`X_SEEN_PATH`], over HTTP/1.1
/// keep-alive connections with `TCP_NODELAY`.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
/// let addr = listener.local_addr().unwrap();
/// tokio::spawn(bench_support::serve_upstream(listener, "base-1".parse().unwrap()));
/// let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
///     .build_http::<http_body_util::Empty<bytes::Bytes>>();
/// let req = http::Request::get(format!("http://{addr}/x?q=1")).body(Default::default()).unwrap();
/// let res = client.request(req).await.unwrap();
/// assert_eq!(res.headers()[bench_support::X_INSTANCE], "base-1");
/// assert_eq!(res.headers()[bench_support::X_SEEN_PATH], "/x?q=1");
/// # });
/// ```
pub async fn serve_upstream(listener: TcpListener, id: HeaderValue) {
    // Built once, cloned per response (a refcount, no copy).
    let body = Bytes::copy_from_slice(id.as_bytes());
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
        let (instance, body) = (id.clone(), body.clone());
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
            // HTTP/1.1, or HTTP/2 by prior knowledge (h2c): the gateway's `protocol = "h2c"`.
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
