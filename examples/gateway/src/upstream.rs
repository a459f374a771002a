//! One routed service: its instances (from the registry), and the label-aware balancer
//! over them.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, Wake, Waker},
    time::Duration,
};

use futures_util::StreamExt;
use gray_balance::{BalanceLayer, RecordRouted, Routed, future::ResponseFuture as BalanceFuture};
use gray_core::{Labelled, Labels, Lane, Policy, Stain};
use gray_discovery::{
    Instance, ServiceInstances,
    http::{HttpEndpoint, HttpEndpoints, ResponseBody},
};
use http::{HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use pin_project_lite::pin_project;
use tokio::sync::{Notify, futures::OwnedNotified};
use tower::{BoxError, Service, discover::Change};

use crate::{
    config::ServiceConfig,
    metrics::{EndpointMetrics, Metrics},
};

/// What an endpoint knows about itself, shared by the requests it serves.
#[derive(Debug)]
struct Identity {
    service: Arc<str>,
    /// The id as a header value, built once.
    header: Option<HeaderValue>,
    /// Its answers, by lane and status.
    counters: Arc<EndpointMetrics>,
    metrics: Arc<Metrics>,
}

/// An endpoint that marks each response with the instance that served it
/// (`x-gray-instance`) and counts it, by lane, instance, status and fallback.
#[derive(Debug)]
pub struct Tagged<S> {
    inner: S,
    labels: Labels,
    me: Arc<Identity>,
}

impl<S> Labelled for Tagged<S> {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl<S> Service<Request<Incoming>> for Tagged<S>
where
    S: Service<Request<Incoming>, Response = Response<ResponseBody>, Error = BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = TaggedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let routed = req.extensions_mut().remove::<Routed>();
        let lane = req
            .extensions()
            .get::<Stain>()
            .and_then(|c| c.lane().cloned());
        TaggedFuture {
            inner: self.inner.call(req),
            done: Some((self.me.clone(), lane, routed)),
        }
    }
}

pin_project! {
    /// The response future of [`Tagged`].
    pub struct TaggedFuture<F> {
        #[pin]
        inner: F,
        done: Option<(Arc<Identity>, Option<Lane>, Option<Routed>)>,
    }
}

impl<F> Future for TaggedFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody>, BoxError>>,
{
    type Output = Result<Response<ResponseBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // An error is counted by the proxy, which turns it into a 502.
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        if let Some((me, lane, routed)) = this.done.take() {
            if let Some(header) = &me.header {
                res.headers_mut().insert(X_GRAY_INSTANCE, header.clone());
            }
            me.counters.request(lane.as_ref(), res.status().as_u16());
            if let Some(routed) = routed.filter(Routed::fallback) {
                me.metrics
                    .fallback(&me.service, lane.as_ref(), routed.subset().to_string());
            }
        }
        Poll::Ready(Ok(res))
    }
}

/// The response header naming the instance that served it.
pub const X_GRAY_INSTANCE: HeaderName = HeaderName::from_static("x-gray-instance");

type Endpoint = gray_discovery::Endpoint<HttpEndpoint<HttpConnector, Incoming>>;

type EndpointFuture = <Endpoint as Service<Request<Incoming>>>::Future;

/// The balancer handle the proxy sends through: shared by every connection.
pub type Balancer = Shared<BalanceFuture<TaggedFuture<EndpointFuture>>>;

/// The future of [`Balancer`]'s `send`.
pub type BalancerCall = SharedCall<BalanceFuture<TaggedFuture<EndpointFuture>>>;

type DynBalance<F> = dyn Service<Request<Incoming>, Response = Response<ResponseBody>, Error = BoxError, Future = F>
    + Send;

/// A balancer shared by every connection, behind a mutex that is held only while the
/// balancer checks readiness and dispatches a request, never across an await: a request
/// takes the lock once, for a few hundred nanoseconds, instead of a round trip through a
/// `Buffer`'s worker task.
///
/// The balancer has one waker slot; every request polls it with the same waker, which
/// wakes all the requests waiting for readiness at once (they are rare: only while no
/// instance is ready), so none of them is forgotten when another takes the slot.
pub struct Shared<F> {
    inner: Arc<Mutex<Box<DynBalance<F>>>>,
    /// Woken by the balancer; wakes every waiting request.
    ready: Arc<Notify>,
    /// `ready` as the waker the balancer is polled with.
    waker: Waker,
}

/// Wakes every request waiting on a [`Shared`] balancer.
struct WakeAll(Arc<Notify>);

impl Wake for WakeAll {
    fn wake(self: Arc<Self>) {
        self.0.notify_waiters();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_waiters();
    }
}

impl<F> std::fmt::Debug for Shared<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl<F> Clone for Shared<F> {
    fn clone(&self) -> Self {
        Shared {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl<F> Shared<F>
where
    F: Future<Output = Result<Response<ResponseBody>, BoxError>>,
{
    fn new(balance: Box<DynBalance<F>>) -> Self {
        let ready = Arc::new(Notify::new());
        Shared {
            inner: Arc::new(Mutex::new(balance)),
            waker: Waker::from(Arc::new(WakeAll(ready.clone()))),
            ready,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Box<DynBalance<F>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `req` through the balancer. In steady state an endpoint is ready and the
    /// request is dispatched under one lock; otherwise (no instance discovered yet) the
    /// returned future waits for readiness, at most `timeout`, checking again under the
    /// lock each time it is woken, so two connections never share one readiness. (Once
    /// dispatched, the endpoint's own response timeout applies.)
    pub fn send(&self, req: Request<Incoming>, timeout: Duration) -> SharedCall<F> {
        let state = match self.try_call(req) {
            Ok(state) => state,
            // Boxed: this path is taken only while no instance is ready, and it keeps the
            // future (which every request moves around) small.
            Err(req) => CallState::Waiting {
                wait: Box::pin(Wait {
                    notified: self.ready.clone().notified_owned(),
                    shared: self.clone(),
                    req: Some(req),
                    timer: tokio::time::sleep(timeout),
                    timeout,
                }),
            },
        };
        SharedCall { state }
    }

    /// Dispatches `req` if an endpoint is ready; gives it back if none is. The balancer
    /// is polled with the waker that wakes every waiting request.
    #[expect(
        clippy::result_large_err,
        reason = "the request goes back by value, as it came; both variants are as large"
    )]
    fn try_call(&self, req: Request<Incoming>) -> Result<CallState<F>, Request<Incoming>> {
        let mut cx = Context::from_waker(&self.waker);
        let mut balance = self.lock();
        match balance.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => Ok(CallState::Called {
                future: balance.call(req),
            }),
            Poll::Ready(Err(e)) => Ok(CallState::Failed { error: Some(e) }),
            Poll::Pending => Err(req),
        }
    }
}

/// No instance became ready within the upstream timeout.
#[derive(Debug)]
pub struct NotReady {
    /// How long the request waited.
    pub waited: Duration,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no instance became ready within {:?}", self.waited)
    }
}

impl std::error::Error for NotReady {}

pin_project! {
    /// A request waiting for the balancer to become ready.
    struct Wait<F> {
        // Made before each readiness check, so that a wake in between is not lost.
        #[pin]
        notified: OwnedNotified,
        shared: Shared<F>,
        req: Option<Request<Incoming>>,
        #[pin]
        timer: tokio::time::Sleep,
        timeout: Duration,
    }
}

pin_project! {
    /// The future of [`Shared::send`].
    pub struct SharedCall<F> {
        #[pin]
        state: CallState<F>,
    }
}

pin_project! {
    #[project = CallStateProj]
    enum CallState<F> {
        Called { #[pin] future: F },
        Waiting { wait: Pin<Box<Wait<F>>> },
        Failed { error: Option<BoxError> },
    }
}

impl<F> Future for SharedCall<F>
where
    F: Future<Output = Result<Response<ResponseBody>, BoxError>>,
{
    type Output = Result<Response<ResponseBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                CallStateProj::Called { future } => return future.poll(cx),
                CallStateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "polled after completion".into())));
                }
                CallStateProj::Waiting { wait } => {
                    let mut w = wait.as_mut().project();
                    let Some(req) = w.req.take() else {
                        return Poll::Ready(Err("polled after completion".into()));
                    };
                    match w.shared.try_call(req) {
                        Ok(ready) => ready,
                        Err(req) => {
                            *w.req = Some(req);
                            if w.notified.as_mut().poll(cx).is_ready() {
                                // Woken since the last check: listen again, check again.
                                w.notified.set(w.shared.ready.clone().notified_owned());
                                continue;
                            }
                            if w.timer.poll(cx).is_ready() {
                                w.req.take();
                                return Poll::Ready(Err(Box::new(NotReady { waited: *w.timeout })));
                            }
                            return Poll::Pending;
                        }
                    }
                }
            };
            state.set(next);
        }
    }
}

/// One routed service.
pub struct Upstream {
    /// Its name.
    pub name: Arc<str>,
    /// Its routing policy (the balancer holds a copy).
    pub policy: Policy,
    /// The balancer, shared by every connection.
    pub balancer: Balancer,
    /// Its instances in the registry, for the admin endpoint.
    pub instances: ServiceInstances,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("policy", &self.policy.name())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// Builds the balancer for `config` over `instances`, with connections from `pool`.
    pub fn new(
        config: &ServiceConfig,
        instances: ServiceInstances,
        pool: &HttpEndpoints<HttpConnector, Incoming>,
        metrics: &Arc<Metrics>,
    ) -> Upstream {
        let service: Arc<str> = config.name.as_str().into();
        let metrics = metrics.clone();
        let endpoints = instances.endpoints(pool.clone()).map(move |change| {
            change.map(|change| match change {
                Change::Insert(id, endpoint) => {
                    let labels = endpoint.labels().clone();
                    let me = Arc::new(Identity {
                        service: service.clone(),
                        header: HeaderValue::from_str(id.as_str()).ok(),
                        counters: metrics.endpoint(&service, &id),
                        metrics: metrics.clone(),
                    });
                    Change::Insert(
                        id,
                        Tagged {
                            inner: endpoint,
                            labels,
                            me,
                        },
                    )
                }
                Change::Remove(id) => Change::Remove(id),
            })
        });
        let balance = BalanceLayer::new(&config.name, config.policy.clone())
            .with_pick(config.pick)
            .with_routed(RecordRouted::Fallbacks)
            .build(endpoints);
        Upstream {
            name: config.name.as_str().into(),
            policy: config.policy.clone(),
            balancer: Shared::new(Box::new(balance)),
            instances,
        }
    }

    /// The instances known now, sorted by id.
    pub fn instances(&self) -> Vec<Instance> {
        self.instances.instances()
    }
}
