//! The gray gateway, as a library: [`Gateway::start`] runs it on the configured
//! addresses until [`Gateway::shutdown`]. The binary (`src/main.rs`) and the quickstart
//! use it.
//!
//! Per request: [`EdgeLayer`] resolves the client IP (through trusted proxies), strips
//! the stain of untrusted clients, decides the lane by the live rules and writes it for
//! downstream; the proxy routes `/{service}/rest` to `service`'s label-aware balancer
//! (`gray-balance` over `gray-discovery`), which picks an instance that fits the stain or
//! applies the service's fallback; the request and response bodies are streamed;
//! hop-by-hop headers are removed; a 503 with a JSON body names the service, the lane and
//! the policy when nothing fits.

pub mod admin;
pub mod config;
pub mod drain;
pub mod metrics;
pub mod proxy;
pub mod upstream;

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use gray_core::{Lane, rules::RuleSet};
use gray_discovery::{
    Registry,
    http::HttpEndpoints,
    source::{
        etcd::{EtcdConfig, EtcdSource},
        file::FileSource as InstanceFile,
    },
};
use gray_tower::edge::{EdgeLayer, FileSource, LiveRules, TrustedProxies, WatchHandle};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tower::{BoxError, Layer, ServiceExt};

use crate::{
    config::{Config, DEFAULT_INSTANCES, Discovery},
    drain::Drain,
    metrics::Metrics,
    proxy::{Proxy, Routes},
    upstream::Upstream,
};

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    rules: LiveRules,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _watches: Vec<WatchHandle>,
    registry: Registry,
    _embedded: Option<tempfile_guard::TempFile>,
}

mod tempfile_guard {
    use std::path::PathBuf;

    /// A file removed when dropped.
    #[derive(Debug)]
    pub(crate) struct TempFile(pub(crate) PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Gateway {
    /// Starts the gateway described by `config`: binds its listeners (port 0 picks a free
    /// one), loads the rules and instances, and serves until [`Gateway::shutdown`].
    pub async fn start(config: Config) -> Result<Gateway, BoxError> {
        // Rules: loaded strictly at start, then watched; an invalid edit keeps the
        // previous version in force.
        let mut watches = Vec::new();
        let rules = match &config.rules {
            Some(path) => {
                let source = FileSource::new(path);
                let live = LiveRules::from_source(&source, None)
                    .await
                    .map_err(|e| format!("rules {}: {e}", path.display()))?;
                watches.push(live.follow(&source, None));
                live
            }
            None => LiveRules::new(RuleSet::default()),
        };

        // Instances: one registry, followed by its own task whether or not requests flow;
        // one instance stream per routed service.
        let mut embedded = None;
        let registry = match &config.discovery {
            Discovery::File(path) => Registry::start(InstanceFile::new(path))
                .await
                .map_err(|e| format!("instances: {e}"))?,
            Discovery::Embedded => {
                let path = std::env::temp_dir().join(format!(
                    "gray-gateway-instances-{}-{}.toml",
                    std::process::id(),
                    config.listen.port()
                ));
                std::fs::write(&path, DEFAULT_INSTANCES)?;
                embedded = Some(tempfile_guard::TempFile(path.clone()));
                Registry::start(InstanceFile::new(&path)).await?
            }
            Discovery::Etcd(cfg) => {
                let prefix = format!("{}/", cfg.prefix.trim_end_matches('/'));
                Registry::start(EtcdSource::prefix(EtcdConfig::new(&cfg.endpoints), prefix))
                    .await
                    .map_err(|e| format!("etcd {:?}: {e}", cfg.endpoints))?
            }
        };
        // Messages are written with one copy into one buffer and one `send`, rather than
        // as a vectored write of head and body: cheaper for the small messages that
        // dominate, at the cost of a copy of large bodies.
        let mut http1 = hyper::client::conn::http1::Builder::new();
        http1.writev(false);
        let pool = HttpEndpoints::new()
            .http1(http1)
            .response_timeout(config.upstream_timeout);
        let metrics = Arc::new(Metrics::default());
        let mut services = BTreeMap::new();
        for service in &config.services {
            services.insert(
                service.name.clone().into_boxed_str(),
                Upstream::new(service, registry.service(&service.name)?, &pool, &metrics),
            );
        }
        let routes = Arc::new(Routes {
            services,
            timeout: config.upstream_timeout,
            metrics: metrics.clone(),
        });

        let mut edge = EdgeLayer::new(rules.clone())
            .with_trusted_clients(config.trusted_clients.clone())
            .with_proxies(TrustedProxies::cidrs(config.trusted_proxies.clone()));
        if config.seed003_headers {
            edge = edge.with_seed003_headers(Lane::new("gray")?);
        }

        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();

        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("listen {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        let per_connection = {
            // Only the admin's explanations read the decision: not recorded per request.
            let (edge, routes) = (edge.clone().with_decision_extension(false), routes.clone());
            move |peer: SocketAddr| {
                edge.layer(Proxy::for_peer(routes.clone(), peer.ip()))
                    .with_peer(peer)
            }
        };
        tasks.push(tokio::spawn(serve(
            listener,
            per_connection,
            stopped.clone(),
        )));

        let admin = match config.admin {
            Some(admin_addr) => {
                let listener = TcpListener::bind(admin_addr)
                    .await
                    .map_err(|e| format!("admin {admin_addr}: {e}"))?;
                let bound = listener.local_addr()?;
                let router = admin::router(admin::Admin {
                    routes: routes.clone(),
                    rules: rules.clone(),
                    edge: edge.clone(),
                    metrics,
                    registry: registry.clone(),
                });
                let mut stopped = stopped.clone();
                tasks.push(tokio::spawn(async move {
                    let shutdown = async move { until_stopped(&mut stopped).await };
                    if let Err(e) = axum::serve(listener, router)
                        .with_graceful_shutdown(shutdown)
                        .await
                    {
                        tracing::error!(error = %e, "admin server failed");
                    }
                }));
                Some(bound)
            }
            None => None,
        };
        tracing::info!(%addr, admin = ?admin, services = routes.services.len(), "gateway started");
        Ok(Gateway {
            addr,
            admin,
            rules,
            stop,
            tasks,
            _watches: watches,
            registry,
            _embedded: embedded,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin endpoint's address.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The staining rules in force.
    pub fn rules(&self) -> &LiveRules {
        &self.rules
    }

    /// The instances of every service, as discovery has them now.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Stops accepting, lets in-flight requests finish, and returns.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// The accept loop: one hyper connection (HTTP/1.1 or HTTP/2) per TCP connection, served
/// by the service `make` builds for its peer; on stop, connections finish gracefully.
async fn serve<M, S>(listener: TcpListener, make: M, mut stopped: watch::Receiver<bool>)
where
    M: Fn(SocketAddr) -> S,
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<proxy::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = Drain::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // As for the upstream connections: one buffer, one `send` per response head and body.
    builder.http1().writev(false);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = until_stopped(&mut stopped) => break,
        };
        let _ = stream.set_nodelay(true);
        let service = Connection {
            service: make(peer),
        };
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection closed with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(std::time::Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after 10 s; closing");
    }
}

/// One connection's service, as hyper calls it: sends each request through a clone of
/// the connection's tower service.
#[derive(Clone)]
struct Connection<S> {
    service: S,
}

impl<S> hyper::service::Service<http::Request<hyper::body::Incoming>> for Connection<S>
where
    S: tower::Service<http::Request<hyper::body::Incoming>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        S::Future,
        tower::util::Oneshot<S, http::Request<hyper::body::Incoming>>,
    >;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let mut service = self.service.clone();
        // The proxy stack is always ready; checked all the same, and waited for if not.
        let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
        match service.poll_ready(&mut noop) {
            std::task::Poll::Ready(Ok(())) => futures_util::future::Either::Left(service.call(req)),
            _ => futures_util::future::Either::Right(service.oneshot(req)),
        }
    }
}

/// Resolves once the stop flag is set (or its sender is gone).
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped at once: it must not live across an await.
    let _ = stopped.wait_for(|s| *s).await.map(|_| ());
}
