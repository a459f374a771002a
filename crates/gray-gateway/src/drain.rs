//! Graceful shutdown of the proxy's connections: on [`Drain::shutdown`], every watched
//! connection is asked to finish (hyper's `graceful_shutdown`: in-flight requests complete,
//! idle keep-alive connections close), and `shutdown` returns once all have.
//!
//! hyper-util's `GracefulShutdown` does the same but polls a `Notify` each time the
//! connection is polled, which takes the notifier's lock once or twice per request. Here a
//! connection registers with the notifier once and then checks an atomic flag per poll.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll, Waker},
};

use hyper_util::server::graceful::GracefulConnection;

use crate::limits::Cancels;
use tokio::sync::{Notify, futures::OwnedNotified};

/// What a drain and its members share: whether it is closing, and how many connections
/// are still open.
#[derive(Debug, Default)]
struct Roster {
    closing: AtomicBool,
    /// Wakes the connections when `closing` is set.
    close: Arc<Notify>,
    /// Connections still open.
    open: AtomicUsize,
    /// Wakes `shutdown` when the last connection ends.
    idle: Notify,
}

/// The set of connections a shutdown waits for (its clones are the same set).
#[derive(Debug, Default, Clone)]
pub(crate) struct Drain {
    shared: Arc<Roster>,
}

impl Drain {
    /// A drain with no connection.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Joins the set: the drain's shutdown waits until the returned member is dropped.
    pub(crate) fn join(&self) -> Member {
        self.shared.open.fetch_add(1, Ordering::AcqRel);
        Member {
            notified: Box::pin(self.shared.close.clone().notified_owned()),
            shared: self.shared.clone(),
            registered: None,
        }
    }

    /// Asks every watched connection to finish and waits until all have.
    pub(crate) async fn shutdown(self) {
        self.shared.closing.store(true, Ordering::Release);
        self.shared.close.notify_waiters();
        loop {
            let idle = self.shared.idle.notified();
            if self.shared.open.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

// === Member ===

/// One connection of a [`Drain`]: counted until dropped, and told when the drain shuts
/// down.
pub(crate) struct Member {
    shared: Arc<Roster>,
    notified: Pin<Box<OwnedNotified>>,
    /// The waker the notification is registered with.
    registered: Option<Waker>,
}

impl Member {
    /// Whether the drain is shutting down; if not, `cx` is woken when it starts to (and,
    /// when `cancels` is given, when the connection's client cancels most of its streams).
    /// Registers again only when the task's waker changed: a spawned connection keeps
    /// one task, so this happens once.
    pub(crate) fn poll_closing(&mut self, cx: &mut Context<'_>, cancels: Option<&Cancels>) -> bool {
        let fresh = self
            .registered
            .as_ref()
            .is_none_or(|w| !w.will_wake(cx.waker()));
        if fresh {
            let _ = self.notified.as_mut().poll(cx);
            self.registered = Some(cx.waker().clone());
            if let Some(cancels) = cancels {
                cancels.register(cx.waker());
            }
        }
        self.shared.closing.load(Ordering::Acquire)
    }

    /// Watches `conn` as this member.
    pub(crate) fn watch<C: GracefulConnection>(self, conn: C) -> Draining<C> {
        Draining {
            conn: Box::pin(conn),
            member: self,
            shutting_down: false,
            cancels: None,
        }
    }
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").finish_non_exhaustive()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.shared.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.idle.notify_waiters();
        }
    }
}

// === Draining ===

/// A connection that shuts down gracefully when its drain closes; see [`Member::watch`].
pub(crate) struct Draining<C> {
    conn: Pin<Box<C>>,
    member: Member,
    shutting_down: bool,
    /// The connection's own reason to shut down: its client cancels most of its streams.
    cancels: Option<Arc<Cancels>>,
}

impl<C> Draining<C> {
    /// Shuts the connection down as well when `cancels` says so.
    pub(crate) fn with_cancels(mut self, cancels: Arc<Cancels>) -> Self {
        self.cancels = Some(cancels);
        self
    }
}

impl<C> std::fmt::Debug for Draining<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Draining")
            .field("shutting_down", &self.shutting_down)
            .finish_non_exhaustive()
    }
}

impl<C: GracefulConnection> Future for Draining<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        if !this.shutting_down
            && (this.member.poll_closing(cx, this.cancels.as_deref())
                || this.cancels.as_ref().is_some_and(|c| c.goaway()))
        {
            this.shutting_down = true;
            this.conn.as_mut().graceful_shutdown();
        }
        this.conn.as_mut().poll(cx)
    }
}
