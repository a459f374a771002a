//! [`Decoder`]: how a source's bytes become instances, and the [`Effect`] of each update.

use std::{collections::BTreeMap, fmt};

use gray_source::{Snapshot, Update};

use crate::{Error, Instance, InstanceId};

/// Turns what a [`Source`](gray_source::Source) hands out (bytes by key) into instances,
/// for a [`Registry`](crate::Registry) to apply: the decoder of a registry this crate does
/// not know (Kubernetes EndpointSlices, Consul, Nacos) plugs in with
/// [`Registry::start_with`](crate::Registry::start_with). The built-in [`Layout`]s
/// (an instance file, one etcd key per instance) are decoders too.
///
/// The registry calls [`load`](Self::load) once, on the source's first content, then
/// [`apply`](Self::apply) on every [`Update`] of its watch, in order, from its own task.
/// Neither may block. An update that cannot be decoded changes nothing ([`Effect::None`])
/// or removes what it names, as the decoder sees fit; say why with a `tracing` event.
///
/// [`Layout`]: crate::Layout
///
/// ```
/// use gray_discovery::{Error, Instance, InstanceId, Registry, registry::{Decoder, Effect}};
/// use gray_source::{Entry, Revision, Snapshot, Update};
///
/// /// Each key is a service; its value a list of `id=host:port` lines.
/// #[derive(Debug)]
/// struct Lines;
///
/// fn instances(entry: &Entry) -> Vec<Instance> {
///     String::from_utf8_lossy(&entry.value)
///         .lines()
///         .filter_map(|line| {
///             let (id, address) = line.split_once('=')?;
///             Some(Instance::new(id.parse().ok()?, address.parse().ok()?, Default::default()))
///         })
///         .collect()
/// }
///
/// impl Decoder for Lines {
///     fn apply(&self, update: Update) -> Effect {
///         match update {
///             Update::Reset(snapshot) => {
///                 Effect::reset(snapshot.entries.iter().map(|e| (e.key.clone(), instances(e))))
///             }
///             Update::Put(entry) => Effect::replace(entry.key.clone(), instances(&entry)),
///             Update::Delete { key, .. } => Effect::replace(key, []),
///             _ => Effect::none(),
///         }
///     }
/// }
///
/// let entry = |key: &str, value: &str| Entry {
///     key: key.into(),
///     value: value.into(),
///     revision: Revision::Manual(1),
/// };
/// let snapshot = Snapshot {
///     entries: vec![entry("orders", "orders-1=127.0.0.1:8081\norders-2=127.0.0.1:8082")],
///     revision: Revision::Manual(1),
/// };
/// let Effect::Reset(services) = Lines.load(snapshot)? else { unreachable!() };
/// assert_eq!(services["orders"].len(), 2);
/// let Effect::Replace(service, list) = Lines.apply(Update::Put(entry("orders", "orders-1=127.0.0.1:8081")))
/// else { unreachable!() };
/// assert_eq!((service.as_str(), list.len()), ("orders", 1));
/// # Ok::<(), Error>(())
/// ```
pub trait Decoder: fmt::Debug + Send + Sync + 'static {
    /// What the source's first content holds. By default,
    /// [`apply`](Self::apply)`(Update::Reset(snapshot))`.
    ///
    /// # Errors
    ///
    /// A content the registry must not start with (an instance file that does not
    /// parse): [`Registry::start_with`](crate::Registry::start_with) returns the error.
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        Ok(self.apply(Update::Reset(snapshot)))
    }

    /// What one update does to the instances. [`Update`] is non-exhaustive: a kind the
    /// decoder does not know is [`Effect::None`].
    fn apply(&self, update: Update) -> Effect;
}

impl<D: Decoder + ?Sized> Decoder for Box<D> {
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        (**self).load(snapshot)
    }

    fn apply(&self, update: Update) -> Effect {
        (**self).apply(update)
    }
}

impl<D: Decoder + ?Sized> Decoder for std::sync::Arc<D> {
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        (**self).load(snapshot)
    }

    fn apply(&self, update: Update) -> Effect {
        (**self).apply(update)
    }
}

/// What an update does to the instances, service by service: what a [`Decoder`] returns
/// and a [`Registry`](crate::Registry) applies. Only the differences reach the
/// subscribers (an instance put again unchanged yields nothing); a service name that is
/// not valid (empty, with `/`, whitespace or control characters) is skipped with a
/// warning.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Effect {
    /// The whole content: every service named gets exactly these instances, every other
    /// service none. A source's first content, an instance file, a re-list.
    Reset(BTreeMap<String, Vec<Instance>>),
    /// Every instance of one service (the others untouched): a registry that lists
    /// instances service by service (Consul's `/v1/health/service/<name>`, Nacos's
    /// instance list, a Kubernetes EndpointSlice).
    Replace(String, Vec<Instance>),
    /// One instance of a service added, or replaced (same id).
    Put(String, Instance),
    /// One instance of a service removed, by id.
    Remove(String, InstanceId),
    /// Nothing changes (an ignored key, a rejected version already logged).
    None,
}

// === impl Effect ===

impl Effect {
    /// [`Effect::Reset`] from `(service, instances)` pairs; a service named twice gets
    /// the instances of both.
    pub fn reset<N, I>(services: impl IntoIterator<Item = (N, I)>) -> Self
    where
        N: Into<String>,
        I: IntoIterator<Item = Instance>,
    {
        let mut all: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
        for (name, instances) in services {
            all.entry(name.into()).or_default().extend(instances);
        }
        Effect::Reset(all)
    }

    /// [`Effect::Replace`]: `service` has exactly `instances`.
    pub fn replace(
        service: impl Into<String>,
        instances: impl IntoIterator<Item = Instance>,
    ) -> Self {
        Effect::Replace(service.into(), instances.into_iter().collect())
    }

    /// [`Effect::Put`]: `instance` of `service`, added or replaced.
    pub fn put(service: impl Into<String>, instance: Instance) -> Self {
        Effect::Put(service.into(), instance)
    }

    /// [`Effect::Remove`]: the instance `id` of `service` is gone.
    pub fn remove(service: impl Into<String>, id: InstanceId) -> Self {
        Effect::Remove(service.into(), id)
    }

    /// [`Effect::None`]: nothing changes.
    #[must_use]
    pub fn none() -> Self {
        Effect::None
    }
}
