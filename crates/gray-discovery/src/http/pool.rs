//! The idle HTTP/1 connections of one instance ([`Pool`]), and the connects that serve
//! requests finding none (`super::connecting`).
//!
//! A request takes the most recently released connection. An idle connection that is
//! older than `idle_timeout`, or that the instance closed, is dropped when a request would
//! take it: nothing reaps the idle list in the background, so an idle connection stays
//! open (its socket held) until a request finds it expired, or until the endpoint is
//! dropped with its instance.

use std::{
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
    idle: Mutex<Vec<Box<Conn<IO, B>>>>,
    /// Requests waiting for a connection, and the connects that serve them.
    pub(super) connects: Connects<Box<Conn<IO, B>>>,
    pub(crate) settings: Arc<Settings>,
}

// === impl Pool ===

impl<IO: Read + Write + Unpin, B: Body + 'static> Pool<IO, B> {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        Pool {
            idle: Mutex::new(Vec::new()),
            connects: Connects::new(settings.max_connects),
            settings,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Box<Conn<IO, B>>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently released connection that is still fresh, if any. The lock is held
    /// for a pop; older connections than the idle timeout are dropped on the way.
    pub(super) fn take(&self) -> Option<Box<Conn<IO, B>>> {
        let now = Instant::now();
        loop {
            let conn = self.lock().pop()?;
            if now.saturating_duration_since(conn.idle_since) <= self.settings.idle_timeout {
                return Some(conn);
            }
        }
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
        conn.idle_since = Instant::now();
        let mut idle = self.lock();
        if idle.len() < self.settings.max_idle {
            idle.push(conn);
        }
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
