//! The connects of one instance: capped, finished in the background, handed out in order.
//!
//! A request that finds no idle connection joins the instance's queue of waiters. At most
//! `max` connects run at once, each on a task of its own that goes on connecting while
//! waiters are left that no other connect will serve. Each connection a connect produces,
//! like each connection released while requests wait, goes to the longest-waiting request
//! still there; with nobody waiting, it goes to the idle list. So:
//!
//! - a request dropped while it waits (its client reset the stream) only leaves its place:
//!   the connect finishes (bounded by the connect timeout), and its connection waits idle
//!   for the next request instead of being closed half-open;
//! - a connection handed to a request that is dropped before it used it goes back too;
//! - a burst of requests, or a client that opens and resets streams, opens at most `max`
//!   connections to the instance at a time, however many requests wait.
//!
//! A connect that fails fails the longest-waiting request (which may go elsewhere: nothing
//! was sent); the others keep waiting, and a connect is started again for them.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::sync::oneshot;
use tower::BoxError;

/// Where a connection nobody used goes back: to the next waiter, or the idle list.
pub(crate) trait Home<T> {
    fn home(self: Arc<Self>, conn: T);
}

/// A connection handed to a waiting request; dropped unused, it goes back [`Home`].
pub(crate) struct Handoff<T> {
    conn: Option<T>,
    home: Arc<dyn Home<T> + Send + Sync>,
}

// === impl Handoff ===

impl<T> Handoff<T> {
    /// The connection, for the request to use: it no longer goes back by itself.
    pub(crate) fn take(mut self) -> Option<T> {
        self.conn.take()
    }
}

impl<T> Drop for Handoff<T> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.home.clone().home(conn);
        }
    }
}

/// What a waiting request receives: a connection, or why a connect for it failed.
pub(crate) type Handed<T> = Result<Handoff<T>, BoxError>;

/// A request's place in the queue.
pub(crate) struct Waiter<T> {
    /// Resolves with the request's connection, or the error of a connect.
    pub(crate) handed: oneshot::Receiver<Handed<T>>,
    /// Whether the request must start a connect task (fewer than `max` run).
    pub(crate) start: bool,
}

/// The waiters and running connects of one instance.
pub(crate) struct Connects<T> {
    max: usize,
    /// Waiters in the queue (some may have given up): lets a released connection skip the
    /// lock when nobody waits, the common case.
    waiting: AtomicUsize,
    state: Mutex<Queue<T>>,
}

/// The connects running, and the requests waiting for a connection.
struct Queue<T> {
    /// Connect tasks running.
    running: usize,
    queue: VecDeque<oneshot::Sender<Handed<T>>>,
}

// === impl Connects ===

impl<T> Connects<T> {
    /// At most `max` (at least one) connects at once.
    pub(crate) fn new(max: usize) -> Self {
        Connects {
            max: max.max(1),
            waiting: AtomicUsize::new(0),
            state: Mutex::new(Queue {
                running: 0,
                queue: VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the queue. When [`Waiter::start`] is set, the caller spawns a connect task
    /// that reports each result to [`Connects::finished`].
    pub(crate) fn wait(&self) -> Waiter<T> {
        let (tx, handed) = oneshot::channel();
        let mut state = self.lock();
        // Requests that gave up at the front leave now; the rest when a connect ends.
        while state.queue.front().is_some_and(|tx| tx.is_closed()) {
            state.queue.pop_front();
        }
        state.queue.push_back(tx);
        self.waiting.store(state.queue.len(), Ordering::Release);
        let start = state.running < self.max;
        if start {
            state.running += 1;
        }
        Waiter { handed, start }
    }

    /// Hands `conn` to the longest-waiting request still waiting; gives it back when there
    /// is none.
    pub(crate) fn offer<H: Home<T> + Send + Sync + 'static>(
        &self,
        conn: T,
        home: &Arc<H>,
    ) -> Option<T> {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return Some(conn);
        }
        let home: Arc<dyn Home<T> + Send + Sync> = home.clone();
        let mut conn = conn;
        let mut state = self.lock();
        while let Some(tx) = state.queue.pop_front() {
            let handoff = Handoff {
                conn: Some(conn),
                home: home.clone(),
            };
            match tx.send(Ok(handoff)) {
                Ok(()) => {
                    self.waiting.store(state.queue.len(), Ordering::Release);
                    return None;
                }
                // That request gave up: the next one.
                // An unsent handoff gives its connection back (never empty: it was
                // just filled; were it, there would be nothing left to place).
                Err(returned) => match returned.ok().and_then(Handoff::take) {
                    Some(back) => conn = back,
                    None => {
                        self.waiting.store(state.queue.len(), Ordering::Release);
                        return None;
                    }
                },
            }
        }
        self.waiting.store(0, Ordering::Release);
        Some(conn)
    }

    /// A connect task's connect ended with `result`: its connection goes `home` (to a
    /// waiter or the idle list), its error to the longest-waiting request. Returns whether
    /// the task connects again: while more requests wait than other connects run.
    pub(crate) fn finished<H: Home<T> + Send + Sync + 'static>(
        &self,
        result: Result<T, BoxError>,
        home: &Arc<H>,
    ) -> bool {
        match result {
            Ok(conn) => home.clone().home(conn),
            Err(e) => {
                let mut state = self.lock();
                let mut e = Err(e);
                while let Some(tx) = state.queue.pop_front() {
                    match tx.send(e) {
                        Ok(()) => break,
                        Err(back) => e = back,
                    }
                }
                self.waiting.store(state.queue.len(), Ordering::Release);
            }
        }
        let mut state = self.lock();
        state.queue.retain(|tx| !tx.is_closed());
        self.waiting.store(state.queue.len(), Ordering::Release);
        if state.queue.len() >= state.running {
            true
        } else {
            state.running -= 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home that counts what came back.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Home<u32> for Counted {
        fn home(self: Arc<Self>, _: u32) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn at_most_max_connects_start() {
        let connects = Connects::<u32>::new(2);
        let starts: Vec<bool> = (0..5).map(|_| connects.wait().start).collect();
        assert_eq!(starts, [true, true, false, false, false]);
    }

    #[tokio::test]
    async fn connections_go_to_waiters_in_order_and_skip_those_gone() {
        let home = Arc::new(Counted::default());
        let connects = Connects::<u32>::new(1);
        let first = connects.wait();
        let second = connects.wait();
        let third = connects.wait();
        drop(first);
        assert!(connects.offer(7, &home).is_none());
        let handed = second
            .handed
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(Handoff::take);
        assert_eq!(handed, Some(7));
        // The third waits for the connect still needed: the task goes on.
        assert!(connects.finished(Ok(8), &home), "third still waits");
        assert_eq!(
            home.0.load(Ordering::Relaxed),
            1,
            "home() hands on or parks"
        );
        drop(third);
        assert!(!connects.finished(Ok(9), &home), "nobody waits");
        assert_eq!(connects.offer(10, &home), Some(10));
    }

    #[tokio::test]
    async fn a_handoff_dropped_unused_goes_home() {
        let home = Arc::new(Counted::default());
        let connects = Connects::<u32>::new(1);
        let waiter = connects.wait();
        assert!(connects.offer(7, &home).is_none());
        // The request was dropped after the connection was handed to it.
        drop(waiter);
        assert_eq!(home.0.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_failed_connect_fails_one_waiter_and_the_task_goes_on() {
        let home = Arc::new(Counted::default());
        let connects = Connects::<u32>::new(1);
        let first = connects.wait();
        let second = connects.wait();
        assert!(connects.finished(Err("refused".into()), &home));
        let failed = first.handed.await.ok().and_then(Result::err);
        assert_eq!(failed.map(|e| e.to_string()).as_deref(), Some("refused"));
        assert!(connects.offer(7, &home).is_none());
        assert!(second.handed.await.is_ok_and(|h| h.is_ok()));
    }
}
