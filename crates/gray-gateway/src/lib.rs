#![doc = include_str!("../docs/gateway.md")]

pub mod check;
pub mod config;
pub mod metrics;

mod admin;
mod drain;
#[cfg(feature = "fault-injection")]
mod faults;
mod grpc;
mod hold;
mod limits;
mod mirror;
mod proxy;
pub mod rollout;
mod serve;
mod start;
mod target;
#[cfg(feature = "tls")]
mod tls;
mod upgrade;
mod upstream;

use std::{net::SocketAddr, sync::Arc};

use gray_discovery::Registry;
use gray_tower::edge::{LiveRules, WatchHandle};
use tokio::{sync::watch, task::JoinHandle};
use tower::BoxError;

use crate::config::Config;
#[cfg(feature = "etcd")]
use crate::config::Discovery;
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
    _embedded: Option<start::TempFile>,
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
        // the folder's lock only when there are rollouts to lead
        let store = if config.services.iter().any(|s| s.rollout.is_some()) {
            rollout::store::FileStore::open(&config.rollouts.state_dir)?
        } else {
            rollout::store::FileStore::new(&config.rollouts.state_dir)
        };
        Gateway::start_with_store(config, store).await
    }

    /// [`Gateway::start`], with the rollouts' states in `store` rather than in local files
    /// (see [`rollout::store`]).
    pub async fn start_with_store(
        config: Config,
        store: Arc<dyn rollout::store::RolloutStore>,
    ) -> Result<Gateway, BoxError> {
        start::start(config, store).await
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
            // a task that panicked is said, not dropped in silence
            if let Err(e) = task.await
                && e.is_panic()
            {
                tracing::error!(error = %e, "a task of the gateway had panicked");
            }
        }
        self.store.close().await;
    }
}
