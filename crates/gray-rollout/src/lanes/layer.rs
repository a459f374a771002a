//! The tower layer that records each request into a [`LaneStats`].

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use gray_core::Stain;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::{LaneStats, Slot};
use crate::Outcome;

/// Records every request of the wrapped HTTP service into a shared [`LaneStats`]: its lane
/// from the request's [`Stain`] extension (none: `baseline`), its outcome from the response
/// status ([`Outcome::of_status`]; an error instead of a response is bad), and its latency
/// from the call until the response head. The body is not timed: a streamed body's
/// duration is the client's and the payload's as much as the service's.
///
/// Per request: one slot lookup (a few lane comparisons), two clock reads, four relaxed
/// atomic additions; no lock, no allocation (but the first request of a new lane, which
/// allocates its histogram), no boxing.
///
/// ```
/// use std::{convert::Infallible, sync::Arc};
/// use gray_core::{Lane, Stain};
/// use gray_rollout::lanes::{LaneStats, RecordLanesLayer};
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let stats = Arc::new(LaneStats::new(8));
/// let svc = RecordLanesLayer::new(stats.clone()).layer(service_fn(|req: Request<()>| async move {
///     let gray = req.extensions().get::<Stain>().is_some_and(|s| s.lane().is_some());
///     let mut res = Response::new(());
///     if gray {
///         *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
///     }
///     Ok::<_, Infallible>(res)
/// }));
/// let mut req = Request::new(());
/// req.extensions_mut().insert(Stain::in_lane(Lane::new("gray").unwrap()));
/// svc.clone().oneshot(req).await.unwrap();
/// svc.oneshot(Request::new(())).await.unwrap();
///
/// let snapshot = stats.snapshot();
/// let count = |lane: &str| snapshot.iter().find(|s| s.lane == lane).map(|s| (s.requests, s.bad));
/// assert_eq!(count("gray"), Some((1, 1)));
/// assert_eq!(count("baseline"), Some((1, 0)));
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct RecordLanesLayer {
    stats: Arc<LaneStats>,
}

impl RecordLanesLayer {
    /// A layer recording into `stats`.
    #[must_use]
    pub fn new(stats: Arc<LaneStats>) -> Self {
        RecordLanesLayer { stats }
    }
}

impl<S> Layer<S> for RecordLanesLayer {
    type Service = RecordLanes<S>;

    fn layer(&self, inner: S) -> RecordLanes<S> {
        RecordLanes {
            inner,
            stats: self.stats.clone(),
        }
    }
}

// === impl RecordLanes ===

/// The service of [`RecordLanesLayer`].
#[derive(Debug, Clone)]
pub struct RecordLanes<S> {
    inner: S,
    stats: Arc<LaneStats>,
}

impl<S, B, RB> Service<Request<B>> for RecordLanes<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = RecordLanesFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[allow(
        clippy::disallowed_methods,
        reason = "the one clock read of gray-rollout: the layer times the request it records"
    )]
    fn call(&mut self, req: Request<B>) -> Self::Future {
        let lane = req.extensions().get::<Stain>().and_then(Stain::lane);
        let slot = self.stats.slot(lane);
        RecordLanesFuture {
            inner: self.inner.call(req),
            stats: self.stats.clone(),
            slot,
            start: Instant::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RecordLanes`]: records when the inner future is ready.
    #[derive(Debug)]
    pub struct RecordLanesFuture<F> {
        #[pin]
        inner: F,
        stats: Arc<LaneStats>,
        slot: Slot,
        start: Instant,
    }
}

impl<F, RB, E> Future for RecordLanesFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        let outcome = match &result {
            Ok(res) => Outcome::of_status(res.status().as_u16()),
            Err(_) => Outcome::Error,
        };
        this.stats
            .at(*this.slot)
            .record(outcome, this.start.elapsed());
        Poll::Ready(result)
    }
}
