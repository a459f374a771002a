//! How fresh a watch is.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;

/// How fresh a watch is: what an operator alerts on ("discovery stale for more than N
/// seconds", "etcd unreachable", "talking to another cluster than yesterday").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The last time the source answered: a file read, or any etcd response (a listing, a
    /// watch event, an answer to a progress request, which a watch asks for while idle).
    /// `None` before the first.
    pub last_contact: Option<Instant>,
    /// The revision of the last update handed out: the etcd store revision of a listing
    /// or the `mod_revision` of a change. Every change up to it has been handed out. `None`
    /// for a file, and for etcd before the first listing.
    pub revision: Option<i64>,
    /// The etcd cluster ID the watch talks to, once known (from the response headers).
    pub cluster_id: Option<u64>,
    /// The endpoint the watch talks to now (etcd), once connected.
    pub endpoint: Option<String>,
    /// Whether the source is reachable and followed now: false from a failure until the
    /// next success.
    pub connected: bool,
    /// Failures since the start (every failed attempt counts).
    pub failures: u64,
    /// How many times the watch found that what it had handed out could not be trusted
    /// any more (etcd: a changed cluster, a cluster that lost its data) and listed again.
    pub resets: u64,
    /// The last failure, if any (kept after recovery; see `connected`).
    pub last_error: Option<String>,
}

impl Status {
    /// The time since the last contact, or `None` before the first.
    #[must_use]
    pub fn since_last_contact(&self) -> Option<Duration> {
        self.last_contact.map(|at| at.elapsed())
    }
}

/// A shared, cheap-to-clone view of a watch's [`Status`], updated by the watch.
#[derive(Clone)]
pub struct StatusHandle {
    inner: Arc<watch::Sender<Status>>,
}

impl Default for StatusHandle {
    fn default() -> Self {
        StatusHandle::new()
    }
}

impl fmt::Debug for StatusHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

impl StatusHandle {
    /// A handle with an empty status.
    #[must_use]
    pub fn new() -> Self {
        StatusHandle {
            inner: Arc::new(watch::Sender::new(Status::default())),
        }
    }

    /// The status now.
    #[must_use]
    pub fn get(&self) -> Status {
        self.inner.borrow().clone()
    }

    /// A receiver woken when anything but [`Status::last_contact`] changes (contacts are
    /// frequent; read them when woken, or when needed).
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.inner.subscribe()
    }

    /// Records a successful contact (and the revision handed out with it, if any).
    pub fn contact(&self, revision: Option<i64>) {
        self.edit(|s| {
            s.last_contact = Some(Instant::now());
            s.connected = true;
            if revision.is_some() {
                s.revision = revision;
            }
        });
    }

    /// Records the cluster ID the watch talks to.
    pub fn cluster(&self, cluster_id: u64) {
        self.edit(|s| s.cluster_id = Some(cluster_id));
    }

    /// Records a failure.
    pub fn failure(&self, error: &dyn fmt::Display) {
        let message = error.to_string();
        self.edit(|s| {
            s.connected = false;
            s.failures += 1;
            s.last_error = Some(message);
        });
    }

    /// Edits the status in place (for implementations of [`Source`](crate::Source)).
    pub fn update(&self, edit: impl FnOnce(&mut Status)) {
        self.edit(edit);
    }

    fn edit(&self, edit: impl FnOnce(&mut Status)) {
        self.inner.send_if_modified(|s| {
            let before = Status {
                last_contact: s.last_contact,
                ..s.clone()
            };
            edit(s);
            // Woken for anything but a new contact time.
            *s != Status {
                last_contact: s.last_contact,
                ..before
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_are_woken_by_changes_but_not_by_contacts() {
        let handle = StatusHandle::new();
        let mut rx = handle.subscribe();
        handle.contact(None);
        assert!(rx.has_changed().unwrap(), "connected changed");
        rx.borrow_and_update();
        handle.contact(None);
        assert!(!rx.has_changed().unwrap(), "a contact alone wakes nobody");
        assert!(rx.borrow().last_contact.is_some());
        handle.failure(&"boom");
        assert!(rx.has_changed().unwrap());
        let s = rx.borrow_and_update().clone();
        assert_eq!((s.connected, s.failures), (false, 1));
        assert_eq!(s.last_error.as_deref(), Some("boom"));
        handle.contact(Some(7));
        assert_eq!(rx.borrow_and_update().revision, Some(7));
    }
}
