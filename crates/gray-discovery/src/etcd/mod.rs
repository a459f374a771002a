//! Instances registered in etcd (feature `etcd`): the key layout a
//! [`Registry`](crate::Registry) reads from an [`EtcdSource`] prefix, and self-registration
//! under a lease ([`Registrar`]).
//!
//! # Key layout
//!
//! One key per instance, `<prefix>/<service>/<instance-id>`, whose value is the JSON
//! [`Record`](crate::Record) `{"address": "host:port", "labels": {"name": "value"}}`
//! (`labels` optional). `address` is read as `host:port` or `http(s)://host:port`, and
//! written in one canonical form: `host:port` for plain HTTP, `https://host:port` for TLS
//! (see [`Address`](crate::Address)). Service names and instance ids are non-empty and
//! contain no `/`, whitespace or control characters. Operators register and change
//! instances by hand with `etcdctl`:
//!
//! ```text
//! etcdctl put /gray/orders/orders-1 '{"address": "10.0.0.7:8080"}'
//! etcdctl put /gray/orders/orders-2 '{"address": "10.0.0.8:8080", "labels": {"gray": "true", "version": "2.0"}}'
//! etcdctl put /gray/orders/orders-2 '{"address": "10.0.0.8:8080", "labels": {"version": "2.0"}}'   # relabel
//! etcdctl del /gray/orders/orders-2                                                                 # remove
//! etcdctl get --prefix /gray/orders/                                                                # list
//! # an instance that disappears by itself when its owner stops renewing the lease:
//! LEASE=$(etcdctl lease grant 10 | awk '{print $2}')
//! etcdctl put --lease=$LEASE /gray/orders/orders-3 '{"address": "10.0.0.9:8080"}'
//! ```
//!
//! # Discovery
//!
//! `Registry::start(EtcdSource::prefix(config, "/gray/"))` lists the prefix, then follows
//! it with gray-source's watch (resumed from the last revision after a disconnect, listed
//! again after a compaction or a reset cluster; see [`gray_source::etcd`]):
//!
//! - a put that creates or changes an instance is one `Insert` (a changed address or label
//!   keeps the id, and *replaces* the instance: no `Remove` first); O(1) whatever the
//!   number of instances;
//! - a delete, or a lease that expired, is a `Remove`;
//! - a re-list is diffed against the instances known: only the difference is emitted;
//! - a value that is not a valid record is skipped with a WARN event naming the key; if it
//!   held a valid record before, that instance is removed (a fresh listing would not
//!   include it either). Keys nested deeper than `<service>/<id>` are ignored.
//!
//! While etcd is unreachable the registry keeps the instances it has, and
//! [`Registry::status`](crate::Registry::status) says since when it has not heard from it.
//!
//! ```no_run
//! use gray_discovery::{Registry, source::etcd::{EtcdConfig, EtcdSource}};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = EtcdConfig::new(["http://127.0.0.1:2379"]);
//! let registry = Registry::start(EtcdSource::prefix(config, "/gray/")).await?;
//! let orders = registry.service("orders")?;
//! println!("{:?} at revision {:?}", orders.instances(), registry.status().revision);
//! # Ok(()) }
//! ```
//!
//! # Self-registration
//!
//! [`Registrar::register`] puts the instance's key under a lease of
//! [`Registrar::with_ttl`] (10 s by default) and keeps the lease alive from a background
//! task, renewing it every third of the TTL. If the lease is lost (etcd unreachable for
//! longer than the TTL, or revoked), the instance is registered again under a new lease as
//! soon as etcd answers (retrying with the configuration's backoff).
//! [`Registration::deregister`] revokes the lease, which deletes the key; dropping the
//! [`Registration`] does the same from the background task, as long as the runtime runs.
//! If the process dies, the key goes away when the lease expires.
//!
//! ```no_run
//! use gray_core::Labels;
//! use gray_discovery::{Instance, etcd::Registrar, source::etcd::EtcdConfig};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let registrar = Registrar::new(EtcdConfig::new(["http://127.0.0.1:2379"]), "/gray")
//!     .with_ttl(Duration::from_secs(10));
//! let me = Instance::new(
//!     "orders-7".parse()?,
//!     "10.0.0.7:8080".parse()?,
//!     Labels::from_iter([("gray", "true")]),
//! );
//! // Writes /gray/orders/orders-7 = {"address":"10.0.0.7:8080","labels":{"gray":"true"}}
//! let registration = registrar.register("orders", &me).await?;
//! // ... serve ...
//! registration.deregister().await?;
//! # Ok(()) }
//! ```
//!
//! A [`Registrar`] connects only when it registers; building one checks nothing yet:
//!
//! ```
//! use gray_discovery::{etcd::Registrar, source::etcd::EtcdConfig};
//!
//! let registrar = Registrar::new(EtcdConfig::new(["http://127.0.0.1:2379"]), "/gray/");
//! assert_eq!(registrar.prefix(), "/gray");
//! assert_eq!(registrar.key("orders", "orders-7"), "/gray/orders/orders-7");
//! ```
//!
//! [`EtcdSource`]: gray_source::etcd::EtcdSource

mod register;

use std::{fmt, future::Future, sync::Arc, time::Duration};

use gray_source::etcd::EtcdConfig;

pub use self::register::Registration;

/// The 0.1 name of what follows the instances under an etcd prefix: a
/// [`Registry`](crate::Registry) started on an
/// [`EtcdSource`](gray_source::etcd::EtcdSource)
/// (`Registry::start(EtcdSource::prefix(config, prefix))`); registering is [`Registrar`]'s.
#[deprecated(
    since = "0.3.0",
    note = "renamed `Registry` (started with `Registry::start(EtcdSource::prefix(config, prefix))`); registering is `Registrar`'s; removed in 0.4.0"
)]
pub type EtcdRegistry = crate::Registry;

/// The 0.1 name of the discover stream of one service under an etcd prefix:
/// [`InstanceDiscover`](crate::InstanceDiscover), from `registry.service(name)?.discover()`.
#[deprecated(
    since = "0.3.0",
    note = "renamed `InstanceDiscover` (`registry.service(name)?.discover()`); removed in 0.4.0"
)]
pub type EtcdDiscover = crate::InstanceDiscover;
use crate::{Error, Instance, instance::check_service};

/// Registers instances under a key prefix of an etcd cluster, each under a lease kept
/// alive; see the [module docs](self).
#[derive(Clone)]
pub struct Registrar {
    config: Arc<EtcdConfig>,
    prefix: String,
    ttl: Duration,
}

impl fmt::Debug for Registrar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registrar")
            .field("endpoints", &self.config.endpoints())
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Registrar {
    /// Registers under `prefix` (for example `/gray`; a trailing `/` is ignored) of the
    /// cluster `config` reaches, with its timeouts, keep-alive and backoff.
    pub fn new(config: EtcdConfig, prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        while prefix.ends_with('/') {
            prefix.pop();
        }
        Registrar {
            config: Arc::new(config),
            prefix,
            ttl: Duration::from_secs(10),
        }
    }

    /// The lease TTL of registrations, rounded up to whole seconds (at least 1 s). Default
    /// 10 s.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// The key prefix, without a trailing `/`.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of instance `id` of `service`: `<prefix>/<service>/<id>`.
    #[must_use]
    pub fn key(&self, service: &str, id: &str) -> String {
        format!("{}/{service}/{id}", self.prefix)
    }

    /// Registers `instance` as an instance of `service` under a lease kept alive until the
    /// returned [`Registration`] is deregistered or dropped. Returns once the key is
    /// written, or the error of the first attempt (etcd unreachable, an invalid name).
    pub async fn register(
        &self,
        service: &str,
        instance: &Instance,
    ) -> Result<Registration, Error> {
        check_service(service)?;
        Registration::start(self, service, instance).await
    }

    /// Runs one etcd request with the configuration's request timeout.
    async fn timed<T>(
        &self,
        action: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.config.request_timeout(), fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(source)) => Err(Error::Etcd {
                action: action(),
                source,
            }),
            Err(_) => Err(Error::Timeout { action: action() }),
        }
    }
}
