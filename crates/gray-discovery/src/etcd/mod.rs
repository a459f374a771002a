//! Instances registered in etcd (feature `etcd`): a discover stream per service that
//! survives etcd restarts, and self-registration under a lease.
//!
//! # Key layout
//!
//! One key per instance, `<prefix>/<service>/<instance-id>`, whose value is the JSON
//! [`Record`](crate::Record) `{"address": "host:port", "labels": {"name": "value"}}`
//! (`labels` optional; `address` is `host:port` or `http(s)://host:port`). Service names and
//! instance ids are non-empty and contain no `/`, whitespace or control characters. Operators
//! register and change instances by hand with `etcdctl`:
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
//! [`EtcdRegistry::service`] lists `<prefix>/<service>/` and then watches it from the listed
//! revision + 1. The stream yields:
//!
//! - an `Insert` per instance at first, then one per put that creates or changes an instance.
//!   A changed address or label is an `Insert` with the same id, which *replaces* the
//!   instance (not a `Remove` followed by an `Insert`);
//! - a `Remove` per deleted key, and per key whose lease expired.
//!
//! When the watch breaks (etcd restarts, the connection drops), the stream reconnects with
//! exponential backoff and watches again from the last revision it saw + 1, so every change
//! made meanwhile is delivered once, in order, and none twice. When that revision has been
//! compacted away, it lists the prefix again and yields the difference from what it served.
//! Meanwhile the balancer keeps the instances it has: the stream does not yield errors for
//! transient failures, it logs them (`tracing`, WARN) and retries.
//!
//! A key whose value is not a valid record is skipped with a WARN event naming the key and
//! the error; if it held a valid record before, that instance is removed, as a fresh list
//! would not include it either. Keys nested deeper than `<service>/<id>` are ignored.
//!
//! Give the etcd client HTTP/2 keep-alives ([`ConnectOptions::with_keep_alive`]) so a
//! connection to an etcd host that vanished without closing it is noticed:
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use gray_discovery::etcd::EtcdRegistry;
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let options = etcd_client::ConnectOptions::new()
//!     .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
//! let client = etcd_client::Client::connect(["http://127.0.0.1:2379"], Some(options)).await?;
//! let registry = EtcdRegistry::new(client, "/gray");
//! let mut orders = registry.service("orders")?;
//! while let Some(change) = orders.next().await {
//!     println!("{:?}", change?);
//! }
//! # Ok(()) }
//! ```
//!
//! # Self-registration
//!
//! [`EtcdRegistry::register`] puts the instance's key under a lease of
//! [`EtcdRegistry::with_ttl`] (10 s by default) and keeps the lease alive from a background
//! task, renewing it every third of the TTL. If the lease is lost (etcd unreachable for
//! longer than the TTL, or revoked), the instance is registered again under a new lease as
//! soon as etcd answers. [`Registration::deregister`] revokes the lease, which deletes the
//! key; dropping the [`Registration`] does the same from the background task, as long as the
//! runtime runs. If the process dies, the key goes away when the lease expires.
//!
//! ```no_run
//! use gray_core::Labels;
//! use gray_discovery::{Instance, etcd::EtcdRegistry};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = etcd_client::Client::connect(["http://127.0.0.1:2379"], None).await?;
//! let registry = EtcdRegistry::new(client, "/gray").with_ttl(Duration::from_secs(10));
//! let me = Instance::new(
//!     "orders-7".parse()?,
//!     "10.0.0.7:8080".parse()?,
//!     Labels::from_iter([("gray", "true")]),
//! );
//! let registration = registry.register("orders", &me).await?;
//! // ... serve ...
//! registration.deregister().await?;
//! # Ok(()) }
//! ```
//!
//! [`ConnectOptions::with_keep_alive`]: etcd_client::ConnectOptions::with_keep_alive

mod discover;
mod register;

use std::{future::Future, time::Duration};

use etcd_client::Client;

pub use discover::EtcdDiscover;
pub use register::Registration;

use crate::{Error, Instance, backoff::Backoff, instance::check_service};

/// An etcd cluster and the key prefix under which instances are registered; see the
/// [module docs](self).
#[derive(Clone)]
pub struct EtcdRegistry {
    client: Client,
    prefix: String,
    backoff: Backoff,
    ttl: Duration,
    request_timeout: Duration,
}

impl std::fmt::Debug for EtcdRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRegistry")
            .field("prefix", &self.prefix)
            .field("backoff", &self.backoff)
            .field("ttl", &self.ttl)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdRegistry {
    /// Instances under `prefix` (for example `/gray`; a trailing `/` is ignored) of the
    /// cluster `client` talks to.
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        while prefix.ends_with('/') {
            prefix.pop();
        }
        EtcdRegistry {
            client,
            prefix,
            backoff: Backoff {
                min: Duration::from_millis(100),
                max: Duration::from_secs(5),
            },
            ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
        }
    }

    /// Reconnects after `min`, doubling up to `max` (with jitter). Default 100 ms to 5 s.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        self.backoff = Backoff {
            min,
            max: max.max(min),
        };
        self
    }

    /// The lease TTL of registrations, rounded up to whole seconds. Default 10 s.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// How long a single request (list, watch creation, lease grant) may take before it is
    /// abandoned and retried. Default 5 s.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The key prefix, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of instance `id` of `service`: `<prefix>/<service>/<id>`.
    pub fn key(&self, service: &str, id: &str) -> String {
        format!("{}/{service}/{id}", self.prefix)
    }

    /// The discover stream of `service`.
    pub fn service(&self, service: &str) -> Result<EtcdDiscover, Error> {
        check_service(service)?;
        Ok(EtcdDiscover::new(self.clone(), service))
    }

    /// Registers `instance` as an instance of `service` under a lease kept alive until the
    /// returned [`Registration`] is deregistered or dropped. Returns once the key is
    /// written, or the error of the first attempt.
    pub async fn register(
        &self,
        service: &str,
        instance: &Instance,
    ) -> Result<Registration, Error> {
        check_service(service)?;
        Registration::start(self.clone(), service, instance).await
    }

    async fn timed<T>(
        &self,
        action: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(source)) => Err(Error::Etcd {
                action: action(),
                source,
            }),
            Err(_) => Err(Error::Timeout { action: action() }),
        }
    }
}
