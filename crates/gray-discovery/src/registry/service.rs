//! One service of a registry: its instances now, and its subscribers.

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map},
    convert::Infallible,
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, Weak},
    task::{Context, Poll, Waker},
};

use futures_core::Stream;
use tower::discover::Change;

use super::Core;
use crate::{Endpoints, Instance, InstanceId, InstanceSet, MakeEndpoint};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The instances of one service and the streams that follow them.
pub(crate) struct ServiceState {
    name: Arc<str>,
    inner: Mutex<Followers>,
}

/// The service's instances and the streams subscribed to them.
struct Followers {
    set: InstanceSet,
    subscribers: Vec<Weak<Subscriber>>,
}

impl ServiceState {
    pub(crate) fn new(name: Arc<str>) -> Self {
        ServiceState {
            name,
            inner: Mutex::new(Followers {
                set: InstanceSet::new(),
                subscribers: Vec::new(),
            }),
        }
    }

    /// Whether the service has no instance now.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.inner).set.is_empty()
    }

    /// Replaces every instance; O(n), emits the difference. Returns how many changes.
    pub(crate) fn replace(&self, instances: Vec<Instance>) -> usize {
        let mut inner = lock(&self.inner);
        let changes = inner.set.replace(instances);
        if !changes.is_empty() {
            tracing::debug!(target: "gray::discovery", service = %self.name,
                changes = changes.len(), instances = inner.set.len(), "instances replaced");
        }
        inner.publish(&changes);
        changes.len()
    }

    /// Adds or replaces one instance; O(1). Returns how many changes (0 or 1).
    pub(crate) fn insert(&self, instance: Instance) -> usize {
        let mut inner = lock(&self.inner);
        let change = inner.set.insert(instance);
        inner.publish(change.as_slice());
        change.as_slice().len()
    }

    /// Removes one instance; O(1). Returns how many changes (0 or 1).
    pub(crate) fn remove(&self, id: &InstanceId) -> usize {
        let mut inner = lock(&self.inner);
        let change = inner.set.remove(id.as_str());
        inner.publish(change.as_slice());
        change.as_slice().len()
    }

    fn instances(&self) -> Vec<Instance> {
        sorted(&lock(&self.inner).set)
    }

    fn subscribe(&self) -> Arc<Subscriber> {
        let mut inner = lock(&self.inner);
        let mut pending = Pending::default();
        for instance in sorted(&inner.set) {
            pending.push(Change::Insert(instance.id().clone(), instance));
        }
        let subscriber = Arc::new(Subscriber {
            pending: Mutex::new(pending),
        });
        inner.subscribers.retain(|s| s.strong_count() > 0);
        inner.subscribers.push(Arc::downgrade(&subscriber));
        subscriber
    }
}

/// The instances of `set`, sorted by id.
fn sorted(set: &InstanceSet) -> Vec<Instance> {
    let mut instances: Vec<Instance> = set.iter().cloned().collect();
    instances.sort_unstable_by(|a, b| a.id().cmp(b.id()));
    instances
}

impl Followers {
    /// Hands `changes` to every subscriber still listening, and forgets the others.
    fn publish(&mut self, changes: &[Change<InstanceId, Instance>]) {
        if changes.is_empty() {
            return;
        }
        self.subscribers.retain(|subscriber| {
            let Some(subscriber) = subscriber.upgrade() else {
                return false;
            };
            let waker = {
                let mut pending = lock(&subscriber.pending);
                for change in changes {
                    pending.push(change.clone());
                }
                pending.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
            true
        });
    }
}

/// The changes a subscriber has not taken yet, one per instance id, in the order of their
/// first change: a subscriber that is not polled (a balancer without traffic) holds at most
/// one change per instance, however many happen.
#[derive(Default)]
struct Pending {
    order: VecDeque<InstanceId>,
    changes: HashMap<InstanceId, Change<InstanceId, Instance>>,
    waker: Option<Waker>,
}

impl Pending {
    fn push(&mut self, change: Change<InstanceId, Instance>) {
        let id = match &change {
            Change::Insert(id, _) | Change::Remove(id) => id.clone(),
        };
        match self.changes.entry(id) {
            hash_map::Entry::Occupied(mut slot) => {
                // The later change wins: an `Insert` replaces, a `Remove` removes, whatever
                // came before.
                slot.insert(change);
            }
            hash_map::Entry::Vacant(slot) => {
                self.order.push_back(slot.key().clone());
                slot.insert(change);
            }
        }
    }

    fn pop(&mut self) -> Option<Change<InstanceId, Instance>> {
        let id = self.order.pop_front()?;
        self.changes.remove(&id)
    }
}

struct Subscriber {
    pending: Mutex<Pending>,
}

/// One service of a [`Registry`](crate::Registry): its instances now, and streams of their
/// changes; see the [module docs](crate::registry). Cheap to clone; it keeps the registry
/// running.
#[derive(Clone)]
pub struct ServiceInstances {
    registry: Arc<Core>,
    state: Arc<ServiceState>,
}

impl fmt::Debug for ServiceInstances {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceInstances")
            .field("name", &self.state.name)
            .field("instances", &lock(&self.state.inner).set.len())
            .finish()
    }
}

impl ServiceInstances {
    pub(crate) fn new(registry: Arc<Core>, state: Arc<ServiceState>) -> Self {
        ServiceInstances { registry, state }
    }

    /// The service's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The instances now, sorted by id (for an explanation, metrics, a readiness check).
    #[must_use]
    pub fn instances(&self) -> Vec<Instance> {
        self.state.instances()
    }

    /// A discover stream of the instances: an `Insert` for every instance now (sorted by
    /// id), then every change as the registry applies it. It never fails and never ends;
    /// every stream is independent of the others. A stream that is not polled for a while
    /// keeps one pending change per instance at most (the latest), so it costs nothing to
    /// hold one in a balancer that sees no traffic.
    #[must_use]
    pub fn discover(&self) -> InstanceDiscover {
        InstanceDiscover {
            subscriber: self.state.subscribe(),
            known: HashSet::new(),
            service: self.state.name.clone(),
            _registry: self.registry.clone(),
        }
    }

    /// A discover stream of endpoints: [`discover`](Self::discover), with every instance
    /// made into a service by `maker` ([`crate::endpoint`]).
    pub fn endpoints<M: MakeEndpoint>(&self, maker: M) -> Endpoints<InstanceDiscover, M> {
        Endpoints::new(self.discover(), maker)
    }
}

/// The discover stream of one service of a registry; see [`ServiceInstances::discover`].
///
/// A `Stream` of `Result<Change<InstanceId, Instance>, Infallible>`, so a
/// [`tower::discover::Discover`].
pub struct InstanceDiscover {
    subscriber: Arc<Subscriber>,
    /// The ids this stream has inserted and not removed: a `Remove` of anything else (an
    /// instance that came and went while the stream was not polled) is not yielded.
    known: HashSet<InstanceId>,
    service: Arc<str>,
    _registry: Arc<Core>,
}

impl fmt::Debug for InstanceDiscover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstanceDiscover")
            .field("service", &self.service)
            .field("known", &self.known.len())
            .finish()
    }
}

impl Stream for InstanceDiscover {
    type Item = Result<Change<InstanceId, Instance>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut pending = lock(&this.subscriber.pending);
        while let Some(change) = pending.pop() {
            match &change {
                Change::Insert(id, _) => {
                    this.known.insert(id.clone());
                }
                Change::Remove(id) => {
                    if !this.known.remove(id) {
                        continue;
                    }
                }
            }
            return Poll::Ready(Some(Ok(change)));
        }
        match &mut pending.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
