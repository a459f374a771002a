//! The balancer: a cloneable handle over a published snapshot of the subset index.

use std::{
    fmt,
    hash::Hash,
    sync::Arc,
    task::{Context, Poll},
};

use arc_swap::ArcSwap;
use gray_core::{Labelled, Stain};
use gray_policy::{Availability, Candidate, Decision, Policy, Unroutable};
use tokio::sync::mpsc;
use tower::{BoxError, discover::Discover};
use tower_service::Service;

use crate::{
    driver::{self, Close, Driver},
    future::BalanceFuture,
    health::{Classifier, Ejection, Probe, classify},
    index::{Snapshot, Tried},
    meter::{Clock, Feedback},
    pick::{Pick, Picked, Routed, Router},
    retry::{Retries, RetryPolicy, RetryStats},
};

/// Where the balancer finds a request's [`Stain`]: in the request itself (for an
/// `http::Request`, its extensions). When it is not there, the balancer reads the
/// task-local stain ([`gray_core::task::current`]).
pub trait RequestStain {
    /// The stain the request carries, if any.
    fn gray_stain(&self) -> Option<&Stain>;

    /// Records on the request how it was routed, when the balancer records routes
    /// ([`RecordRouted`](crate::RecordRouted)). Does nothing by default.
    fn record_routed(&mut self, routed: Routed) {
        let _ = routed;
    }
}

impl<B> RequestStain for http::Request<B> {
    fn gray_stain(&self) -> Option<&Stain> {
        self.extensions().get::<Stain>()
    }

    /// Inserts `routed` into the request extensions, where the endpoint service (and,
    /// if it copies it, the caller, from the response) can read it.
    fn record_routed(&mut self, routed: Routed) {
        self.extensions_mut().insert(routed);
    }
}

/// A balancer's settings.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) router: Router,
    pub(crate) ejection: Ejection,
    pub(crate) classify: Classifier,
    pub(crate) probe: Probe,
    pub(crate) retry: RetryPolicy,
}

impl Config {
    /// Peak-EWMA p2c, the default [`Ejection`], [`classify`], the connect probe and the
    /// default retry policy, no record.
    pub(crate) fn new(service: &str, policy: Policy) -> Self {
        Config {
            router: Router::new(service, policy, Pick::default().chooser()),
            ejection: Ejection::default(),
            classify,
            probe: Probe::default(),
            retry: RetryPolicy::default(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("service", &self.router.service)
            .field("policy", &self.router.policy.name())
            .field("strategy", &self.router.strategy())
            .field("record", &self.router.record)
            .field("ejection", &self.ejection)
            .field("probe", &self.probe)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// The label-aware, per-request balancer; see the [crate docs](crate).
///
/// A cheap handle (one `Arc`): clone it for every caller. Built ([`Balance::new`], or the
/// crate's layer for more settings) over a [`Discover`] stream of endpoints that are
/// [`Labelled`] services, whose changes a background task ([`Driver`]) applies as they
/// come.
pub struct Balance<K, S> {
    pub(crate) inner: Arc<Core<K, S>>,
}

/// What every handle of one balancer shares: the router, the published snapshot of its
/// endpoints, and the retries over it.
pub(crate) struct Core<K, S> {
    pub(crate) router: Router,
    pub(crate) snapshot: Arc<ArcSwap<Snapshot<K, S>>>,
    /// The retry policy, budget and counts of the `Retry` services and reqwest routing
    /// over this balancer.
    pub(crate) retries: Retries,
    /// Dropped with the last handle: ends the driver.
    _close: Close,
}

impl<K, S> Clone for Balance<K, S> {
    fn clone(&self) -> Self {
        Balance {
            inner: self.inner.clone(),
        }
    }
}

impl<K, S> fmt::Debug for Balance<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let router = &self.inner.router;
        f.debug_struct("Balance")
            .field("service", &router.service)
            .field("policy", &router.policy.name())
            .field("strategy", &router.strategy())
            .field("endpoints", &self.len())
            .field("ready", &self.ready_len())
            .finish()
    }
}

// === impl Balance: construction ===

impl<K, S> Balance<K, S>
where
    K: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    S: Labelled + Send + Sync + 'static,
{
    /// A balancer for calls to `service`, routed by `policy`, over the endpoints that
    /// `discover` yields, with the default [`Pick`], [`Ejection`] and classifier. Its
    /// driver is spawned on the current tokio runtime.
    ///
    /// The changes `discover` has ready at once (a static list, a file read already) are
    /// applied before this returns.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime; use [`Balance::pair`] there.
    pub fn new<D>(discover: D, service: impl AsRef<str>, policy: Policy) -> Self
    where
        D: Discover<Key = K, Service = S> + Send + 'static,
        D::Error: Into<BoxError>,
    {
        Self::spawn(discover, Config::new(service.as_ref(), policy))
    }

    pub(crate) fn spawn<D>(discover: D, config: Config) -> Self
    where
        D: Discover<Key = K, Service = S> + Send + 'static,
        D::Error: Into<BoxError>,
    {
        let (balance, driver) = Self::with_config(discover, config);
        tokio::spawn(driver);
        balance
    }
}

impl<K, S> Balance<K, S>
where
    K: Hash + Eq + Clone + fmt::Debug,
    S: Labelled,
{
    /// As [`Balance::new`], but returns the driver instead of spawning it: the balancer
    /// follows discovery, ejects and readmits only while the driver is polled (spawn it
    /// on the runtime of your choice).
    pub fn pair<D>(discover: D, service: impl AsRef<str>, policy: Policy) -> (Self, Driver<D>)
    where
        D: Discover<Key = K, Service = S>,
        D::Error: Into<BoxError>,
    {
        Self::with_config(discover, Config::new(service.as_ref(), policy))
    }

    pub(crate) fn with_config<D>(discover: D, mut config: Config) -> (Self, Driver<D>)
    where
        D: Discover<Key = K, Service = S>,
        D::Error: Into<BoxError>,
    {
        let clock = Clock::new();
        config.router.clock = clock;
        let (events, received) = mpsc::unbounded_channel();
        let wildcard = config.router.policy.unlabelled() == gray_policy::Unlabelled::Wildcard;
        let snapshot = Arc::new(ArcSwap::from_pointee(Snapshot::new(wildcard)));
        let feedback = Arc::new(Feedback::new(
            events,
            clock,
            config.router.rtt_decay_ns(),
            config.ejection.consecutive(),
            config.classify,
        ));
        let (driver, close) = Driver::new(
            discover,
            driver::Parts {
                service: config.router.service.clone(),
                policy: config.router.policy.clone(),
                ejection: config.ejection.backoff(),
                probe: config.probe,
                feedback,
                events: received,
                published: snapshot.clone(),
            },
        );
        let inner = Core {
            router: config.router,
            snapshot,
            retries: Retries::new(config.retry),
            _close: close,
        };
        (
            Balance {
                inner: Arc::new(inner),
            },
            driver,
        )
    }
}

// === impl Balance: inspection and picking ===

impl<K, S> Balance<K, S> {
    /// The service this balancer calls.
    #[must_use]
    pub fn service_name(&self) -> &str {
        &self.inner.router.service
    }

    /// The routing policy.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.inner.router.policy
    }

    /// The number of known endpoints (ready, unready or ejected).
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.snapshot.load().len()
    }

    /// `true` when no endpoint is known.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of endpoints that may take a request: neither ejected nor unready.
    #[must_use]
    pub fn ready_len(&self) -> usize {
        self.inner.snapshot.load().ready_len()
    }

    /// Every known endpoint (ready, unready or ejected), with its registry labels and its
    /// availability, in the balancer's order: the snapshot a request's pick reads, for an
    /// admin page that lists a service's instances. Classify the labels with
    /// [`policy`](Self::policy)`().classify(..)` for their lane and versions.
    #[must_use]
    pub fn endpoints(&self) -> Vec<(K, gray_core::Labels, Availability)>
    where
        K: Clone,
    {
        self.inner
            .snapshot
            .load()
            .slots()
            .map(|s| (s.entry.key.clone(), s.entry.labels.clone(), s.availability))
            .collect()
    }

    /// The retry policy of the [`Retry`](crate::retry::Retry) services and the reqwest
    /// routing over this balancer.
    #[must_use]
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retries.policy
    }

    /// The retries made through this balancer so far, by reason, and those its budget
    /// refused.
    #[must_use]
    pub fn retries(&self) -> RetryStats {
        self.inner.retries.stats()
    }

    /// The decision the balancer would make now for a request carrying `stain` (`None`: no
    /// stain at all, so the policy's own lane): the same [`Policy::walk`] over the live
    /// endpoints, as a value (for a gateway's admin endpoint).
    #[must_use]
    pub fn explain(&self, stain: Option<&Stain>) -> Decision<K>
    where
        K: Clone,
    {
        let snapshot = self.inner.snapshot.load();
        let router = &self.inner.router;
        let candidates = snapshot
            .slots()
            .map(|s| Candidate::new(s.entry.key.clone(), &s.entry.labels, s.availability));
        router.policy.decide(&router.service, stain, candidates)
    }

    /// Picks an endpoint for a request that the caller sends itself (a reqwest client
    /// that rewrites the URL, for one): the same walk and pick as a call, without calling
    /// the endpoint. `stain`: the request's stain; `None` reads the task-local one, else
    /// the policy's own lane applies.
    ///
    /// Tell the returned [`Picked`] how the request ended, for load and health.
    pub fn pick(&self, stain: Option<&Stain>) -> Result<Picked<K, S>, Unroutable>
    where
        K: fmt::Debug + Send + Sync,
        S: Send + Sync,
    {
        self.pick_except(stain, &Tried::NONE)
    }

    /// [`pick`](Self::pick), as if the endpoint of key `not` were ejected: another
    /// endpoint for the same stain, when there is one (a mirror's control goes to a second
    /// baseline instance, never the one that answered the user). A `not` the balancer does
    /// not know excludes nothing.
    ///
    /// ```
    /// use std::{convert::Infallible, sync::Arc};
    /// use gray_balance::BalanceLayer;
    /// use gray_core::{Labelled, Labels, Stain};
    /// use gray_policy::Policy;
    /// use tower::discover::Change;
    ///
    /// #[derive(Clone)]
    /// struct Instance(Arc<Labels>);
    ///
    /// impl Labelled for Instance {
    ///     fn labels(&self) -> &Labels { &self.0 }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let changes = futures_util::stream::iter(["base-1", "base-2"].map(|key| {
    ///     Ok::<_, Infallible>(Change::Insert(key, Instance(Arc::default())))
    /// }));
    /// let balance = BalanceLayer::new("orders", Policy::default()).build(changes);
    /// while balance.len() < 2 {
    ///     tokio::task::yield_now().await;
    /// }
    /// let baseline = Stain::baseline();
    /// for _ in 0..10 {
    ///     let other = balance.pick_other(Some(&baseline), "base-1").unwrap();
    ///     assert_eq!(*other.key(), "base-2");
    ///     other.succeeded();
    /// }
    /// # }
    /// ```
    pub fn pick_other<Q>(&self, stain: Option<&Stain>, not: &Q) -> Result<Picked<K, S>, Unroutable>
    where
        K: fmt::Debug + Send + Sync + std::borrow::Borrow<Q>,
        S: Send + Sync,
        Q: PartialEq + ?Sized,
    {
        let mut tried = Tried::NONE;
        let snapshot = self.inner.snapshot.load();
        if let Some(slot) = snapshot.slots().find(|slot| slot.entry.key.borrow() == not) {
            tried.push(slot.entry.meter.id());
        }
        self.pick_except(stain, &tried)
    }

    /// [`pick`](Self::pick), as if the endpoints in `tried` were ejected.
    pub(crate) fn pick_except(
        &self,
        stain: Option<&Stain>,
        tried: &Tried,
    ) -> Result<Picked<K, S>, Unroutable>
    where
        K: fmt::Debug + Send + Sync,
        S: Send + Sync,
    {
        let inner = &*self.inner;
        let snapshot = inner.snapshot.load();
        let stain = gray_core::task::or_current(stain);
        let key = inner
            .router
            .policy
            .key(&inner.router.service, stain.as_deref());
        let choice = inner.router.choose(&snapshot, &key, tried)?;
        Ok(Picked::new(&choice))
    }
}

// === impl Balance: Service ===

impl<K, S, Req> Service<Req> for Balance<K, S>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Service<Req> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    Req: RequestStain,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BalanceFuture<S, Req>;

    /// Always ready. The balancer picks an endpoint per request in `call`, from the
    /// request's stain, so it cannot reserve one here; the picked endpoint's own
    /// readiness is awaited in the response future, in the caller's task. A request that
    /// no endpoint may serve (no instance at all included) fails at once with
    /// [`Unroutable`].
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    /// Routes the request: reads its stain (the request, then the task-local, else the
    /// policy's own lane), walks the policy's chain over the published index, picks an
    /// endpoint of the chosen subset and returns a future that calls a clone of it. When
    /// no endpoint fits, the future fails with [`Unroutable`].
    fn call(&mut self, mut req: Req) -> Self::Future {
        let inner = &*self.inner;
        let snapshot = inner.snapshot.load();
        let chosen = {
            let stain = gray_core::task::or_current(req.gray_stain());
            let key = inner
                .router
                .policy
                .key(&inner.router.service, stain.as_deref());
            inner.router.choose(&snapshot, &key, &Tried::NONE).map(|c| {
                let service = c.slot.entry.service.clone();
                (service, c.ticket(), c.routed(inner.router.record))
            })
        };
        match chosen {
            Ok((service, ticket, routed)) => {
                if let Some(routed) = routed {
                    req.record_routed(routed);
                }
                BalanceFuture::new(service, req, ticket)
            }
            Err(e) => BalanceFuture::failed(Box::new(e)),
        }
    }
}
