//! [`Registry`]: the instances of every service of one source, kept up to date by a task of
//! its own, and shared by every balancer and client.
//!
//! [`Registry::start`] reads the source once (a file that cannot be read or parsed is an
//! error here, with its file, line and field), then spawns a task that follows the
//! source's [`watch`](gray_source::Source::watch) and applies every change **as it
//! arrives, whether or not anything reads the registry**: with no traffic at all,
//! [`ServiceInstances::instances`] (for `/explain`, metrics and readiness) reflects a file
//! edit or an etcd put within the source's delay (a file's polling interval, 250 ms by
//! default; an etcd watch event at once).
//!
//! [`Registry::service`] gives the [`ServiceInstances`] of one service: the instances now,
//! a [`discover`](ServiceInstances::discover) stream for a balancer (any number of
//! subscribers, each independent, each starting with an `Insert` per current instance),
//! and [`endpoints`](ServiceInstances::endpoints), the same stream with every instance made
//! into a client service ([`crate::endpoint`]). [`Registry::status`] says how fresh the
//! source is (last contact, etcd revision and cluster ID), for staleness alerts.
//!
//! # Sources
//!
//! | source | layout | a change costs |
//! |---|---|---|
//! | [`FileSource`](gray_source::file::FileSource) (feature `file`) | the whole file is one document ([`crate::file`]) | parsing the file, then a diff against the instances known: O(n) |
//! | [`EtcdSource::prefix`](gray_source::etcd::EtcdSource::prefix) (feature `etcd`) | one key per instance ([`crate::etcd`]) | a watch event: O(1); a re-list (after a compaction or a reset cluster): a diff, O(n) |
//! | [`Registry::from_static`] | a fixed list | nothing changes |
//! | any other [`Source`] | [`Registry::start_with`] and a [`Layout`] | as above |
//! | a registry of its own (Consul, Nacos, Kubernetes) | [`Registry::start_with`] and a [`Decoder`] of its own | what its [`Effect`]s say: O(1) for a put or a removal, a diff for a replaced service or a reset |
//!
//! A version of a file that cannot be parsed, or is empty, is rejected as a whole (ERROR
//! event with file, line and field; the last good instances stay); an etcd value that is
//! not a valid record is skipped (WARN naming the key) and the instance it replaced is
//! removed. Only what changed reaches the subscribers: an `Insert` for a new or changed
//! instance (a changed one keeps its id, and *replaces* the old one: no `Remove` first), a
//! `Remove` for a removed one.
//!
//! # Lifetime
//!
//! The registry, its clones, its [`ServiceInstances`] and their streams share the task;
//! the task stops when the last of them is dropped (or when the runtime stops). Keep the
//! `Registry` (or a stream) for as long as the instances should follow the source.
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::Labels;
//! use gray_discovery::{Instance, Registry};
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let registry = Registry::from_static([(
//!     "orders",
//!     [
//!         Instance::new("orders-1".parse()?, "127.0.0.1:8081".parse()?, Labels::new()),
//!         Instance::new(
//!             "orders-2".parse()?,
//!             "127.0.0.1:8082".parse()?,
//!             Labels::from_iter([("gray", "true")]),
//!         ),
//!     ],
//! )])?;
//! assert_eq!(registry.services(), ["orders"]);
//! let orders = registry.service("orders")?;
//! assert_eq!(orders.instances().len(), 2);
//!
//! // Each subscriber starts with the instances now.
//! let mut discover = orders.discover();
//! let Some(Ok(Change::Insert(id, _))) = discover.next().await else { unreachable!() };
//! assert_eq!(id.as_str(), "orders-1");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

mod decoder;
mod layout;
mod service;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex, MutexGuard},
};

use futures_util::StreamExt;
use gray_source::{Revision, Source, Status, StatusHandle, Updates, WatchHandle};

use self::service::ServiceState;
pub use self::{
    decoder::{Decoder, Effect},
    layout::{InstanceSource, Layout},
    service::{InstanceDiscover, ServiceInstances},
};
use crate::{Error, Instance, instance::check_service};

/// The instances of every service of one source, kept up to date by a task of its own;
/// see the [module docs](self). Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Core>,
}

/// What every handle shares; the task stops when the last handle drops it.
pub(crate) struct Core {
    catalog: Arc<Catalog>,
    status: StatusHandle,
    describe: String,
    _watch: Option<WatchHandle>,
}

/// The services, by name.
#[derive(Default)]
struct Catalog {
    services: Mutex<BTreeMap<Arc<str>, Arc<ServiceState>>>,
}

impl Catalog {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Arc<str>, Arc<ServiceState>>> {
        self.services
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The state of `name`, created empty the first time it is named.
    fn service(&self, name: &str) -> Arc<ServiceState> {
        let mut services = self.lock();
        if let Some(state) = services.get(name) {
            return state.clone();
        }
        let name: Arc<str> = Arc::from(name);
        let state = Arc::new(ServiceState::new(name.clone()));
        services.insert(name, state.clone());
        state
    }

    /// Applies `effect`; returns how many changes it made.
    fn apply(&self, effect: Effect) -> usize {
        match effect {
            Effect::Reset(mut next) => {
                next.retain(|name, _| valid_service(name));
                // Every service known: the ones the new content names get its instances,
                // the others none.
                let known: Vec<(Arc<str>, Arc<ServiceState>)> = self
                    .lock()
                    .iter()
                    .map(|(name, state)| (name.clone(), state.clone()))
                    .collect();
                let mut changes = 0;
                for (name, state) in known {
                    changes += state.replace(next.remove(&*name).unwrap_or_default());
                }
                for (name, instances) in next {
                    changes += self.service(&name).replace(instances);
                }
                changes
            }
            Effect::Replace(service, instances) => {
                if !valid_service(&service) {
                    return 0;
                }
                self.service(&service).replace(instances)
            }
            Effect::Put(service, instance) => {
                if !valid_service(&service) {
                    return 0;
                }
                tracing::debug!(target: "gray::discovery", %service, id = %instance.id(),
                    address = %instance.address(), "instance put");
                self.service(&service).insert(instance)
            }
            Effect::Remove(service, id) => {
                if !valid_service(&service) {
                    return 0;
                }
                tracing::debug!(target: "gray::discovery", %service, %id, "instance removed");
                self.service(&service).remove(&id)
            }
            Effect::None => 0,
        }
    }
}

/// `true` for a valid service name; a decoder's invalid one is logged (WARN) and skipped.
fn valid_service(name: &str) -> bool {
    match check_service(name) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(target: "gray::discovery", %error, "service skipped");
            false
        }
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("source", &self.inner.describe)
            .field("services", &self.inner.catalog.lock().len())
            .finish()
    }
}

impl Registry {
    /// Reads `source` once and follows it from a task of its own; see the
    /// [module docs](self). Fails when the source cannot be read, or holds an instance file
    /// that does not parse (the error names the file, the line and the field).
    ///
    /// Must be called within a tokio runtime with timers enabled.
    pub async fn start<S: InstanceSource>(source: S) -> Result<Registry, Error> {
        let layout = source.layout()?;
        Registry::start_with(source, layout).await
    }

    /// [`Registry::start`] for any source, whose entries `decoder` turns into instances: a
    /// [`Layout`] (an instance file, one key per instance), or a [`Decoder`] of your own.
    /// Fails when the source cannot be read, or when the decoder rejects its first
    /// content.
    pub async fn start_with<S: Source, D: Decoder>(
        source: S,
        decoder: D,
    ) -> Result<Registry, Error> {
        let describe = source.describe();
        let snapshot = source.load().await.map_err(Error::Source)?;
        let revision = match &snapshot.revision {
            Revision::Etcd { mod_revision } => Some(*mod_revision),
            _ => None,
        };
        let catalog = Arc::new(Catalog::default());
        catalog.apply(decoder.load(snapshot)?);
        let updates = source.watch();
        let status = updates.status_handle();
        status.contact(revision);
        let task = tokio::spawn(follow(catalog.clone(), decoder, updates, describe.clone()));
        tracing::info!(target: "gray::discovery", source = %describe,
            services = catalog.lock().len(), "registry started");
        Ok(Registry {
            inner: Arc::new(Core {
                catalog,
                status,
                describe,
                _watch: Some(WatchHandle::new(task)),
            }),
        })
    }

    /// A registry of fixed lists: `(service, instances)` pairs (a repeated instance id
    /// keeps the last one). Nothing follows it; its [`status`](Self::status) says
    /// connected, with no contact. Fails on an invalid service name.
    pub fn from_static<N, I>(services: impl IntoIterator<Item = (N, I)>) -> Result<Registry, Error>
    where
        N: AsRef<str>,
        I: IntoIterator<Item = Instance>,
    {
        let mut lists: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
        for (name, instances) in services {
            let name = name.as_ref();
            check_service(name)?;
            lists.entry(name.to_owned()).or_default().extend(instances);
        }
        let catalog = Arc::new(Catalog::default());
        catalog.apply(Effect::Reset(lists));
        let status = StatusHandle::new();
        status.update(|s| s.connected = true);
        Ok(Registry {
            inner: Arc::new(Core {
                catalog,
                status,
                describe: "static list".to_owned(),
                _watch: None,
            }),
        })
    }

    /// The instances of `service` (none yet if the source does not name it: they appear
    /// when it does). Fails on an invalid service name (empty, with `/`, whitespace or
    /// control characters).
    pub fn service(&self, service: &str) -> Result<ServiceInstances, Error> {
        check_service(service)?;
        Ok(ServiceInstances::new(
            self.inner.clone(),
            self.inner.catalog.service(service),
        ))
    }

    /// The names of the services that have at least one instance now, sorted.
    #[must_use]
    pub fn services(&self) -> Vec<String> {
        self.inner
            .catalog
            .lock()
            .iter()
            .filter(|(_, state)| !state.is_empty())
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// How fresh the source is: the last contact (a file read, any etcd response), the
    /// last etcd revision applied, the cluster ID, whether it is reachable now, and the last
    /// failure. The gateway's `/metrics` and `/explain` show it, for staleness alerts.
    #[must_use]
    pub fn status(&self) -> Status {
        self.inner.status.get()
    }

    /// What the registry follows: `file instances.toml`, `etcd prefix /gray/ at [..]`.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.inner.describe
    }
}

/// The registry's task: applies every update of the source, in order.
async fn follow<D: Decoder>(
    catalog: Arc<Catalog>,
    decoder: D,
    mut updates: Updates,
    source: String,
) {
    while let Some(update) = updates.next().await {
        let effect = decoder.apply(update);
        let whole = matches!(effect, Effect::Reset(_) | Effect::Replace(..));
        let changes = catalog.apply(effect);
        if whole && changes > 0 {
            tracing::info!(target: "gray::discovery", %source, changes, "instances reloaded");
        }
    }
}
