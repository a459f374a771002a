//! The idle HTTP/1 connections of one instance ([`Pool`]), and the connects that serve
//! requests finding none (`super::connecting`).
//!
//! A request takes the most recently released connection. Idle connections expire by age,
//! oldest first: whenever a request takes a connection or one is released, those idle for
//! longer than `idle_timeout` are closed, from the oldest, so a busy instance's pool holds
//! no socket that went unused for longer than that. An idle connection that the instance
//! closed is dropped when a request would take it. Nothing reaps the idle list in the
//! background: the pool of an instance that gets no more requests keeps its connections
//! until the endpoint is dropped with its instance (or the instance closes them). Every
//! pool of one `HttpEndpoints` also shares one budget of idle connections
//! (`with_max_idle_total`): a connection released when the budget is spent is closed,
//! so the sockets kept idle stay within what the process's descriptor limit allows.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, atomic::Ordering},
    task::Context,
    time::Instant,
};

use http_body::Body;
use hyper::rt::{Read, Write};
use tower::BoxError;

use super::{
    body::Lease,
    connecting::{Connects, Home},
    h1::Conn,
    settings::Settings,
};

/// The idle connections of one instance.
pub(crate) struct Pool<IO: Read + Write + Unpin, B: Body + 'static> {
    /// Oldest first.
    idle: Mutex<VecDeque<Box<Conn<IO, B>>>>,
    /// Requests waiting for a connection, and the connects that serve them.
    pub(super) connects: Connects<Box<Conn<IO, B>>>,
    pub(crate) settings: Arc<Settings>,
}

// === impl Pool ===

impl<IO: Read + Write + Unpin, B: Body + 'static> Pool<IO, B> {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        Pool {
            idle: Mutex::new(VecDeque::new()),
            connects: Connects::new(settings.max_connects),
            settings,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Box<Conn<IO, B>>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the connections idle for longer than the idle timeout off the front of
    /// `idle` (the oldest), to be dropped once the lock is released.
    fn expired(
        &self,
        idle: &mut VecDeque<Box<Conn<IO, B>>>,
        now: Instant,
    ) -> Vec<Box<Conn<IO, B>>> {
        let timeout = self.settings.idle_timeout;
        let is_fresh = |c: &Conn<IO, B>| now.saturating_duration_since(c.idle_since) <= timeout;
        // The oldest is fresh (busy traffic): nothing to take.
        if idle.front().is_none_or(|c| is_fresh(c)) {
            return Vec::new();
        }
        let fresh = idle.iter().position(|c| is_fresh(c)).unwrap_or(idle.len());
        idle.drain(..fresh).collect()
    }

    /// The most recently released connection that is still fresh at `now` (on tokio's
    /// clock, as [`now`]), if any; the expired ones are closed on the way (outside the
    /// lock).
    pub(super) fn take(&self, now: Instant) -> Option<Box<Conn<IO, B>>> {
        let mut idle = self.lock();
        let expired = self.expired(&mut idle, now);
        let conn = idle.pop_back().map(|mut conn| {
            conn.idle_for = now.saturating_duration_since(conn.idle_since);
            conn
        });
        drop(idle);
        let left = expired.len() + usize::from(conn.is_some());
        self.settings.idle_total.give_back(left);
        drop(expired);
        conn
    }

    pub(crate) fn put(self: &Arc<Self>, mut conn: Box<Conn<IO, B>>)
    where
        IO: Send + 'static,
        B: Send,
        B::Data: Send,
    {
        // A connection still sending its request body (the instance answered early) is
        // closed here: idle, nobody would poll it to send the rest.
        if conn.ended || conn.sender.is_closed() || !conn.body_released.load(Ordering::Acquire) {
            return;
        }
        conn.pool = None;
        // Requests waiting for a connection come first.
        let Some(mut conn) = self.connects.offer(conn, self) else {
            return;
        };
        let now = now();
        conn.idle_since = now;
        let mut idle = self.lock();
        let expired = self.expired(&mut idle, now);
        let budget = &self.settings.idle_total;
        budget.give_back(expired.len());
        if idle.len() < self.settings.max_idle && budget.take_one() {
            idle.push_back(conn);
        }
        drop(idle);
        drop(expired);
    }
}

/// The pool's clock: tokio's (paused time works in tests), as the deadline of the
/// request that takes a connection, whose clock read the take shares.
pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl<IO: Read + Write + Unpin, B: Body + 'static> Drop for Pool<IO, B> {
    /// The pool goes with its instance: its idle connections leave the budget.
    fn drop(&mut self) {
        let idle = self.lock().len();
        self.settings.idle_total.give_back(idle);
    }
}

impl<IO, B> Home<Box<Conn<IO, B>>> for Pool<IO, B>
where
    IO: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
{
    fn home(self: Arc<Self>, conn: Box<Conn<IO, B>>) {
        self.put(conn);
    }
}

impl<IO, B> Lease for Conn<IO, B>
where
    IO: Read + Write + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    fn drive(&mut self, cx: &mut Context<'_>) {
        Conn::drive(self, cx);
    }

    fn release(mut self: Box<Self>) {
        if let Some(pool) = self.pool.take() {
            pool.put(self);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{Arc, atomic::Ordering},
        time::{Duration, Instant},
    };

    use http_body_util::Empty;
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;

    use super::Pool;
    use crate::http::{h1::Conn, settings::Settings, transport::UpstreamIo};

    type TestPool = Pool<TokioIo<DuplexStream>, Empty<bytes::Bytes>>;
    type TestConn = Box<Conn<TokioIo<DuplexStream>, Empty<bytes::Bytes>>>;

    /// A pool with `max_idle` and `idle_timeout`.
    fn pool(max_idle: usize, idle_timeout: Duration) -> Arc<TestPool> {
        let settings = Settings {
            max_idle,
            idle_timeout,
            ..Settings::default()
        };
        Arc::new(Pool::new(Arc::new(settings)))
    }

    /// An open HTTP/1 connection over an in-memory pipe (the far end kept alive in the
    /// returned stream), as the pool holds them.
    async fn conn(pool: &TestPool) -> (TestConn, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let conn = Conn::handshake(UpstreamIo::Plain(TokioIo::new(ours)), &pool.settings)
            .await
            .expect("a handshake sends nothing");
        (conn, theirs)
    }

    fn id(conn: &TestConn) -> *const () {
        std::ptr::from_ref(&**conn).cast()
    }

    #[tokio::test]
    async fn a_request_takes_the_most_recently_released_connection() {
        let pool = pool(8, Duration::from_secs(90));
        let (a, _a) = conn(&pool).await;
        let (b, _b) = conn(&pool).await;
        let (a_id, b_id) = (id(&a), id(&b));
        pool.put(a);
        pool.put(b);
        assert_eq!(pool.take(super::now()).map(|c| id(&c)), Some(b_id));
        assert_eq!(pool.take(super::now()).map(|c| id(&c)), Some(a_id));
        assert!(pool.take(super::now()).is_none());
    }

    #[tokio::test]
    async fn idle_connections_past_the_idle_timeout_are_closed_oldest_first() {
        let pool = pool(8, Duration::from_secs(90));
        let (old, _old) = conn(&pool).await;
        let (fresh, _fresh) = conn(&pool).await;
        let fresh_id = id(&fresh);
        pool.put(old);
        pool.put(fresh);
        // The older one idled past the timeout: closed as soon as a request takes the
        // fresh one, though the fresh one is taken first (oldest first, by age).
        pool.lock()[0].idle_since = Instant::now() - Duration::from_secs(91);
        assert_eq!(pool.take(super::now()).map(|c| id(&c)), Some(fresh_id));
        assert!(
            pool.lock().is_empty(),
            "the expired connection is still held"
        );
        assert!(
            pool.take(super::now()).is_none(),
            "the expired connection was reused"
        );
    }

    #[tokio::test]
    async fn at_most_max_idle_connections_are_kept() {
        let pool = pool(2, Duration::from_secs(90));
        let mut far_ends = Vec::new();
        for _ in 0..3 {
            let (c, far) = conn(&pool).await;
            far_ends.push(far);
            pool.put(c);
        }
        assert_eq!(pool.lock().len(), 2);
    }

    #[tokio::test]
    async fn every_pool_of_the_endpoints_shares_one_budget_of_idle_connections() {
        let settings = Arc::new(Settings {
            idle_total: Arc::new(crate::http::settings::IdleBudget::new(3)),
            ..Settings::default()
        });
        let (a, b) = (
            Arc::new(TestPool::new(settings.clone())),
            Arc::new(TestPool::new(settings.clone())),
        );
        let mut far_ends = Vec::new();
        for pool in [&a, &b, &a, &b] {
            let (c, far) = conn(pool).await;
            far_ends.push(far);
            pool.put(c);
        }
        // the fourth released connection found the budget spent: closed
        assert_eq!((a.lock().len(), b.lock().len()), (2, 1));
        assert_eq!(settings.idle_total.idle(), 3);
        let taken = b.take(super::now()).expect("b's idle connection");
        assert_eq!(settings.idle_total.idle(), 2);
        drop(taken);
        drop(a);
        assert_eq!(
            settings.idle_total.idle(),
            0,
            "a's pool went with its idle ones"
        );
        let (c, _far) = conn(&b).await;
        b.put(c);
        assert_eq!(settings.idle_total.idle(), 1);
    }

    #[tokio::test]
    async fn a_connection_still_holding_its_request_body_is_not_kept() {
        let pool = pool(8, Duration::from_secs(90));
        let (c, _far) = conn(&pool).await;
        // The instance answered before the body was sent whole: nobody would send the rest.
        c.body_released.store(false, Ordering::Release);
        pool.put(c);
        assert!(pool.take(super::now()).is_none());
    }
}
