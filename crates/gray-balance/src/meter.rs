//! What the request path knows about each endpoint, in atomics: its load (requests in
//! flight and a Peak-EWMA round-trip estimate), whether it is still being probed, and its
//! passive health. No lock: a pick reads a few atomics, a completion writes a few.
//!
//! Changes of membership (ejection, readmission, the end of probing) are not made here:
//! a completion sends an [`Event`] to the background task, which changes the index and
//! publishes it, so the counts the policy walks stay exact.

use std::sync::{
    Arc,
    atomic::{
        AtomicBool, AtomicU32, AtomicU64,
        Ordering::{Acquire, Relaxed, Release},
    },
};

use tokio::{sync::mpsc::UnboundedSender, time::Instant};

use crate::health::{Classifier, Failure};

/// Completed requests that take an endpoint out of probing; see the crate docs ("New
/// endpoints").
pub(crate) const PROBES: u32 = 3;

/// Marks an RTT estimate that has no measurement yet.
const UNMEASURED: u64 = u64::MAX;

/// A slot of the index and the generation of the endpoint in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Id {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

/// What a completion asks of the background task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Consecutive connection errors reached the ejection threshold.
    Eject(Id),
    /// The endpoint's `poll_ready` failed.
    Unready(Id),
    /// The endpoint completed its probes.
    Measured(Id),
}

/// How a request ended, for load and health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// A response: the round trip is measured.
    Success,
    /// An error, as the classifier reads it.
    Failed(Failure),
    /// The endpoint's `poll_ready` failed: it was never called.
    Unready,
}

/// The balancer's clock: nanoseconds since it was built, on tokio's clock (so paused
/// time works in tests).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(Instant);

// === impl Clock ===

impl Clock {
    pub(crate) fn new() -> Self {
        Clock(Instant::now())
    }

    pub(crate) fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.0)
            .as_nanos()
            .try_into()
            .unwrap_or(u64::MAX)
    }
}

/// Shared by every endpoint of one balancer.
#[derive(Debug)]
pub(crate) struct Feedback {
    events: UnboundedSender<Event>,
    clock: Clock,
    /// Peak-EWMA's decay, in nanoseconds; `None`: round trips are not measured.
    decay_ns: Option<f64>,
    /// Connection errors in a row that eject; 0: never.
    consecutive: u32,
    pub(crate) classify: Classifier,
}

// === impl Feedback ===

impl Feedback {
    /// `decay_ns`: Peak-EWMA's decay, when round trips are measured.
    pub(crate) fn new(
        events: UnboundedSender<Event>,
        clock: Clock,
        decay_ns: Option<f64>,
        consecutive: u32,
        classify: Classifier,
    ) -> Self {
        Feedback {
            events,
            clock,
            decay_ns: decay_ns.map(|d| d.max(1.0)),
            consecutive,
            classify,
        }
    }

    fn send(&self, event: Event) {
        // The background task is gone only when every balancer handle is: nobody listens.
        let _ = self.events.send(event);
    }
}

/// Anything that holds a [`Meter`]: the index's entries (the meter inline, one allocation
/// per endpoint), or a bare meter in tests.
pub(crate) trait Metered: Send + Sync {
    fn meter(&self) -> &Meter;
}

// === impl Meter ===

impl Metered for Meter {
    fn meter(&self) -> &Meter {
        self
    }
}

/// One endpoint's load and health.
#[derive(Debug)]
pub(crate) struct Meter {
    id: Id,
    feedback: Arc<Feedback>,
    /// Requests picked and not completed.
    pending: AtomicU32,
    /// The RTT estimate in nanoseconds (`f64` bits), or `UNMEASURED`.
    rtt: AtomicU64,
    /// When `rtt` was last written.
    stamp: AtomicU64,
    /// Requests completed since the endpoint joined (or came back), up to `PROBES`.
    completed: AtomicU32,
    /// A probe request is in flight.
    probing: AtomicBool,
    /// Connection errors in a row.
    failures: AtomicU32,
    /// Ejections (or readiness failures) in a row, without a success in between.
    streak: AtomicU32,
}

impl Meter {
    pub(crate) fn new(id: Id, feedback: Arc<Feedback>) -> Self {
        Meter {
            id,
            feedback,
            pending: AtomicU32::new(0),
            rtt: AtomicU64::new(UNMEASURED),
            stamp: AtomicU64::new(0),
            completed: AtomicU32::new(0),
            probing: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            streak: AtomicU32::new(0),
        }
    }

    pub(crate) fn feedback(&self) -> &Feedback {
        &self.feedback
    }

    /// The endpoint's slot and generation.
    pub(crate) fn id(&self) -> Id {
        self.id
    }

    /// `true` when the endpoint reached the ejection threshold and the background task has
    /// not ejected it yet: picks avoid it meanwhile.
    pub(crate) fn doomed(&self) -> bool {
        let consecutive = self.feedback.consecutive;
        consecutive > 0 && self.failures.load(Relaxed) >= consecutive
    }

    /// Claims the endpoint's one probe slot: `true` when it is still being probed, not
    /// doomed, and no probe is in flight.
    pub(crate) fn try_probe(&self) -> bool {
        self.completed.load(Relaxed) < PROBES
            && !self.doomed()
            && self
                .probing
                .compare_exchange(false, true, Acquire, Relaxed)
                .is_ok()
    }

    pub(crate) fn pending(&self) -> u32 {
        self.pending.load(Relaxed)
    }

    /// The RTT estimate and when it was written; `None` without a measurement.
    fn estimate(&self) -> (Option<f64>, u64) {
        let bits = self.rtt.load(Relaxed);
        let stamp = self.stamp.load(Relaxed);
        ((bits != UNMEASURED).then(|| f64::from_bits(bits)), stamp)
    }

    /// Peak-EWMA's cost at `now`: the RTT estimate, decayed since its last update, times
    /// the requests in flight plus one. An endpoint without a measurement costs
    /// `default_rtt_ns` per request.
    pub(crate) fn cost(&self, now: u64, default_rtt_ns: f64) -> f64 {
        let rtt = match self.estimate() {
            (None, _) => default_rtt_ns,
            (Some(rtt), stamp) => {
                let elapsed = now.saturating_sub(stamp) as f64;
                let decay = self.feedback.decay_ns.unwrap_or(1.0);
                rtt * (-elapsed / decay).exp()
            }
        };
        rtt * f64::from(self.pending() + 1)
    }

    /// `true` when `a` costs no more than `b` at `now` (Peak-EWMA): the same comparison
    /// as of the two [`cost`](Self::cost)s, with one exponential when both are measured
    /// (the decays differ only by the time between their last updates).
    pub(crate) fn lighter(a: &Meter, b: &Meter, now: u64, default_rtt_ns: f64) -> bool {
        match (a.estimate(), b.estimate()) {
            ((Some(ra), sa), (Some(rb), sb)) => {
                let decay = a.feedback.decay_ns.unwrap_or(1.0);
                let wa = ra * f64::from(a.pending() + 1);
                let wb = rb * f64::from(b.pending() + 1);
                // ra·e^(-(now-sa)/τ)·wa ≤ rb·e^(-(now-sb)/τ)·wb
                wa * ((sa as f64 - sb as f64) / decay).exp() <= wb
            }
            ((None, _), (None, _)) => a.pending() <= b.pending(),
            _ => a.cost(now, default_rtt_ns) <= b.cost(now, default_rtt_ns),
        }
    }

    /// Folds in a measured round trip. While probing, the last sample is the estimate
    /// (the first request of a new endpoint pays for its connection); after, a sample
    /// above the decayed estimate replaces it (the peak) and a lower one is averaged in.
    fn observe(&self, sample: f64, now: u64, probing: bool, decay_ns: f64) {
        let mut bits = self.rtt.load(Relaxed);
        loop {
            let next = if bits == UNMEASURED || probing {
                sample
            } else {
                let elapsed = now.saturating_sub(self.stamp.load(Relaxed)) as f64;
                let decay = (-elapsed / decay_ns).exp();
                let current = f64::from_bits(bits) * decay;
                if sample > current {
                    sample
                } else {
                    sample.mul_add(1.0 - decay, current)
                }
            };
            match self
                .rtt
                .compare_exchange_weak(bits, next.to_bits(), Relaxed, Relaxed)
            {
                Ok(_) => break,
                Err(actual) => bits = actual,
            }
        }
        self.stamp.store(now, Relaxed);
    }

    /// Counts an ejection (or a readiness failure, or a failed probe) in a row and
    /// returns how many there were. The error count stays: until the published index no
    /// longer lists the endpoint, picks go on avoiding it.
    pub(crate) fn ejected(&self) -> u32 {
        self.streak.fetch_add(1, Relaxed).saturating_add(1)
    }

    /// The endpoint comes back: its error count starts again, and it is probed again,
    /// from no measurement.
    pub(crate) fn readmitted(&self) {
        self.failures.store(0, Relaxed);
        self.rtt.store(UNMEASURED, Relaxed);
        self.completed.store(0, Relaxed);
    }

    /// `true` while the endpoint has completed fewer than `PROBES` requests.
    pub(crate) fn is_probing(&self) -> bool {
        self.completed.load(Relaxed) < PROBES
    }
}

/// One request's claim on an endpoint: counted in flight from the pick until it
/// completes or is dropped.
pub(crate) struct Ticket<O: ?Sized + Metered = dyn Metered> {
    owner: Arc<O>,
    /// When the request was picked, on the balancer's clock (when it measures).
    start: u64,
    probe: bool,
    open: bool,
}

// === impl Ticket ===

impl<O: ?Sized + Metered> std::fmt::Debug for Ticket<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.meter().id)
            .field("probe", &self.probe)
            .field("open", &self.open)
            .finish()
    }
}

impl<O: ?Sized + Metered> Ticket<O> {
    /// A claim on `owner`'s endpoint for a request picked at `start`.
    pub(crate) fn new(owner: Arc<O>, probe: bool, start: u64) -> Self {
        owner.meter().pending.fetch_add(1, Relaxed);
        Ticket {
            owner,
            start,
            probe,
            open: true,
        }
    }

    pub(crate) fn owner(&self) -> &O {
        &self.owner
    }

    /// When the request was picked, on the balancer's clock (0 when not measured).
    #[cfg(feature = "reqwest")]
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    pub(crate) fn meter(&self) -> &Meter {
        self.owner.meter()
    }

    /// Records how the request ended (once; later calls do nothing).
    pub(crate) fn finish(&mut self, completion: Completion) {
        if !self.open {
            return;
        }
        let m = self.owner.meter();
        let fb = &*m.feedback;
        let mut probing = false;
        if completion != Completion::Unready && m.completed.load(Relaxed) < PROBES {
            probing = true;
            let before = m.completed.fetch_add(1, Relaxed);
            if before + 1 == PROBES {
                fb.send(Event::Measured(m.id));
            }
        }
        if let (Completion::Success, Some(decay_ns)) = (completion, fb.decay_ns) {
            let now = fb.clock.now();
            m.observe(
                now.saturating_sub(self.start) as f64,
                now,
                probing,
                decay_ns,
            );
        }
        match completion {
            Completion::Success => {
                reset(&m.failures);
                reset(&m.streak);
            }
            Completion::Failed(Failure::Other) => reset(&m.failures),
            // The client's body failed: nothing said about the instance, either way.
            Completion::Failed(Failure::Client) => {}
            // Nothing listens there, or nothing answers at all: out at once. Picks avoid
            // it from now on (`doomed`), and the background task ejects it.
            Completion::Failed(f) if f.ejects_at_once() && fb.consecutive > 0 => {
                if m.failures.swap(fb.consecutive, Relaxed) < fb.consecutive {
                    fb.send(Event::Eject(m.id));
                }
            }
            Completion::Failed(_) => {
                let failures = m.failures.fetch_add(1, Relaxed).saturating_add(1);
                if fb.consecutive > 0 && failures == fb.consecutive {
                    fb.send(Event::Eject(m.id));
                }
            }
            Completion::Unready => fb.send(Event::Unready(m.id)),
        }
        self.release();
    }

    fn release(&mut self) {
        if self.open {
            self.open = false;
            let m = self.owner.meter();
            m.pending.fetch_sub(1, Relaxed);
            if self.probe {
                m.probing.store(false, Release);
            }
        }
    }
}

impl<O: ?Sized + Metered> Drop for Ticket<O> {
    /// A request dropped before it completed is released without a record.
    fn drop(&mut self) {
        self.release();
    }
}

/// Stores 0, skipping the write (and the cache line's ownership) when it is 0 already.
fn reset(counter: &AtomicU32) {
    if counter.load(Relaxed) != 0 {
        counter.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::*;

    fn meter(consecutive: u32) -> (Arc<Meter>, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let feedback = Feedback::new(
            tx,
            Clock::new(),
            Some(10e9),
            consecutive,
            crate::health::classify,
        );
        let id = Id {
            slot: 3,
            generation: 7,
        };
        (Arc::new(Meter::new(id, Arc::new(feedback))), rx)
    }

    #[tokio::test(start_paused = true)]
    async fn probes_then_peak_ewma() {
        let (m, mut rx) = meter(0);
        let default = 30e6;
        assert_eq!(m.cost(m.feedback.clock.now(), default), default);
        assert!(m.try_probe());
        assert!(!m.try_probe(), "one probe in flight at a time");
        let mut ticket = Ticket::new(m.clone(), true, m.feedback.clock.now());
        assert_eq!(m.pending(), 1);
        assert_eq!(m.cost(m.feedback.clock.now(), default), 2.0 * default);
        tokio::time::advance(Duration::from_millis(5)).await;
        ticket.finish(Completion::Success);
        assert_eq!(m.pending(), 0);
        let now = m.feedback.clock.now();
        assert_eq!(
            m.cost(now, default),
            5e6,
            "the probe's sample is the estimate"
        );
        // Two more probes (the last sample wins), then the endpoint is measured.
        for ms in [3, 1] {
            assert!(m.try_probe());
            let mut t = Ticket::new(m.clone(), true, m.feedback.clock.now());
            tokio::time::advance(Duration::from_millis(ms)).await;
            t.finish(Completion::Success);
        }
        assert_eq!(m.cost(m.feedback.clock.now(), default), 1e6);
        assert_eq!(rx.try_recv(), Ok(Event::Measured(m.id)));
        assert!(!m.try_probe() && !m.is_probing());
        // A slower sample is a peak: it replaces the estimate.
        let mut t = Ticket::new(m.clone(), false, m.feedback.clock.now());
        tokio::time::advance(Duration::from_millis(4)).await;
        t.finish(Completion::Success);
        assert_eq!(m.cost(m.feedback.clock.now(), default), 4e6);
        // Idle time decays it (10 s decay: e⁻¹ after 10 s).
        tokio::time::advance(Duration::from_secs(10)).await;
        let decayed = m.cost(m.feedback.clock.now(), default);
        assert!(
            (decayed - 4e6 / std::f64::consts::E).abs() < 1.0,
            "{decayed}"
        );
        // A faster sample is averaged in, weighted by the time since the last one.
        let mut t = Ticket::new(m.clone(), false, m.feedback.clock.now());
        tokio::time::advance(Duration::from_millis(1)).await;
        t.finish(Completion::Success);
        let after = m.cost(m.feedback.clock.now(), default);
        assert!(after > 1e6 && after < 4e6, "{after}");
    }

    #[tokio::test(start_paused = true)]
    async fn lighter_agrees_with_the_costs() {
        let default = 30e6;
        let mut rng = gray_core::rand::Rng::seeded(5);
        let meters: Vec<_> = (0..6).map(|_| meter(0).0).collect();
        for round in 0..200 {
            // Measure some, at various times, with various loads in flight.
            let m = &meters[rng.index(meters.len())];
            if round % 3 != 0 {
                let mut t = Ticket::new(m.clone(), false, m.feedback.clock.now());
                tokio::time::advance(Duration::from_micros(rng.below(5_000))).await;
                t.finish(Completion::Success);
            } else {
                // A request that never completes: its ticket stays counted in flight.
                #[allow(clippy::mem_forget)]
                std::mem::forget(Ticket::new(m.clone(), false, 0));
            }
            tokio::time::advance(Duration::from_millis(rng.below(3_000))).await;
            let now = m.feedback.clock.now();
            for a in &meters {
                for b in &meters {
                    let (ca, cb) = (a.cost(now, default), b.cost(now, default));
                    // Exact ties may round either way.
                    if (ca - cb).abs() > 1e-6 * ca.max(cb) {
                        assert_eq!(Meter::lighter(a, b, now, default), ca <= cb, "{ca} vs {cb}");
                    }
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_connection_errors_ask_for_one_ejection() {
        let (m, mut rx) = meter(2);
        let fail = |connection| {
            let mut t = Ticket::new(m.clone(), false, m.feedback.clock.now());
            let failure = if connection {
                Failure::Broken
            } else {
                Failure::Other
            };
            t.finish(Completion::Failed(failure));
        };
        fail(true);
        fail(false); // reachable: the count starts again
        fail(true);
        // Three requests completed: probing is over.
        assert_eq!(rx.try_recv(), Ok(Event::Measured(m.id)));
        assert!(rx.try_recv().is_err());
        fail(true);
        assert_eq!(rx.try_recv(), Ok(Event::Eject(m.id)));
        fail(true);
        assert!(rx.try_recv().is_err(), "asked once");
        assert_eq!(m.ejected(), 1);
        assert_eq!(m.ejected(), 2, "ejections in a row");
        Ticket::new(m.clone(), false, m.feedback.clock.now()).finish(Completion::Success);
        assert_eq!(m.ejected(), 1, "a success resets the streak");
        Ticket::new(m.clone(), false, m.feedback.clock.now()).finish(Completion::Unready);
        assert_eq!(rx.try_recv(), Ok(Event::Unready(m.id)));
    }

    #[tokio::test(start_paused = true)]
    async fn one_refusal_ejects_at_once() {
        let (m, mut rx) = meter(5);
        let refuse = || {
            let mut t = Ticket::new(m.clone(), false, m.feedback.clock.now());
            t.finish(Completion::Failed(Failure::Refused));
        };
        assert!(!m.doomed());
        refuse();
        assert!(m.doomed(), "picks avoid it before the driver ejects it");
        assert_eq!(rx.try_recv(), Ok(Event::Eject(m.id)));
        refuse();
        assert!(rx.try_recv().is_err(), "asked once");
        // Without ejection, a refusal ejects nothing.
        let (m, mut rx) = meter(0);
        Ticket::new(m.clone(), false, 0).finish(Completion::Failed(Failure::Refused));
        assert!(!m.doomed());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_dropped_ticket_releases_its_claims() {
        let (m, _rx) = meter(1);
        assert!(m.try_probe());
        let t = Ticket::new(m.clone(), true, m.feedback.clock.now());
        assert!(!m.try_probe());
        drop(t);
        assert_eq!(m.pending(), 0);
        assert!(m.try_probe(), "the probe slot is free again");
        assert!(m.is_probing(), "a dropped request completed nothing");
    }
}
