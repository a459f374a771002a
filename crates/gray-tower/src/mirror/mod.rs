//! Client side: copy baseline's outbound requests to another lane, fire and forget
//! ([`MirrorLayer`]): a service mirrors its own calls to the next service's gray lane, a
//! dark launch of that service behind it.
//!
//! Around any client that speaks `http::Request` (hyper-util's `Client`, a gray balancer, a
//! tonic `Channel`), the layer copies each request whose stain is baseline (found as
//! [`PropagateStainLayer`](crate::PropagateStainLayer) finds it: extensions, task-local,
//! OpenTelemetry baggage), when its method is listed (`GET` and `HEAD` by default: safe
//! methods only), the percentage draw takes it, and fewer than `max_in_flight` copies are
//! in flight. The guarantees are the gateway's:
//!
//! - **The request never waits for its copy.** The copy runs in a task of its own
//!   (spawned on the caller's tokio runtime; outside of one, no copy is made), through
//!   the mirror service you give, within `timeout`; the
//!   request's future is the inner client's, unchanged. Beyond `max_in_flight` a copy is
//!   dropped and counted, never queued.
//! - **A body is teed while it streams** ([`Teed`]), kept by reference up to
//!   `max_body_bytes`; past that the copy is dropped and the body goes on untouched. A
//!   body whose length says it is over the cap is not teed at all.
//! - **The copy carries the lane's stain**: in its extensions, on every carrier (replacing
//!   the request's) and as its task-local, and [`X_GRAY_MIRROR`]`: 1`, so that a balancer
//!   routes it to the lane and the services behind route its own calls there too.
//! - **Its answer is read to its end and thrown away**; [`MirrorStats`] counts what
//!   happened (sent, dropped busy, dropped for the body, failed, answered).
//!
//! What a copy's calls may reach is yours to bound: the copy's stain sends the calls of
//! the services behind the shadow to their own instances of the lane, and a policy with a
//! fallback sends them on to baseline where a service has none. Mirror only what is safe
//! to repeat (the default methods), or let the shadow's services see `x-gray-mirror` and
//! skip their effects. The gateway also compares each copy's answer with the answer the
//! user got (its `[services.x.mirror]` table); this layer only copies.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use bytes::Bytes;
//! use gray_tower::{Lane, mirror::{Copier, MirrorLayer}};
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // Stand-ins for two clients: the one baseline's calls go through, and the gray one.
//! let copies = Arc::new(Mutex::new(Vec::new()));
//! let seen = copies.clone();
//! let gray = service_fn(move |req: Request<Full<Bytes>>| {
//!     seen.lock().unwrap().push(req.headers()["x-gray-lane"].clone());
//!     async { Ok::<_, tower::BoxError>(Response::new(Full::new(Bytes::from("gray")))) }
//! });
//! let mirror = MirrorLayer::new(Copier::new(Lane::new("gray")?), gray);
//! let stats = mirror.stats();
//! let mut client = ServiceBuilder::new().layer(mirror).service(service_fn(
//!     |_: Request<_>| async { Ok::<_, tower::BoxError>(Response::new("baseline")) },
//! ));
//!
//! let res = client.ready().await?.call(Request::new(Full::new(Bytes::new()))).await?;
//! assert_eq!(*res.body(), "baseline");
//! // The copy went on its own; wait for it (a test would bound this wait).
//! while stats.answered() == 0 {
//!     tokio::task::yield_now().await;
//! }
//! assert_eq!(copies.lock().unwrap()[0], "gray");
//! # Ok(())
//! # }
//! ```

mod shed;
mod tee;

use std::{
    future::poll_fn,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use gray_core::{Carriers, Lane, Stain};
use http::{HeaderName, HeaderValue, Method, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::sync::oneshot;
use tower_layer::Layer;
use tower_service::Service;

pub use self::{
    shed::Shed,
    tee::{Catch, Caught, Tee, Teed},
};

/// The header that marks a copy (`x-gray-mirror: 1`).
pub const X_GRAY_MIRROR: HeaderName = HeaderName::from_static("x-gray-mirror");

/// The decision of which requests are copied, and the places of the copies in flight:
/// what [`MirrorLayer`] copies by, and the piece a custom gateway makes its own copies
/// with ([`Copier::offer`]). Cheap to clone: clones share their places.
#[derive(Debug, Clone)]
pub struct Copier {
    lane: Lane,
    /// The draw a request must fall under, out of 2^32 (`percent`).
    threshold: u64,
    methods: Vec<Method>,
    max_body_bytes: usize,
    max_in_flight: usize,
    carriers: Arc<Carriers>,
    in_flight: Arc<AtomicUsize>,
    /// Declines every copy while on.
    shed: Option<Shed>,
}

/// Why [`Copier::offer`] made no copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Declined {
    /// The request is not one to copy: not baseline's, a method not listed, or not drawn.
    NotCopied,
    /// `max_in_flight` copies are in flight, or copies are shed ([`Shed`]).
    Busy,
    /// Its body's length is over `max_body_bytes`.
    Body,
}

/// A copy of a request, made by [`Copier::offer`]: its head, the tee its request's body
/// is to go through, and its place among the copies in flight (released when the copy is
/// dropped).
#[derive(Debug)]
pub struct Copy {
    head: Request<()>,
    /// The lane's stain, put on `head` the first time it is asked for.
    lane: Stain,
    carriers: Arc<Carriers>,
    stained: bool,
    tee: Option<Tee>,
    body: Option<oneshot::Receiver<Caught>>,
    place: Place,
}

/// A copy's place among its [`Copier`]'s copies in flight, released when dropped.
#[derive(Debug)]
pub struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Copy {
    /// The tee the request's body goes through (`Teed::new(body, copy.take_tee())`);
    /// `None` for a request without a body, and once taken.
    pub fn take_tee(&mut self) -> Option<Tee> {
        self.tee.take()
    }

    /// The copy's stain: the lane's (with the request's inherited baggage).
    #[must_use]
    pub fn lane_stain(&self) -> Stain {
        self.lane.clone()
    }

    /// The copied request's method.
    #[must_use]
    pub fn method(&self) -> &Method {
        self.head.method()
    }

    /// The copy's head: the request's method, target, version and headers, the lane's
    /// stain on every carrier, in its extensions, and [`X_GRAY_MIRROR`]. The stain is put
    /// on the first time the head is asked for, not when the copy is made: where the copy
    /// is sent from a task of its own, that work is off the request's path.
    pub fn head(&mut self) -> &Request<()> {
        if !self.stained {
            self.stained = true;
            self.carriers.inject(&self.lane, self.head.headers_mut());
            self.head
                .headers_mut()
                .insert(X_GRAY_MIRROR, HeaderValue::from_static("1"));
            self.head.extensions_mut().insert(self.lane.clone());
        }
        &self.head
    }

    /// The copy, once the request's body is whole (at once for a request without one),
    /// with its place; `None` when the body went over `max_body_bytes`, failed or was
    /// dropped unfinished (bound the wait with a timeout of your own).
    pub async fn into_request(mut self) -> Option<(Request<Full<Bytes>>, Place)> {
        let body = match self.body.take() {
            None => Bytes::new(),
            Some(caught) => match caught.await {
                Ok(Caught::Whole(body)) => body,
                _ => return None,
            },
        };
        self.head();
        let Copy { head, place, .. } = self;
        Some((head.map(|()| Full::new(body)), place))
    }
}

impl Copier {
    /// Copies to `lane` every baseline `GET` and `HEAD`, bodies up to 64 KiB, 256 copies in
    /// flight at most, the stain on the default [`Carriers`].
    #[must_use]
    pub fn new(lane: Lane) -> Self {
        Copier {
            lane,
            threshold: u64::from(u32::MAX),
            methods: vec![Method::GET, Method::HEAD],
            max_body_bytes: 64 * 1024,
            max_in_flight: 256,
            carriers: Arc::default(),
            in_flight: Arc::default(),
            shed: None,
        }
    }

    /// The share of baseline's requests copied, 0 to 100 (default 100; out of range is
    /// clamped, NaN is 0).
    #[must_use]
    pub fn with_percent(mut self, percent: f64) -> Self {
        let share = if percent.is_nan() {
            0.0
        } else {
            percent.clamp(0.0, 100.0) / 100.0
        };
        self.threshold = (share * f64::from(u32::MAX)) as u64;
        self
    }

    /// The methods copied (default `GET`, `HEAD`).
    #[must_use]
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// A body is teed up to this many bytes; a longer one gets no copy (default 65536).
    #[must_use]
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Copies in flight at once, at most (default 256); beyond it a copy is dropped.
    #[must_use]
    pub fn with_max_in_flight(mut self, copies: usize) -> Self {
        self.max_in_flight = copies;
        self
    }

    /// The carriers the copy's stain is written on, and the request's is read from
    /// (default [`Carriers::default`]); use the ones your other layers use.
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        self.carriers = Arc::new(carriers);
        self
    }

    /// Copies are declined ([`Declined::Busy`]) while `shed` is on.
    #[must_use]
    pub fn with_shed(mut self, shed: Shed) -> Self {
        self.shed = Some(shed);
        self
    }

    /// The lane copies go to.
    #[must_use]
    pub fn lane(&self) -> &Lane {
        &self.lane
    }

    /// The copies in flight now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The carriers the copies' stain is written on.
    #[must_use]
    pub fn carriers(&self) -> &Carriers {
        &self.carriers
    }

    /// A copy of `req`, when it is to be copied (see the [module docs](self)). Its stain
    /// is found as [`PropagateStainLayer`](crate::PropagateStainLayer) finds it (and a
    /// stain from OpenTelemetry baggage recorded in its extensions).
    pub fn offer<B: Body>(&self, req: &mut Request<B>) -> Result<Copy, Declined> {
        if !self.methods.contains(req.method()) {
            return Err(Declined::NotCopied);
        }
        let stain = gray_core::task::outbound(req.extensions_mut(), &self.carriers);
        if !stain.as_ref().is_none_or(Stain::is_baseline) {
            return Err(Declined::NotCopied);
        }
        if self.threshold < u64::from(u32::MAX)
            && (gray_core::rand::random_u64() >> 32) >= self.threshold
        {
            return Err(Declined::NotCopied);
        }
        let teed = !req.body().is_end_stream();
        if teed && req.body().size_hint().lower() > self.max_body_bytes as u64 {
            return Err(Declined::Body);
        }
        if self.shed.as_ref().is_some_and(Shed::is_on) {
            return Err(Declined::Busy);
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Declined::Busy);
        }
        let place = Place(self.in_flight.clone());
        let lane = Stain::in_lane(self.lane.clone())
            .with_baggage(stain.as_ref().and_then(Stain::baggage).cloned());
        let mut head = Request::new(());
        *head.method_mut() = req.method().clone();
        *head.uri_mut() = req.uri().clone();
        *head.version_mut() = req.version();
        *head.headers_mut() = req.headers().clone();
        let (tee, body) = if teed {
            let (tee, caught) = Tee::new(self.max_body_bytes);
            (Some(tee), Some(caught))
        } else {
            (None, None)
        };
        Ok(Copy {
            head,
            lane,
            carriers: self.carriers.clone(),
            stained: false,
            tee,
            body,
            place,
        })
    }
}

/// What happened to the copies.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    sent: AtomicU64,
    dropped_busy: AtomicU64,
    dropped_body: AtomicU64,
    failed: AtomicU64,
    answered: AtomicU64,
}

impl Counters {
    /// A copy was not made for `declined`.
    pub(crate) fn declined(&self, declined: Declined) {
        let counter = match declined {
            Declined::Busy => &self.dropped_busy,
            Declined::Body => &self.dropped_body,
            Declined::NotCopied => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy was not sent: its body did not come whole.
    fn unsent(&self) {
        self.dropped_body.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy was sent.
    pub(crate) fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy ended: `answered` whole, or failed.
    pub(crate) fn finished(&self, answered: bool) {
        let counter = if answered {
            &self.answered
        } else {
            &self.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A layer copying baseline's requests to a lane; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct MirrorLayer<M> {
    mirror: M,
    copier: Copier,
    timeout: Duration,
    counters: Arc<Counters>,
}

/// What a [`MirrorLayer`]'s copies did, read at any time (cheap to clone).
#[derive(Debug, Clone)]
pub struct MirrorStats(Arc<Counters>, Copier);

impl MirrorStats {
    pub(crate) fn new(counters: Arc<Counters>, copier: Copier) -> Self {
        MirrorStats(counters, copier)
    }

    /// Copies sent to the mirror service.
    #[must_use]
    pub fn sent(&self) -> u64 {
        self.0.sent.load(Ordering::Relaxed)
    }

    /// Copies not made because `max_in_flight` were in flight.
    #[must_use]
    pub fn dropped_busy(&self) -> u64 {
        self.0.dropped_busy.load(Ordering::Relaxed)
    }

    /// Copies not sent because of their body: over `max_body_bytes`, or not finished
    /// (failed, abandoned, or not within the timeout).
    #[must_use]
    pub fn dropped_body(&self) -> u64 {
        self.0.dropped_body.load(Ordering::Relaxed)
    }

    /// Copies that failed: the mirror service refused them, failed, or did not answer
    /// whole within the timeout.
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.0.failed.load(Ordering::Relaxed)
    }

    /// Copies answered (whatever their status), their answer read to its end.
    #[must_use]
    pub fn answered(&self) -> u64 {
        self.0.answered.load(Ordering::Relaxed)
    }

    /// Copies in flight now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.1.in_flight()
    }
}

impl<M> MirrorLayer<M> {
    /// Copies what `copier` takes through `mirror`, 5 s for each.
    pub fn new(copier: Copier, mirror: M) -> Self {
        MirrorLayer {
            mirror,
            copier,
            timeout: Duration::from_secs(5),
            counters: Arc::default(),
        }
    }

    /// The time a copy has, from the request to the end of its answer (default 5 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What the copies of every service this layer makes did.
    #[must_use]
    pub fn stats(&self) -> MirrorStats {
        MirrorStats::new(self.counters.clone(), self.copier.clone())
    }
}

impl<S, M: Clone> Layer<S> for MirrorLayer<M> {
    type Service = Mirror<S, M>;

    fn layer(&self, inner: S) -> Mirror<S, M> {
        Mirror {
            inner,
            mirror: self.mirror.clone(),
            copier: self.copier.clone(),
            timeout: self.timeout,
            counters: self.counters.clone(),
        }
    }
}

/// The service of [`MirrorLayer`]: the inner client, its baseline requests copied.
#[derive(Debug, Clone)]
pub struct Mirror<S, M> {
    inner: S,
    mirror: M,
    copier: Copier,
    timeout: Duration,
    counters: Arc<Counters>,
}

impl<S, M, B, RB> Service<Request<B>> for Mirror<S, M>
where
    S: Service<Request<Teed<B>>>,
    B: Body<Data = Bytes>,
    M: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    M::Future: Send,
    RB: Body + Send + 'static,
    RB::Data: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        let tee = match self.copier.offer(&mut req) {
            Ok(mut copy) => {
                let tee = copy.take_tee();
                let lane = copy.lane_stain();
                let run = run(
                    self.mirror.clone(),
                    copy,
                    self.counters.clone(),
                    self.timeout,
                );
                spawn(gray_core::task::scope(lane, run));
                tee
            }
            Err(declined) => {
                self.counters.declined(declined);
                None
            }
        };
        self.inner.call(req.map(|body| Teed::new(body, tee)))
    }
}

/// Runs a copy on the caller's tokio runtime; outside of one (a client called from a
/// thread of its own), the copy is dropped rather than a panic.
pub(crate) fn spawn<F>(copy: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(copy);
    }
}

/// Sends `copy` through `mirror` once its body is whole, reads its answer to the end, and
/// counts what happened, all within `timeout`.
async fn run<M, RB>(mut mirror: M, copy: Copy, counters: Arc<Counters>, timeout: Duration)
where
    M: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    RB: Body,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let Ok(Some((req, _place))) = tokio::time::timeout_at(deadline, copy.into_request()).await
    else {
        counters.unsent();
        return;
    };
    counters.sent();
    let answered = tokio::time::timeout_at(deadline, async {
        poll_fn(|cx| mirror.poll_ready(cx)).await.ok()?;
        let response = mirror.call(req).await.ok()?;
        let mut body = std::pin::pin!(response.into_body());
        while let Some(frame) = body.frame().await {
            frame.ok()?;
        }
        Some(())
    })
    .await;
    counters.finished(matches!(answered, Ok(Some(()))));
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    #[test]
    fn outside_a_tokio_runtime_the_request_goes_and_no_copy_is_made() {
        let gray = tower::service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let layer = MirrorLayer::new(Copier::new(Lane::new("gray").unwrap()), gray);
        let stats = layer.stats();
        let mut client = layer.layer(tower::service_fn(|_: Request<_>| async {
            Ok::<_, std::convert::Infallible>(Response::new("baseline"))
        }));
        // No runtime: the call is polled by hand (its future is ready at once).
        let mut call = std::pin::pin!(client.call(Request::new(Full::new(Bytes::new()))));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let Poll::Ready(Ok(response)) = call.as_mut().poll(&mut cx) else {
            panic!("the call is ready at once");
        };
        assert_eq!(*response.body(), "baseline");
        assert_eq!((stats.sent(), stats.in_flight()), (0, 0));
    }
}
