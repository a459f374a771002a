//! `HttpEndpoints::with_connector` with a connector of the user's own: instances reached
//! over Unix sockets. The connector is a small `tower::Service<Uri>` that maps an
//! instance's authority to a socket path and yields `TokioIo<UnixStream>`; the instances
//! are hyper servers on Unix sockets in a temporary directory; a `Balance` picks among the
//! endpoints by the request's stain, and each endpoint keeps its connection alive.

#![cfg(unix)]

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    io,
    path::PathBuf,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use gray_balance::BalanceLayer;
use gray_core::{Labels, Lane, Stain};
use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
use gray_policy::Policy;
use gray_test_support::{TempDir, WAIT};
use gray_tests::until;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tower::{BoxError, Service, ServiceExt};

/// Connects to the Unix socket of an instance, found by its authority (`host:port`).
#[derive(Clone)]
struct UnixConnector {
    sockets: Arc<HashMap<String, PathBuf>>,
}

impl Service<Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<UnixStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let path = uri
            .authority()
            .and_then(|a| self.sockets.get(a.as_str()))
            .cloned();
        Box::pin(async move {
            let path = path.ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("no socket for {uri}"))
            })?;
            Ok(TokioIo::new(UnixStream::connect(path).await?))
        })
    }
}

/// A hyper server on the Unix socket `path` that answers `NAME host=HOST`; returns how many
/// connections it accepted so far.
fn serve(path: &PathBuf, name: &'static str) -> Arc<AtomicUsize> {
    let listener = UnixListener::bind(path).expect("bind the Unix socket");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<_>| async move {
                    let host = req
                        .headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let body = format!("{name} host={host}");
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    accepted
}

#[tokio::test]
async fn a_balance_reaches_instances_over_unix_sockets() {
    let dir = TempDir::new("unix");
    let (base_path, gray_path) = (dir.path().join("base.sock"), dir.path().join("gray.sock"));
    let base_accepted = serve(&base_path, "base");
    let gray_accepted = serve(&gray_path, "gray");

    // The instances' addresses are names the connector knows, not TCP ports.
    let connector = UnixConnector {
        sockets: Arc::new(HashMap::from([
            ("orders-base.local:80".to_owned(), base_path),
            ("orders-gray.local:80".to_owned(), gray_path),
        ])),
    };
    let instance = |id: &str, address: &str, labels: &[(&str, &str)]| {
        Instance::new(
            id.parse().expect("an id"),
            address.parse().expect("an address"),
            Labels::from_iter(labels.iter().copied()),
        )
    };
    let instances = StaticDiscover::new([
        instance("base", "orders-base.local:80", &[]),
        instance("gray", "orders-gray.local:80", &[("gray", "true")]),
    ]);
    let endpoints = HttpEndpoints::<_, Empty<Bytes>>::with_connector(connector);
    let balance = BalanceLayer::new("orders", Policy::new()).build(endpoints.discover(instances));
    until(WAIT, "both endpoints in the balancer", || {
        balance.len() == 2
    })
    .await;

    let send = |stain: Stain| {
        let balance = balance.clone();
        async move {
            let mut req = Request::get("http://orders/items")
                .body(Empty::<Bytes>::new())
                .expect("a request");
            req.extensions_mut().insert(stain);
            let res = balance.oneshot(req).await?;
            let body = res.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>(String::from_utf8_lossy(&body).into_owned())
        }
    };
    // The request names no `Host`: each endpoint sets its instance's authority.
    let gray = Stain::in_lane(Lane::new("gray").expect("a lane"));
    for _ in 0..5 {
        assert_eq!(
            send(gray.clone()).await.expect("sent over the gray socket"),
            "gray host=orders-gray.local:80"
        );
        assert_eq!(
            send(Stain::baseline())
                .await
                .expect("sent over the base socket"),
            "base host=orders-base.local:80"
        );
    }
    // Sequential requests: one kept-alive connection per instance.
    assert_eq!(gray_accepted.load(Ordering::SeqCst), 1);
    assert_eq!(base_accepted.load(Ordering::SeqCst), 1);
}
