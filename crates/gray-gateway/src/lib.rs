#![doc = include_str!("../docs/gateway.md")]

pub mod check;
pub mod config;
pub mod metrics;

mod admin;
mod drain;
mod grpc;
mod hold;
mod limits;
mod proxy;
pub mod rollout;
mod serve;
#[cfg(feature = "tls")]
mod tls;
mod upstream;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc};

use gray_core::{CarrierConfig, Lane};
use gray_discovery::{Registry, http::HttpEndpoints, source::file::FileSource as InstanceFile};
use gray_rules::RuleSet;
use gray_tower::edge::{
    ClientIpResolver, EdgeLayer, FileSource, LiveRules, TrustedProxies, WatchHandle,
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tower::{BoxError, Layer};

use crate::{
    config::{Config, DEFAULT_INSTANCES, Discovery, Rules},
    metrics::{Freshness, Metrics},
    proxy::{Proxy, Routes},
    upstream::Upstream,
};
pub use crate::{limits::raise_nofile_limit, upstream::X_GRAY_INSTANCE};

/// A running gateway: [`Gateway::start`] it, [`Gateway::shutdown`] it.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    rules: LiveRules,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _watches: Vec<WatchHandle>,
    registry: Registry,
    store: Arc<dyn rollout::store::RolloutStore>,
    _embedded: Option<TempFile>,
}

/// A file removed when dropped (the embedded instance file, written out to be watched).
#[derive(Debug)]
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Gateway {
    /// Starts the gateway described by `config`: loads the rules and the instances (a
    /// source that cannot be read, or holds an invalid file, is an error here), binds its
    /// listeners (port 0 picks a free one) and serves until [`Gateway::shutdown`].
    ///
    /// The rollouts' states live in etcd when the configuration has an `[etcd]` table
    /// ([`rollout::etcd::EtcdStore`], shared by every gateway of that etcd), else in local
    /// files ([`rollout::store::FileStore`], in `[rollouts] state_dir`).
    pub async fn start(config: Config) -> Result<Gateway, BoxError> {
        #[cfg(feature = "etcd")]
        if let (Discovery::Etcd(etcd), true) = (
            &config.discovery,
            config.services.iter().any(|s| s.rollout.is_some()),
        ) {
            let store = rollout::etcd::EtcdStore::start(
                etcd.client.clone(),
                &etcd.prefix,
                config.rollouts.lease_ttl,
            )
            .await
            .map_err(|e| format!("rollouts: {e}"))?;
            return Gateway::start_with_store(config, store).await;
        }
        let store = rollout::store::FileStore::new(&config.rollouts.state_dir);
        Gateway::start_with_store(config, store).await
    }

    /// [`Gateway::start`], with the rollouts' states in `store` rather than in local files
    /// (see [`rollout::store`]).
    pub async fn start_with_store(
        mut config: Config,
        store: Arc<dyn rollout::store::RolloutStore>,
    ) -> Result<Gateway, BoxError> {
        limits::fit_descriptors(&mut config.limits);
        let mut watches = Vec::new();
        // The certificates first: a file that cannot be used stops the start before
        // anything is bound or followed.
        #[cfg(feature = "tls")]
        let tls = match &config.tls {
            Some(settings) => {
                let (acceptor, watch) = tls::start(settings)?;
                watches.extend(watch);
                Some((settings.listen, acceptor))
            }
            None => None,
        };
        let rules = start_rules(&config.rules, &mut watches).await?;
        // A rollout's rule must be a sticky-percentage rule of the rules in force.
        config.check_rollouts(rules.load().rules())?;
        let (registry, embedded) = start_registry(&config).await?;

        let mut http1 = hyper::client::conn::http1::Builder::new();
        // One buffer and one `send` per message (see `serve`).
        http1.writev(false);
        // What a response buffers ahead of its client (see `limits`).
        http1.max_buf_size(config.limits.upstream_buffer_bytes);
        let pool = HttpEndpoints::new()
            .with_http1(http1)
            .with_response_timeout(config.upstream_timeout)
            .with_max_connects_per_instance(config.limits.upstream_max_connects);
        let metrics = Metrics::new(config.metrics_max_lanes);
        metrics.register_collector(Freshness {
            rules: rules.clone(),
            registry: registry.clone(),
        });
        let mut services = BTreeMap::new();
        for service in &config.services {
            services.insert(
                service.name.clone().into_boxed_str(),
                Upstream::new(
                    service,
                    registry.service(&service.name)?,
                    &pool,
                    &metrics,
                    config.limits.max_in_flight_per_instance,
                ),
            );
        }
        metrics.register_collector(metrics::RetryCounts(
            services
                .values()
                .map(|upstream: &Upstream| {
                    let balance = upstream.balance().clone();
                    let read: Box<dyn Fn() -> _ + Send + Sync> =
                        Box::new(move || balance.retries());
                    (upstream.name.to_string(), read)
                })
                .collect(),
        ));
        metrics.register_collector(rollout::LaneDurations(
            services
                .values()
                .map(|upstream: &Upstream| (upstream.name.to_string(), upstream.evidence.clone()))
                .collect(),
        ));
        let mut controllers = BTreeMap::new();
        for service in &config.services {
            let (Some(rollout), Some(upstream)) =
                (&service.rollout, services.get(service.name.as_str()))
            else {
                continue;
            };
            let controller = rollout::Controller::restore(
                &service.name,
                rollout.clone(),
                rules.clone(),
                upstream.evidence.clone(),
                store.clone(),
                &config.rollouts,
            )
            .await?;
            controllers.insert(service.name.clone(), controller);
        }
        let rollouts = rollout::Rollouts(Arc::new(controllers));
        metrics.register_collector(rollouts.clone());
        let routes = Arc::new(Routes {
            services,
            timeout: config.upstream_timeout,
            head_hold: config.head_hold,
            metrics: metrics.clone(),
            limits: config.limits,
            in_flight: Arc::new(limits::InFlight::new(
                config.limits.max_in_flight,
                config.limits.max_in_flight_per_client,
            )),
            clients: ClientIpResolver::new(TrustedProxies::cidrs(config.trusted_proxies.clone()))
                .with_header(config.forwarded_header),
        });

        let mut edge = EdgeLayer::new(rules.clone())
            .with_carriers(CarrierConfig::carriers(&config.carriers))
            .with_strip(config.strip.iter().cloned())
            .with_trusted_clients(config.trusted_clients.clone())
            .with_proxies(TrustedProxies::cidrs(config.trusted_proxies.clone()))
            .with_forwarded_header(config.forwarded_header)
            // The edge does all of a request's checks: a path that leaves the `/{service}`
            // it names is refused there, and the peer goes into `X-Forwarded-For`.
            .with_reject_prefix_escape(config.reject_prefix_escape)
            .with_forwarded_for(true);
        if config.seed003_headers {
            edge = edge.with_seed003_headers(Lane::new("gray")?);
        }

        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let per_connection = {
            // Only the admin's explanations read the decision: not recorded per request.
            // The balancer reads the stain from the request's extensions: no task-local.
            // A rollout reads the decision to tell its population (see `rollout`).
            let edge = edge
                .clone()
                .with_decision_extension(!rollouts.0.is_empty())
                .with_task_local(false);
            let routes = routes.clone();
            move |peer: SocketAddr| {
                edge.layer(Proxy::new(routes.clone()).with_peer(peer))
                    .with_peer(peer)
            }
        };
        // One server for both listeners: `max_connections` counts their connections
        // together.
        let server = serve::Server::new(config.limits);
        let addr = match config.listen {
            Some(listen) => {
                let listener = bind(listen, "listen").await?;
                let addr = listener.local_addr()?;
                tasks.push(tokio::spawn(serve::serve(
                    server.clone(),
                    listener,
                    serve::Plain,
                    per_connection.clone(),
                    stopped.clone(),
                )));
                Some(addr)
            }
            None => None,
        };
        #[cfg(feature = "tls")]
        let tls_addr = match tls {
            Some((listen, acceptor)) => {
                let listener = bind(listen, "tls.listen").await?;
                let addr = listener.local_addr()?;
                metrics.register_collector(acceptor.metrics());
                tasks.push(tokio::spawn(serve::serve(
                    server.clone(),
                    listener,
                    acceptor,
                    per_connection.clone(),
                    stopped.clone(),
                )));
                Some(addr)
            }
            None => None,
        };
        #[cfg(not(feature = "tls"))]
        let tls_addr = None;
        let Some(addr) = addr.or(tls_addr) else {
            return Err("nothing to listen on: give `listen`, or a `[tls]` table".into());
        };

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
                    rollouts: rollouts.clone(),
                });
                let mut stopped = stopped.clone();
                tasks.push(tokio::spawn(async move {
                    let shutdown = async move { serve::until_stopped(&mut stopped).await };
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
        for controller in rollouts.0.values() {
            tasks.push(tokio::spawn(
                controller
                    .clone()
                    .run(config.rollouts.interval, stopped.clone()),
            ));
        }
        tracing::info!(
            listen = ?config.listen.map(|_| addr),
            tls = ?tls_addr,
            admin = ?admin,
            services = routes.services.len(),
            "gateway started"
        );
        Ok(Gateway {
            addr,
            tls_addr,
            admin,
            rules,
            stop,
            tasks,
            _watches: watches,
            registry,
            store,
            _embedded: embedded,
        })
    }

    /// The proxy's plaintext address; when only TLS is configured, the TLS listener's.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The TLS listener's address (the `[tls]` table's `listen`), if any.
    #[must_use]
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The admin endpoint's address.
    #[must_use]
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The staining rules in force.
    #[must_use]
    pub fn rules(&self) -> &LiveRules {
        &self.rules
    }

    /// The instances of every service, as discovery has them now.
    #[must_use]
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Stops accepting, lets in-flight requests finish (10 s at most), lets go of what it
    /// holds in the rollouts' store (etcd: its lease, so another gateway leads at once),
    /// and returns.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        self.store.close().await;
    }
}

/// Binds the proxy's listener on `addr` (the key `field` gave it).
async fn bind(addr: SocketAddr, field: &str) -> Result<TcpListener, BoxError> {
    Ok(TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{field} {addr}: {e}"))?)
}

/// The staining rules: loaded strictly at start, then followed; an invalid version keeps
/// the previous one in force.
async fn start_rules(rules: &Rules, watches: &mut Vec<WatchHandle>) -> Result<LiveRules, BoxError> {
    Ok(match rules {
        Rules::File(path) => {
            let source = FileSource::new(path);
            let live = LiveRules::from_source(&source, None).await?;
            watches.push(live.follow(&source, None));
            live
        }
        #[cfg(feature = "etcd")]
        Rules::Etcd(etcd, key) => {
            let source = gray_tower::edge::EtcdSource::key(etcd.client.clone(), key);
            let format = rules_format(key);
            let live = LiveRules::from_source(&source, format).await?;
            watches.push(live.follow(&source, format));
            live
        }
        _ => LiveRules::new(RuleSet::default()),
    })
}

/// The format of a rule set stored under `key`: by its extension, else TOML.
#[cfg(feature = "etcd")]
pub(crate) fn rules_format(key: &str) -> gray_config::Format {
    use gray_config::Format;
    Format::from_path(key.as_ref()).unwrap_or(Format::Toml)
}

/// Discovery: one registry, followed by its own task whether or not requests flow.
async fn start_registry(config: &Config) -> Result<(Registry, Option<TempFile>), BoxError> {
    Ok(match &config.discovery {
        Discovery::File(path) => (Registry::start(InstanceFile::new(path)).await?, None),
        Discovery::Embedded => {
            let path = std::env::temp_dir().join(format!(
                "gray-gateway-instances-{}-{}.toml",
                std::process::id(),
                config
                    .listen
                    .or(config.tls.as_ref().map(|tls| tls.listen))
                    .map_or(0, |addr| addr.port())
            ));
            std::fs::write(&path, DEFAULT_INSTANCES)?;
            let registry = Registry::start(InstanceFile::new(&path)).await?;
            (registry, Some(TempFile(path)))
        }
        #[cfg(feature = "etcd")]
        Discovery::Etcd(etcd) => {
            let source = gray_tower::edge::EtcdSource::prefix(etcd.client.clone(), &etcd.prefix);
            (Registry::start(source).await?, None)
        }
    })
}
