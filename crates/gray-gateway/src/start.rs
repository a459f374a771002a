//! How a [`Gateway`] is put together: [`start`] calls one function per part, in the order
//! the parts depend on each other.
//!
//! 1. [`certificates`]: the `[tls]` files, first, so that a file that cannot be used
//!    stops the start before anything is bound or followed;
//! 2. [`rules`] and [`registry`]: the two sources, loaded strictly, then followed;
//! 3. [`upstreams`]: one balancer per service over its instances' endpoints, with their
//!    counters;
//! 4. [`rollouts`]: a controller per service with a `[services.x.rollout]`, restored from
//!    the store;
//! 5. [`routes`] and [`edge`]: the proxy's table and the edge that stains each request;
//! 6. [`listeners`]: the plaintext and TLS listeners, served by one [`serve::Server`];
//! 7. [`admin`]: `/explain`, `/metrics`, `/healthz`, `/rollouts`.
//!
//! Each part that runs on its own (a listener, the admin, a controller) is a task in
//! [`Gateway`]'s list, stopped by its `stop` flag.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc};

use gray_balance::retry::ReplayBody;
use gray_core::{CarrierConfig, Lane};
use gray_discovery::{
    Registry,
    http::{Connector, HttpEndpoints},
    source::file::FileSource as InstanceFile,
};
use gray_rules::RuleSet;
use gray_tower::edge::{
    ClientIpResolver, Edge, EdgeLayer, FileSource, LiveRules, TrustedProxies, WatchHandle,
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tower::{BoxError, Layer};

use crate::{
    Gateway, admin,
    config::{Config, DEFAULT_INSTANCES, Discovery, Rules},
    limits::{self, ClientBody},
    metrics::{self, Freshness, Metrics},
    mirror::Mirror,
    proxy::{Proxy, Routes},
    rollout::{self, store::RolloutStore},
    serve,
    upgrade::Tunnels,
    upstream::Upstream,
};

/// Starts every part of the gateway `config` describes, its rollouts' states in `store`.
pub(crate) async fn start(
    mut config: Config,
    store: Arc<dyn RolloutStore>,
) -> Result<Gateway, BoxError> {
    // A mirror's copies hold a connection each in flight, and as many idle.
    let mirrors = 2 * mirror_idle(&config);
    limits::fit_descriptors(&mut config.limits, mirrors);
    let mut watches = Vec::new();
    #[cfg(feature = "tls")]
    let tls = certificates(&config, &mut watches)?;
    let rules = rules(&config.rules, &mut watches).await?;
    // A rollout's rule must be a sticky-percentage rule of the rules in force.
    config.check_rollouts(rules.load().rules())?;
    let (registry, embedded) = registry(&config).await?;
    let metrics = Metrics::new(config.metrics_max_lanes);
    metrics.register_collector(Freshness {
        rules: rules.clone(),
        registry: registry.clone(),
    });
    let services = upstreams(&config, &registry, &metrics)?;
    let tunnels = Tunnels::new(&config.limits, metrics.clone());
    let rollouts = rollouts(&config, &services, &rules, &store, &tunnels).await?;
    metrics.register_collector(rollouts.clone());
    let routes = routes(&config, services, &metrics, tunnels);
    let edge = edge(&config, &rules)?;

    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let per_connection = proxy_stack(&edge, &routes, &rollouts);
    let listening = Listening {
        stopped: &stopped,
        tasks: &mut tasks,
    };
    #[cfg(feature = "tls")]
    let (addr, tls_addr) = listeners(&config, tls, per_connection, &metrics, listening).await?;
    #[cfg(not(feature = "tls"))]
    let (addr, tls_addr) = listeners(&config, per_connection, listening).await?;
    let admin = admin(
        &config,
        admin::Admin {
            routes: routes.clone(),
            rules: rules.clone(),
            edge,
            metrics,
            registry: registry.clone(),
            rollouts: rollouts.clone(),
            history: Arc::default(),
            access: config.admin_access.clone(),
        },
        Listening {
            stopped: &stopped,
            tasks: &mut tasks,
        },
    )
    .await?;
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

/// What a part that serves needs: the stop flag to end with, and the gateway's tasks to
/// join.
struct Listening<'a> {
    stopped: &'a watch::Receiver<bool>,
    tasks: &'a mut Vec<JoinHandle<()>>,
}

/// A file removed when dropped (the embedded instance file, written out to be watched).
#[derive(Debug)]
pub(crate) struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

// === the sources ===

/// The `[tls]` table's acceptor and listen address, its files followed when they are to
/// be reloaded.
#[cfg(feature = "tls")]
fn certificates(
    config: &Config,
    watches: &mut Vec<WatchHandle>,
) -> Result<Option<(SocketAddr, crate::tls::Acceptor)>, BoxError> {
    let Some(settings) = &config.tls else {
        return Ok(None);
    };
    let (acceptor, watch) = crate::tls::start(settings)?;
    watches.extend(watch);
    Ok(Some((settings.listen, acceptor)))
}

/// The staining rules: loaded strictly at start, then followed; an invalid version keeps
/// the previous one in force.
async fn rules(rules: &Rules, watches: &mut Vec<WatchHandle>) -> Result<LiveRules, BoxError> {
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
async fn registry(config: &Config) -> Result<(Registry, Option<TempFile>), BoxError> {
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

// === the balancers ===

/// The endpoints every service's instances get: HTTP/1.1 (one buffer and one `send` per
/// message, at most `upstream_buffer_bytes` buffered ahead of the client), HTTP/2 or TLS
/// as each service's settings say.
fn endpoints<B: http_body::Body + 'static>(config: &Config) -> HttpEndpoints<Connector, B> {
    let mut http1 = hyper::client::conn::http1::Builder::new();
    // One buffer and one `send` per message (see `serve`).
    http1.writev(false);
    // What a response buffers ahead of its client (see `limits`).
    http1.max_buf_size(config.limits.upstream_buffer_bytes);
    let mut endpoints = HttpEndpoints::new()
        .with_http1(http1)
        .with_response_timeout(config.upstream_timeout)
        .with_max_connects_per_instance(config.limits.upstream_max_connects)
        .with_idle_timeout(config.limits.upstream_idle_timeout)
        .with_max_idle_total(config.limits.upstream_max_idle);
    if let Some(interval) = config.limits.upstream_http2_keep_alive_interval {
        let mut http2 =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
        // Idle connections too: hyper may leave a connection that opened with a request
        // unscheduled when it judged it idle a moment before, and a black hole sends
        // nothing that would schedule it again.
        http2
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(interval)
            .keep_alive_timeout(config.limits.upstream_http2_keep_alive_timeout)
            .keep_alive_while_idle(true);
        endpoints = endpoints.with_http2(http2);
    }
    endpoints
}

/// One [`Upstream`] per service (its balancer over its instances' endpoints), and the
/// collectors of their retries and their lanes' latencies.
fn upstreams(
    config: &Config,
    registry: &Registry,
    metrics: &Arc<Metrics>,
) -> Result<BTreeMap<Box<str>, Upstream>, BoxError> {
    let pool = endpoints::<ReplayBody<ClientBody>>(config);
    // The mirrors' copies have connections of their own, and a thread.
    let copy_endpoints = endpoints(config).with_max_idle_total(mirror_idle(config));
    let copies = match config.services.iter().any(|s| s.mirror.is_some()) {
        true => Some(Arc::new(crate::mirror::CopyThread::start(
            config.mirror_priority,
            config.mirror_max_busy,
        )?)),
        false => None,
    };
    let mut services = BTreeMap::new();
    for service in &config.services {
        let instances = registry.service(&service.name)?;
        let mut upstream = Upstream::new(
            service,
            instances.clone(),
            &pool,
            metrics,
            config.limits.max_in_flight_per_instance,
        );
        upstream.mirror = match (&service.mirror, &copies) {
            (Some(mirror), Some(copies)) => Some(Mirror::new(
                service,
                mirror,
                &instances,
                &copy_endpoints,
                &config.carriers,
                metrics,
                copies,
            )?),
            _ => None,
        };
        services.insert(service.name.clone().into_boxed_str(), upstream);
    }
    metrics.register_collector(metrics::RetryCounts(
        services
            .values()
            .map(|upstream: &Upstream| {
                let balance = upstream.balance().clone();
                let read: Box<dyn Fn() -> _ + Send + Sync> = Box::new(move || balance.retries());
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
    Ok(services)
}

/// The idle connections the mirrors' copies keep, in all: as many as they may have in flight
/// (so that the descriptor budget counts them; `limits::fit_descriptors`).
pub(crate) fn mirror_idle(config: &Config) -> usize {
    config
        .services
        .iter()
        .filter_map(|s| s.mirror.as_ref())
        .map(|m| m.max_in_flight)
        .sum()
}

// === the rollouts ===

/// A controller per service with a rollout, restored from `store`.
async fn rollouts(
    config: &Config,
    services: &BTreeMap<Box<str>, Upstream>,
    rules: &LiveRules,
    store: &Arc<dyn RolloutStore>,
    tunnels: &Arc<Tunnels>,
) -> Result<rollout::Rollouts, BoxError> {
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
            rollout::Traffic {
                tunnels: tunnels.clone(),
                mirror: upstream.mirror.clone(),
            },
        )
        .await?;
        controllers.insert(service.name.clone(), controller);
    }
    Ok(rollout::Rollouts(Arc::new(controllers)))
}

// === the proxy ===

/// The proxy's routing table: the upstreams, the timeouts and the limits a client pays for.
fn routes(
    config: &Config,
    services: BTreeMap<Box<str>, Upstream>,
    metrics: &Arc<Metrics>,
    tunnels: Arc<Tunnels>,
) -> Arc<Routes> {
    Arc::new(Routes {
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
        tunnels,
    })
}

/// The edge: every check a request goes through before routing, and its stain.
fn edge(config: &Config, rules: &LiveRules) -> Result<EdgeLayer, BoxError> {
    // The lanes and versions the rules name decode without a lookup of learned names.
    let names = rules.load().rules().names().clone();
    let edge = EdgeLayer::new(rules.clone())
        .with_carriers(CarrierConfig::carriers(&config.carriers).with_names(names))
        // No client makes its request look like a mirror's copy.
        .with_strip(
            config
                .strip
                .iter()
                .cloned()
                .chain([crate::mirror::X_GRAY_MIRROR]),
        )
        .with_trusted_clients(config.trusted_clients.clone())
        .with_proxies(TrustedProxies::cidrs(config.trusted_proxies.clone()))
        .with_forwarded_header(config.forwarded_header)
        // The edge does all of a request's checks: a path that leaves the `/{service}` it
        // names is refused there, and the peer goes into `X-Forwarded-For`.
        .with_reject_prefix_escape(config.reject_prefix_escape)
        .with_forwarded_for(true);
    Ok(if config.seed003_headers {
        edge.with_seed003_headers(Lane::new("gray")?)
    } else {
        edge
    })
}

/// The service of each client connection: the edge around the proxy, for its peer.
fn proxy_stack(
    edge: &EdgeLayer,
    routes: &Arc<Routes>,
    rollouts: &rollout::Rollouts,
) -> impl Fn(SocketAddr) -> Edge<Proxy> + Clone + Send + 'static {
    // Only the admin's explanations read the decision: not recorded per request. The
    // balancer reads the stain from the request's extensions: no task-local. A rollout
    // reads the decision to tell its population (see `rollout`).
    let edge = edge
        .clone()
        .with_decision_extension(!rollouts.0.is_empty())
        .with_task_local(false);
    let routes = routes.clone();
    move |peer: SocketAddr| {
        edge.layer(Proxy::new(routes.clone()).with_peer(peer))
            .with_peer(peer)
    }
}

// === the listeners ===

/// Binds the proxy's listener on `addr` (the key `field` gave it).
async fn bind(addr: SocketAddr, field: &str) -> Result<TcpListener, BoxError> {
    Ok(TcpListener::bind(addr)
        .await
        .map_err(|e| format!("{field} {addr}: {e}"))?)
}

/// Binds and serves the plaintext listener (`listen`) and the TLS one (`[tls]`), with one
/// [`serve::Server`]: `max_connections` counts their connections together. The proxy's
/// address (the plaintext one, else the TLS one), and the TLS one.
async fn listeners(
    config: &Config,
    #[cfg(feature = "tls")] tls: Option<(SocketAddr, crate::tls::Acceptor)>,
    per_connection: impl Fn(SocketAddr) -> Edge<Proxy> + Clone + Send + 'static,
    #[cfg(feature = "tls")] metrics: &Metrics,
    listening: Listening<'_>,
) -> Result<(SocketAddr, Option<SocketAddr>), BoxError> {
    let server = serve::Server::new(config.limits);
    let addr = match config.listen {
        Some(listen) => {
            let listener = bind(listen, "listen").await?;
            let addr = listener.local_addr()?;
            listening.tasks.push(tokio::spawn(serve::serve(
                server.clone(),
                listener,
                serve::Plain,
                per_connection.clone(),
                listening.stopped.clone(),
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
            listening.tasks.push(tokio::spawn(serve::serve(
                server,
                listener,
                acceptor,
                per_connection,
                listening.stopped.clone(),
            )));
            Some(addr)
        }
        None => None,
    };
    #[cfg(not(feature = "tls"))]
    let tls_addr = None;
    match addr.or(tls_addr) {
        Some(addr) => Ok((addr, tls_addr)),
        None => Err("nothing to listen on: give `listen`, or a `[tls]` table".into()),
    }
}

/// Binds and serves the admin address, if any.
async fn admin(
    config: &Config,
    admin: admin::Admin,
    listening: Listening<'_>,
) -> Result<Option<SocketAddr>, BoxError> {
    let Some(admin_addr) = config.admin else {
        return Ok(None);
    };
    let listener = TcpListener::bind(admin_addr)
        .await
        .map_err(|e| format!("admin {admin_addr}: {e}"))?;
    let bound = listener.local_addr()?;
    listening.tasks.push(tokio::spawn(admin::sample(
        admin.clone(),
        listening.stopped.clone(),
    )));
    let router = admin::router(admin);
    let mut stopped = listening.stopped.clone();
    listening.tasks.push(tokio::spawn(async move {
        let shutdown = async move { serve::until_stopped(&mut stopped).await };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "admin server failed");
        }
    }));
    Ok(Some(bound))
}
