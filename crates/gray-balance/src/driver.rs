//! The background task of a balancer: it applies discovery changes, ejections,
//! readmissions and the end of probing to the index, and publishes the index after each
//! batch of changes.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    fmt,
    future::Future,
    hash::Hash,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Waker},
};

use arc_swap::ArcSwap;
use futures_util::{StreamExt, stream::FuturesUnordered, task::AtomicWaker};
use gray_core::{Labelled, backoff::Backoff};
use gray_policy::Policy;
use tokio::{
    sync::mpsc::UnboundedReceiver,
    time::{Instant, Sleep},
};
use tower::{
    BoxError,
    discover::{Change, Discover},
};

use crate::{
    health::{Probe, ProbeFuture},
    index::{Entry, Index, Snapshot, Standing},
    meter::{Event, Feedback, Id, Meter},
};

/// A probe under way, for the endpoint `Id`.
type Probing = Pin<Box<dyn Future<Output = (Id, Result<(), BoxError>)> + Send>>;

/// Changes applied per poll before the task publishes and yields to others.
const BUDGET: usize = 1024;

/// Set when the last balancer handle is dropped: the task ends.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    closed: AtomicBool,
    waker: AtomicWaker,
}

/// Held by the balancer's shared state; dropping it ends the background task.
#[derive(Debug)]
pub(crate) struct Close(Arc<Closing>);

// === impl Close ===

impl Drop for Close {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

/// The background task of a [`Balance`](crate::Balance), for callers who spawn it
/// themselves ([`Balance::pair`](crate::Balance::pair)): it follows the discovery stream
/// and applies ejections, readmissions and the end of probing, whether or not requests
/// flow, and publishes the result for requests to read.
///
/// It ends when every handle of its balancer is dropped.
#[must_use = "the balancer changes nothing unless its driver runs"]
pub struct Driver<D: Discover> {
    discover: Pin<Box<D>>,
    /// The stream ended: the endpoints stay as they are.
    ended: bool,
    /// Consecutive discovery errors, and when to poll the stream again.
    errors: u32,
    retry_at: Option<Instant>,
    retry_timer: Option<Pin<Box<Sleep>>>,
    index: Index<D::Key, D::Service>,
    service: Arc<str>,
    policy: Policy,
    ejection: Backoff,
    feedback: Arc<Feedback>,
    events: UnboundedReceiver<Event>,
    published: Arc<ArcSwap<Snapshot<D::Key, D::Service>>>,
    closing: Arc<Closing>,
    /// Readmissions due, earliest first.
    readmit: BinaryHeap<Reverse<(Instant, Id)>>,
    timer: Option<Pin<Box<Sleep>>>,
    /// How endpoints are checked before they come back, and the checks under way.
    probe: Probe,
    probes: FuturesUnordered<Probing>,
}

// The driver is never pinned in place: the stream it polls is boxed.
// === impl Driver ===

impl<D: Discover> Unpin for Driver<D> {}

impl<D: Discover> fmt::Debug for Driver<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("service", &self.service)
            .field("ended", &self.ended)
            .field("readmissions", &self.readmit.len())
            .field("probes", &self.probes.len())
            .finish_non_exhaustive()
    }
}

/// What the driver is made of; see [`Driver::new`].
pub(crate) struct Parts<K, S> {
    pub(crate) service: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) ejection: Backoff,
    pub(crate) probe: Probe,
    pub(crate) feedback: Arc<Feedback>,
    pub(crate) events: UnboundedReceiver<Event>,
    pub(crate) published: Arc<ArcSwap<Snapshot<K, S>>>,
}

impl<D> Driver<D>
where
    D: Discover,
    D::Key: Hash + Eq + Clone + fmt::Debug,
    D::Service: Labelled,
    D::Error: Into<BoxError>,
{
    /// A driver over `discover`, and the handle whose drop ends it. Applies and publishes
    /// the changes the stream has ready now, so that a balancer over a list known at
    /// construction routes at once.
    pub(crate) fn new(discover: D, parts: Parts<D::Key, D::Service>) -> (Self, Close) {
        let wildcard = parts.policy.unlabelled() == gray_policy::Unlabelled::Wildcard;
        let closing = Arc::new(Closing::default());
        let mut driver = Driver {
            discover: Box::pin(discover),
            ended: false,
            errors: 0,
            retry_at: None,
            retry_timer: None,
            index: Index::new(wildcard),
            service: parts.service,
            policy: parts.policy,
            ejection: parts.ejection,
            feedback: parts.feedback,
            events: parts.events,
            published: parts.published,
            closing: closing.clone(),
            readmit: BinaryHeap::new(),
            timer: None,
            probe: parts.probe,
            probes: FuturesUnordered::new(),
        };
        let mut cx = Context::from_waker(Waker::noop());
        // Bounded, should the stream never say `Pending`.
        let mut budget = 1 << 20;
        if driver.poll_discover(&mut cx, &mut budget) {
            driver.publish();
        }
        (driver, Close(closing))
    }

    fn publish(&self) {
        self.published.store(Arc::new(self.index.snapshot()));
    }

    /// Applies the changes the discovery stream has ready; `true` when any.
    fn poll_discover(&mut self, cx: &mut Context<'_>, budget: &mut usize) -> bool {
        let mut changed = false;
        while !self.ended && self.retry_at.is_none() && *budget > 0 {
            let change = match self.discover.as_mut().poll_discover(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    tracing::debug!(target: "gray::balance", service = %self.service, "discovery stream ended; keeping the endpoints");
                    self.ended = true;
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    self.errors = self.errors.saturating_add(1);
                    // How long a failing stream rests before it is polled again.
                    let delay = Backoff::default().delay(self.errors);
                    tracing::warn!(
                        target: "gray::balance",
                        service = %self.service,
                        error = %e.into(),
                        retry_in = ?delay,
                        "discovery failed; keeping the endpoints",
                    );
                    self.retry_at = Some(Instant::now() + delay);
                    break;
                }
                Poll::Ready(Some(Ok(change))) => change,
            };
            *budget -= 1;
            self.errors = 0;
            changed = true;
            match change {
                Change::Insert(key, service) => self.insert(key, service),
                Change::Remove(key) => {
                    if self.index.remove(&key) {
                        tracing::debug!(target: "gray::balance", service = %self.service, endpoint = ?key, "endpoint removed");
                    }
                }
            }
        }
        changed
    }

    fn insert(&mut self, key: D::Key, service: D::Service) {
        let labels = service.labels().clone();
        let class = self.policy.classify(&labels);
        tracing::debug!(
            target: "gray::balance",
            service = %self.service,
            endpoint = ?key,
            lane = class.lane().map(|l| l.as_str()),
            versions = ?class.versions(),
            "endpoint added",
        );
        let feedback = self.feedback.clone();
        let entry_key = key.clone();
        self.index.insert(key, class, |id| Entry {
            key: entry_key,
            service,
            labels,
            meter: Meter::new(id, feedback),
        });
    }

    /// Applies one request's report; `true` when the index changed.
    fn apply(&mut self, event: Event) -> bool {
        let (id, to) = match event {
            Event::Measured(id) => return self.index.measured(id),
            Event::Eject(id) => (id, Standing::Ejected),
            Event::Unready(id) => (id, Standing::Unready),
        };
        // Only a ready endpoint leaves: an unready or ejected one is out already.
        if self.index.state(id) != Some(Standing::Ready) {
            return false;
        }
        let Some(entry) = self.index.entry(id) else {
            return false;
        };
        let streak = entry.meter.ejected();
        let delay = self.ejection.delay(streak);
        tracing::debug!(
            target: "gray::balance",
            service = %self.service,
            endpoint = ?entry.key,
            for_ = ?delay,
            streak,
            "{}",
            match to {
                Standing::Ejected => "endpoint ejected after consecutive connection errors",
                _ => "endpoint unready: its readiness check failed",
            },
        );
        self.readmit.push(Reverse((Instant::now() + delay, id)));
        self.index.set_state(id, to)
    }

    /// Readmits endpoints whose time is up, or starts their probes, and arms the timer
    /// for the next; `true` when any came back.
    fn poll_readmissions(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        loop {
            let now = Instant::now();
            while let Some(&Reverse((at, id))) = self.readmit.peek() {
                if at > now {
                    break;
                }
                self.readmit.pop();
                let Some(entry) = self.index.entry(id).cloned() else {
                    continue;
                };
                let probe = entry
                    .service
                    .origin()
                    .and_then(|origin| self.probe.start(origin));
                match probe {
                    Some(probe) => {
                        tracing::debug!(target: "gray::balance", service = %self.service, endpoint = ?entry.key, check = ?self.probe.check(), "probing an ejected endpoint");
                        self.probes.push(Box::pin(probe_of(id, probe)));
                    }
                    None => changed |= self.readmit(id, &entry, "its backoff is over"),
                }
            }
            let Some(&Reverse((next, _))) = self.readmit.peek() else {
                self.timer = None;
                return changed;
            };
            if poll_timer(&mut self.timer, next, cx).is_pending() {
                return changed;
            }
        }
    }

    /// Brings `id` back into its subsets; `true` when it was out.
    fn readmit(&mut self, id: Id, entry: &Entry<D::Key, D::Service>, why: &str) -> bool {
        entry.meter.readmitted();
        let back = self.index.set_state(id, Standing::Ready);
        if back {
            tracing::debug!(target: "gray::balance", service = %self.service, endpoint = ?entry.key, "endpoint readmitted: {why}");
        }
        back
    }

    /// Applies the probes that finished: a pass readmits, a failure keeps the endpoint
    /// out for the next, longer delay. `(changed, delayed)`: whether any came back, and
    /// whether any readmission was scheduled (its timer is not armed yet).
    fn poll_probes(&mut self, cx: &mut Context<'_>) -> (bool, bool) {
        let mut changed = false;
        let mut delayed = false;
        while let Poll::Ready(Some((id, result))) = self.probes.poll_next_unpin(cx) {
            // Removed or replaced meanwhile: nothing to do.
            let Some(entry) = self.index.entry(id).cloned() else {
                continue;
            };
            match result {
                Ok(()) => changed |= self.readmit(id, &entry, "its probe passed"),
                Err(e) => {
                    let streak = entry.meter.ejected();
                    let delay = self.ejection.delay(streak);
                    tracing::debug!(
                        target: "gray::balance",
                        service = %self.service,
                        endpoint = ?entry.key,
                        error = %e,
                        for_ = ?delay,
                        streak,
                        "probe failed; the endpoint stays out",
                    );
                    self.readmit.push(Reverse((Instant::now() + delay, id)));
                    delayed = true;
                }
            }
        }
        (changed, delayed)
    }

    /// Ends the rest of a failing discovery stream when its time is up.
    fn poll_retry(&mut self, cx: &mut Context<'_>) {
        let Some(at) = self.retry_at else {
            return;
        };
        if poll_timer(&mut self.retry_timer, at, cx).is_ready() {
            self.retry_at = None;
            self.retry_timer = None;
        }
    }
}

/// The probe of endpoint `id`, yielding its id with its outcome.
async fn probe_of(id: Id, probe: ProbeFuture) -> (Id, Result<(), BoxError>) {
    (id, probe.await)
}

/// Polls `timer`, (re)armed for `at`.
fn poll_timer(timer: &mut Option<Pin<Box<Sleep>>>, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if timer.deadline() != at {
        timer.as_mut().reset(at);
    }
    timer.as_mut().poll(cx)
}

impl<D> Future for Driver<D>
where
    D: Discover,
    D::Key: Hash + Eq + Clone + fmt::Debug,
    D::Service: Labelled,
    D::Error: Into<BoxError>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.closing.waker.register(cx.waker());
        if this.closing.closed.load(Ordering::Acquire) {
            tracing::debug!(target: "gray::balance", service = %this.service, "balancer dropped; its driver ends");
            return Poll::Ready(());
        }
        let mut budget = BUDGET;
        let mut changed = false;
        loop {
            // A stream that failed rests (on a timer) before it is polled again.
            this.poll_retry(cx);
            if this.retry_at.is_some() {
                break;
            }
            changed |= this.poll_discover(cx, &mut budget);
            if this.retry_at.is_none() {
                break;
            }
        }
        while budget > 0 {
            match this.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    budget -= 1;
                    changed |= this.apply(event);
                }
                // The driver holds a sender (in `feedback`): never `None`.
                _ => break,
            }
        }
        // Readmissions start probes, which are polled at once (a refused connection
        // fails on the spot); a failed probe schedules a readmission, whose timer the
        // next round arms.
        loop {
            changed |= this.poll_readmissions(cx);
            let (back, delayed) = this.poll_probes(cx);
            changed |= back;
            if !delayed {
                break;
            }
        }
        if changed {
            this.publish();
        }
        if budget == 0 {
            // More is waiting: let other tasks run first.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
