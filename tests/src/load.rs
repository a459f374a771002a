//! A load generator for the fault tests: requests at a steady rate, each in a task of its
//! own (a slow answer does not slow the pace), every outcome kept.

use std::{
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use gray_test_support::WAIT;
use tokio::{task::JoinSet, time::MissedTickBehavior};

/// Requests under way; [`Load::stop`] returns their outcomes.
#[derive(Debug)]
pub struct Load<O> {
    outcomes: Arc<Mutex<Vec<(usize, O)>>>,
    sent: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    generator: tokio::task::JoinHandle<()>,
}

impl<O: Send + 'static> Load<O> {
    /// Sends `send(i)` for i = 0, 1, … at `per_second` requests per second.
    pub fn start<F, Fut>(per_second: u32, send: F) -> Load<O>
    where
        F: Fn(usize) -> Fut + Send + 'static,
        Fut: Future<Output = O> + Send + 'static,
    {
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let generator = {
            let (outcomes, sent, stop) = (outcomes.clone(), sent.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let mut requests = JoinSet::new();
                for i in 0.. {
                    tick.tick().await;
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let request = send(i);
                    let outcomes = outcomes.clone();
                    sent.store(i + 1, Ordering::SeqCst);
                    requests.spawn(async move {
                        let outcome = request.await;
                        lock(&outcomes).push((i, outcome));
                    });
                    // Reap the finished ones as we go.
                    while requests.try_join_next().is_some() {}
                }
                while requests.join_next().await.is_some() {}
            })
        };
        Load {
            outcomes,
            sent,
            stop,
            generator,
        }
    }

    /// Requests sent so far.
    #[must_use]
    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// Requests answered (or failed) so far.
    #[must_use]
    pub fn completed(&self) -> usize {
        lock(&self.outcomes).len()
    }

    /// Waits until `n` requests have completed; fails the test, naming `what`, after
    /// [`WAIT`].
    pub async fn until_completed(&self, n: usize, what: &str) {
        crate::until(WAIT, what, || self.completed() >= n).await;
    }

    /// Waits until an outcome of a request sent after `after` satisfies `check`.
    pub async fn until_seen(&self, after: usize, what: &str, mut check: impl FnMut(&O) -> bool) {
        crate::until(WAIT, what, || {
            lock(&self.outcomes)
                .iter()
                .any(|(i, o)| *i >= after && check(o))
        })
        .await;
    }

    /// Stops sending, waits for the requests under way, and returns every outcome in the
    /// order they were sent.
    pub async fn stop(self) -> Vec<O> {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(WAIT, self.generator)
            .await
            .expect("the requests under way end")
            .expect("the load generator");
        let mut outcomes = std::mem::take(&mut *lock(&self.outcomes));
        outcomes.sort_by_key(|(i, _)| *i);
        outcomes.into_iter().map(|(_, o)| o).collect()
    }
}

/// The fault scenario of the retry tests, on a load already running: kills `gray`, then
/// `base`, each after 300 more requests completed, restarts both, waits until each serves
/// again (`served_by` names the instance an outcome came from), and stops after at least
/// 2,000 requests. Returns every outcome.
pub async fn kill_and_restart<O: Send + 'static>(
    load: Load<O>,
    gray: &mut crate::process::Instance,
    base: &mut crate::process::Instance,
    served_by: impl Fn(&O) -> Option<&str>,
) -> Vec<O> {
    load.until_completed(300, "warm up").await;
    gray.kill().await;
    let killed = load.sent();
    load.until_completed(killed + 300, "after the gray instance died")
        .await;
    base.kill().await;
    let killed = load.sent();
    load.until_completed(killed + 300, "after a baseline instance died")
        .await;
    gray.restart().await;
    base.restart().await;
    // The probes let them back in.
    let restarted = load.sent();
    for instance in [&*gray, &*base] {
        let name = instance.name();
        load.until_seen(restarted, &format!("{name} back"), |o| {
            served_by(o) == Some(name)
        })
        .await;
    }
    let target = load.sent().max(2_000);
    load.until_completed(target, "the rest of the run").await;
    load.stop().await
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
