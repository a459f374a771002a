use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    fmt,
    future::Future,
    hash::{BuildHasher, Hash},
    marker::PhantomData,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

use futures_util::task::AtomicWaker;
use gray_core::{
    Labelled, Labels, Policy, Stain, Unroutable,
    matching::{Availability, Candidate, Decision, Key, Miss, OwnedSubset},
};
use tokio::time::{Instant, Sleep};
use tower::{
    BoxError,
    discover::{Change, Discover},
    load::{CompleteOnResponse, Load, PeakEwma, PendingRequests},
};
use tower_service::Service;

use crate::{
    error,
    future::ResponseFuture,
    health::{Classifier, Ejection, Health},
    index::{Index, Parts, State},
    layer::BalanceLayer,
};

/// Where the balancer finds a request's [`Stain`]: in the request itself (for an
/// `http::Request`, its extensions). When it is not there, the balancer reads the
/// task-local context ([`gray_core::task::current`]).
pub trait RequestStain {
    /// The context the request carries, if any.
    fn gray_stain(&self) -> Option<&Stain>;

    /// Records on the request how it was routed, when the balancer was built with
    /// [`BalanceLayer::with_routed`](crate::BalanceLayer::with_routed). Does nothing by
    /// default.
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

/// How one request was routed: the subset it was picked from and whether that subset was
/// a fallback. Recorded on the request with [`RequestStain::record_routed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    subset: OwnedSubset,
    fallback: bool,
}

impl Routed {
    /// The subset the endpoint was picked from.
    pub fn subset(&self) -> &OwnedSubset {
        &self.subset
    }

    /// `true` when that subset is not the request's primary one.
    pub fn fallback(&self) -> bool {
        self.fallback
    }
}

/// Which requests the balancer records a [`Routed`] on; see
/// [`BalanceLayer::with_routed`](crate::BalanceLayer::with_routed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecordRouted {
    /// None (the default).
    #[default]
    Never,
    /// Only those served from a fallback subset: nothing is added to the others.
    Fallbacks,
    /// Every routed request.
    Always,
}

/// How the balancer picks among the ready endpoints of a subset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// Power of two choices over tower's [`PeakEwma`] load (the default).
    PeakEwma {
        /// The round-trip time assumed for an endpoint without measurements.
        default_rtt: Duration,
        /// How fast old measurements fade.
        decay: Duration,
    },
    /// Power of two choices over tower's [`PendingRequests`] load (in-flight requests).
    PendingRequests,
    /// Round-robin within the subset (seed 002).
    RoundRobin,
}

impl Default for Pick {
    /// Peak-EWMA with a 30 ms default RTT and a 10 s decay.
    fn default() -> Self {
        Pick::PeakEwma {
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
        }
    }
}

enum Meter<S> {
    Ewma(PeakEwma<S>),
    Pending(PendingRequests<S>),
    Plain(S),
}

impl<S> Meter<S> {
    fn new(service: S, pick: Pick) -> Self {
        match pick {
            Pick::PeakEwma { default_rtt, decay } => {
                let decay_ns = (decay.as_nanos() as f64).max(1.0);
                Meter::Ewma(PeakEwma::new(
                    service,
                    default_rtt,
                    decay_ns,
                    CompleteOnResponse::default(),
                ))
            }
            Pick::PendingRequests => {
                Meter::Pending(PendingRequests::new(service, CompleteOnResponse::default()))
            }
            Pick::RoundRobin => Meter::Plain(service),
        }
    }

    /// `true` when `self` carries no more load than `other`.
    fn lighter(&self, other: &Self) -> bool {
        match (self, other) {
            (Meter::Ewma(a), Meter::Ewma(b)) => a.load() <= b.load(),
            (Meter::Pending(a), Meter::Pending(b)) => a.load() <= b.load(),
            _ => true,
        }
    }

    fn poll_ready<Req>(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
    {
        match self {
            Meter::Ewma(s) => Service::<Req>::poll_ready(s, cx),
            Meter::Pending(s) => Service::<Req>::poll_ready(s, cx),
            Meter::Plain(s) => s.poll_ready(cx),
        }
    }

    fn call<Req>(
        &mut self,
        req: Req,
        health: &Arc<Health>,
        classify: Classifier,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Req>,
    {
        let health = health.clone();
        match self {
            Meter::Ewma(s) => ResponseFuture::ewma(s.call(req), health, classify),
            Meter::Pending(s) => ResponseFuture::pending(s.call(req), health, classify),
            Meter::Plain(s) => ResponseFuture::plain(s.call(req), health, classify),
        }
    }
}

struct Endpoint<S> {
    meter: Meter<S>,
    labels: Labels,
    health: Arc<Health>,
}

/// Wakes the balancer's task when an endpoint that was not ready may have become ready.
#[derive(Default)]
struct Park {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Park {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Wakes the balancer's task when the discovery stream may have a change, and remembers
/// that it did: `poll_ready` polls the stream only then, not on every call (a stream's
/// idle poll, a watch channel's for one, costs more than the rest of `poll_ready`).
struct DiscoveryWake {
    woken: AtomicBool,
    park: Arc<Park>,
}

impl Wake for DiscoveryWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.park.task.wake();
    }
}

/// A xorshift64* generator: enough for picking two endpoints, no allocation, no lock.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        Rng(std::hash::RandomState::new().hash_one(0x9e37_79b9_u64) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// The mutable state, apart from the policy (which the request's key borrows).
struct Core<K, S> {
    service: Arc<str>,
    pick: Pick,
    record: RecordRouted,
    ejection: Ejection,
    classify: Classifier,
    index: Index<K, Endpoint<S>>,
    /// Endpoints to poll for readiness at the next `poll_ready`.
    queued: Vec<(usize, u64)>,
    /// Endpoints that answered `Pending`; polled again once `park` is woken.
    parked: Vec<(usize, u64)>,
    park: Arc<Park>,
    park_waker: Waker,
    ejected: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    sleep: Option<Pin<Box<Sleep>>>,
    rng: Rng,
}

/// The label-aware, per-request balancer; see the [crate docs](crate).
///
/// Built by [`BalanceLayer`] (or [`Balance::new`]) over a [`Discover`] stream of
/// endpoints that are [`Labelled`] services.
pub struct Balance<D: Discover, Req> {
    discover: D,
    discover_done: bool,
    /// Set when the discovery stream woke us: poll it.
    discover_wake: Arc<DiscoveryWake>,
    discover_waker: Waker,
    policy: Policy,
    core: Core<D::Key, D::Service>,
    _req: PhantomData<fn(Req)>,
}

impl<D: Discover, Req> fmt::Debug for Balance<D, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Balance")
            .field("service", &self.core.service)
            .field("policy", &self.policy.name())
            .field("pick", &self.core.pick)
            .field("endpoints", &self.core.index.len())
            .field("ready", &self.core.index.ready_len())
            .finish()
    }
}

impl<D, Req> Balance<D, Req>
where
    D: Discover,
    D::Key: Hash + Eq + Clone,
{
    /// A balancer for calls to `service`, routed by `policy`, over the endpoints that
    /// `discover` yields, with the default [`Pick`], [`Ejection`] and classifier.
    pub fn new(discover: D, service: impl AsRef<str>, policy: Policy) -> Self {
        BalanceLayer::new(service, policy).build(discover)
    }

    pub(crate) fn from_parts(
        discover: D,
        service: Arc<str>,
        policy: Policy,
        pick: Pick,
        ejection: Ejection,
        classify: Classifier,
        record: RecordRouted,
    ) -> Self {
        let park = Arc::new(Park::default());
        let park_waker = Waker::from(park.clone());
        let discover_wake = Arc::new(DiscoveryWake {
            // The stream has not been polled yet.
            woken: AtomicBool::new(true),
            park: park.clone(),
        });
        let wildcard = policy.unlabelled() == gray_core::Unlabelled::Wildcard;
        Balance {
            discover,
            discover_done: false,
            discover_waker: Waker::from(discover_wake.clone()),
            discover_wake,
            policy,
            core: Core {
                service,
                pick,
                record,
                ejection,
                classify,
                index: Index::new(wildcard),
                queued: Vec::new(),
                parked: Vec::new(),
                park,
                park_waker,
                ejected: BinaryHeap::new(),
                sleep: None,
                rng: Rng::new(),
            },
            _req: PhantomData,
        }
    }

    /// The service this balancer calls.
    pub fn service_name(&self) -> &str {
        &self.core.service
    }

    /// The routing policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The number of known endpoints (ready or not, ejected or not).
    pub fn len(&self) -> usize {
        self.core.index.len()
    }

    /// `true` when no endpoint is known.
    pub fn is_empty(&self) -> bool {
        self.core.index.len() == 0
    }

    /// The number of endpoints ready to take a request.
    pub fn ready_len(&self) -> usize {
        self.core.index.ready_len()
    }

    /// The decision the balancer would make for a request carrying `ctx` (`None`: no
    /// context at all) over its endpoints as of the last `poll_ready`: the same
    /// [`Policy::walk`], as a value (for a gateway's admin endpoint). An endpoint called
    /// since the last `poll_ready` shows as unready; one due for ejection, as ejected.
    pub fn explain(&self, ctx: Option<&Stain>) -> Decision<D::Key> {
        let ejection = &self.core.ejection;
        let candidates = self.core.index.slots().map(|slot| {
            let availability = match slot.state {
                State::Ejected => Availability::Ejected,
                _ if slot.endpoint.health.should_eject(ejection) => Availability::Ejected,
                State::Ready => Availability::Ready,
                State::Queued => Availability::Unready,
            };
            Candidate::new(slot.key.clone(), &slot.endpoint.labels, availability)
        });
        self.policy.decide(&self.core.service, ctx, candidates)
    }
}

impl<K: Hash + Eq + Clone + fmt::Debug, S> Core<K, S> {
    fn insert(&mut self, policy: &Policy, key: K, service: S)
    where
        S: Labelled,
    {
        let labels = service.labels().clone();
        let class = policy.classify(&labels);
        tracing::debug!(
            target: "gray::balance",
            service = %self.service,
            endpoint = ?key,
            lane = class.lane().map(|l| l.as_str()),
            versions = ?class.versions(),
            "endpoint added",
        );
        let endpoint = Endpoint {
            meter: Meter::new(service, self.pick),
            labels,
            health: Arc::default(),
        };
        let (slot, generation, _) = self.index.insert(key, endpoint, class);
        self.queued.push((slot, generation));
    }

    fn remove(&mut self, key: &K) {
        if self.index.remove(key).is_some() {
            tracing::debug!(target: "gray::balance", service = %self.service, endpoint = ?key, "endpoint removed");
        }
    }

    fn eject(&mut self, slot: usize) {
        let Some(s) = self.index.slot(slot) else {
            return;
        };
        let backoff = s.endpoint.health.eject(&self.ejection);
        let generation = s.generation;
        tracing::debug!(
            target: "gray::balance",
            service = %self.service,
            endpoint = ?s.key,
            ?backoff,
            "endpoint ejected after consecutive connection errors",
        );
        self.index.eject(slot);
        self.ejected
            .push(Reverse((Instant::now() + backoff, slot, generation)));
    }

    /// Readmits endpoints whose ejection is over, and arms the timer for the next one.
    fn poll_ejections(&mut self, cx: &mut Context<'_>) {
        if self.ejected.is_empty() {
            return;
        }
        let now = Instant::now();
        while let Some(&Reverse((at, slot, generation))) = self.ejected.peek() {
            if at > now {
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if sleep.deadline() != at {
                    sleep.as_mut().reset(at);
                }
                if sleep.as_mut().poll(cx).is_pending() {
                    break;
                }
            }
            self.ejected.pop();
            let current = self
                .index
                .slot(slot)
                .is_some_and(|s| s.generation == generation);
            if current && self.index.readmit(slot) {
                if let Some(s) = self.index.slot(slot) {
                    tracing::debug!(target: "gray::balance", service = %self.service, endpoint = ?s.key, "endpoint readmitted");
                }
                self.queued.push((slot, generation));
            }
        }
    }

    /// Polls the queued endpoints (and the parked ones, when one of them woke us).
    fn poll_endpoints<Req>(&mut self)
    where
        S: Service<Req>,
        S::Error: Into<BoxError>,
    {
        if self.park.woken.swap(false, Ordering::Acquire) {
            self.queued.append(&mut self.parked);
        }
        if self.queued.is_empty() {
            return;
        }
        let mut queued = std::mem::take(&mut self.queued);
        for (slot, generation) in queued.drain(..) {
            let Some(s) = self.index.live_slot_mut(slot, generation) else {
                continue;
            };
            if s.state != State::Queued {
                continue;
            }
            if s.endpoint.health.should_eject(&self.ejection) {
                self.eject(slot);
                continue;
            }
            let mut cx = Context::from_waker(&self.park_waker);
            match s.endpoint.meter.poll_ready::<Req>(&mut cx) {
                Poll::Ready(Ok(())) => self.index.set_ready(slot),
                Poll::Pending => self.parked.push((slot, generation)),
                Poll::Ready(Err(e)) => {
                    let e: BoxError = e.into();
                    let key = s.key.clone();
                    tracing::debug!(
                        target: "gray::balance",
                        service = %self.service,
                        endpoint = ?key,
                        error = %e,
                        "endpoint failed its readiness check; removed",
                    );
                    self.index.remove(&key);
                }
            }
        }
        // Keep the allocation for the next round.
        queued.append(&mut self.queued);
        self.queued = queued;
    }

    /// Picks a ready endpoint for `key`, ejecting unhealthy picks on the way.
    fn select(
        &mut self,
        policy: &Policy,
        key: &Key<'_>,
    ) -> Result<(usize, Option<Routed>), Unroutable> {
        loop {
            let index = &self.index;
            let mut parts = Parts::default();
            let walked = policy.walk(key, |subset| {
                parts = index.resolve(subset);
                index.counts(parts)
            });
            let route = match walked {
                Ok(route) => route,
                Err(miss) => {
                    tracing::debug!(
                        target: "gray::balance",
                        service = %self.service,
                        lane = key.lane().map(|l| l.as_str()),
                        pin = key.pin().map(|v| v.as_str()),
                        own_lane = key.is_own_lane(),
                        policy = policy.name(),
                        fallback_policy = %policy.fallback(),
                        reason = ?miss,
                        "unroutable",
                    );
                    return Err(policy.unroutable(&self.service, key, &miss));
                }
            };
            let n = route.counts.ready;
            let picked = match self.pick {
                Pick::RoundRobin => {
                    let i = self.index.next_cursor(parts, n);
                    self.index.ready_at(parts, i)
                }
                _ if n == 1 => self.index.ready_at(parts, 0),
                _ => {
                    let a = self.rng.below(n);
                    let mut b = self.rng.below(n - 1);
                    if b >= a {
                        b += 1;
                    }
                    match (self.index.ready_at(parts, a), self.index.ready_at(parts, b)) {
                        (Some(sa), Some(sb)) => {
                            let lighter = match (self.index.slot(sa), self.index.slot(sb)) {
                                (Some(x), Some(y)) => x.endpoint.meter.lighter(&y.endpoint.meter),
                                _ => true,
                            };
                            Some(if lighter { sa } else { sb })
                        }
                        (one, other) => one.or(other),
                    }
                }
            };
            let Some(slot) = picked.and_then(|id| self.index.slot(id).map(|s| (id, s))) else {
                // The counts said ready; the lists disagree. Never expected: fail the
                // request rather than call an endpoint that was not polled ready.
                let miss = Miss::Unready {
                    subset: route.subset,
                    present: route.counts.present,
                };
                return Err(policy.unroutable(&self.service, key, &miss));
            };
            let (id, s) = slot;
            if s.endpoint.health.should_eject(&self.ejection) {
                self.eject(id);
                continue;
            }
            tracing::debug!(
                target: "gray::balance",
                service = %self.service,
                lane = key.lane().map(|l| l.as_str()),
                pin = key.pin().map(|v| v.as_str()),
                own_lane = key.is_own_lane(),
                subset = %route.subset,
                subset_size = route.counts.present,
                ready = route.counts.ready,
                fallback = route.fallback,
                endpoint = ?s.key,
                "routed",
            );
            let record = match self.record {
                RecordRouted::Never => false,
                RecordRouted::Fallbacks => route.fallback,
                RecordRouted::Always => true,
            };
            let routed = record.then(|| Routed {
                subset: route.subset.to_owned(),
                fallback: route.fallback,
            });
            return Ok((id, routed));
        }
    }
}

impl<D, Req> Service<Req> for Balance<D, Req>
where
    D: Discover + Unpin,
    D::Key: Hash + Eq + Clone + fmt::Debug,
    D::Error: Into<BoxError>,
    D::Service: Service<Req> + Labelled,
    <D::Service as Service<Req>>::Error: Into<BoxError>,
    Req: RequestStain,
{
    type Response = <D::Service as Service<Req>>::Response;
    type Error = BoxError;
    type Future = ResponseFuture<<D::Service as Service<Req>>::Future>;

    /// Drives discovery, readmits endpoints whose ejection is over and polls the
    /// endpoints that are not ready. Ready when at least one endpoint is ready; pending
    /// otherwise (no endpoint yet, none ready, or all ejected), woken by discovery, by an
    /// endpoint that becomes ready or by the end of an ejection. Fails only when the
    /// discovery stream fails ([`error::Discover`]).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.core.park.task.register(cx.waker());
        let polled = !self.discover_done && self.discover_wake.woken.swap(false, Ordering::AcqRel);
        let mut discover_cx = Context::from_waker(&self.discover_waker);
        while polled && !self.discover_done {
            match Pin::new(&mut self.discover).poll_discover(&mut discover_cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    tracing::debug!(target: "gray::balance", service = %self.core.service, "discovery stream ended; keeping the endpoints");
                    self.discover_done = true;
                }
                Poll::Ready(Some(Err(e))) => {
                    // Polled again next time, as a stream that has not said `Pending`.
                    self.discover_wake.woken.store(true, Ordering::Release);
                    return Poll::Ready(Err(error::Discover::new(e.into()).into()));
                }
                Poll::Ready(Some(Ok(Change::Insert(key, service)))) => {
                    self.core.insert(&self.policy, key, service);
                }
                Poll::Ready(Some(Ok(Change::Remove(key)))) => self.core.remove(&key),
            }
        }
        self.core.poll_ejections(cx);
        self.core.poll_endpoints::<Req>();
        // Arm the timer for endpoints ejected just now; poll what came back meanwhile.
        self.core.poll_ejections(cx);
        if !self.core.queued.is_empty() {
            self.core.poll_endpoints::<Req>();
        }
        if self.core.index.ready_len() > 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// Routes the request: reads its context (the request, then the task-local, else the
    /// policy's own lane), walks the policy's chain over the subset index, picks a ready
    /// endpoint of the chosen subset and calls it. When no endpoint fits, the future
    /// fails with [`Unroutable`].
    fn call(&mut self, mut req: Req) -> Self::Future {
        let chosen = {
            let task_ctx;
            let ctx = match req.gray_stain() {
                Some(ctx) => Some(ctx),
                None => {
                    task_ctx = gray_core::task::current();
                    task_ctx.as_ref()
                }
            };
            let key = self.policy.key(&self.core.service, ctx);
            self.core.select(&self.policy, &key)
        };
        let classify = self.core.classify;
        match chosen {
            Ok((slot, routed)) => {
                if let Some(routed) = routed {
                    req.record_routed(routed);
                }
                self.core.index.set_unready(slot);
                let Some(s) = self.core.index.slot_mut(slot) else {
                    return ResponseFuture::failed("endpoint vanished".into(), classify);
                };
                self.core.queued.push((slot, s.generation));
                s.endpoint.meter.call(req, &s.endpoint.health, classify)
            }
            Err(e) => ResponseFuture::failed(Box::new(e), classify),
        }
    }
}
