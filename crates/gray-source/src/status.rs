//! How fresh a watch is.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// How fresh a watch is: what an operator alerts on ("discovery stale for more than N
/// seconds").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The last time the source answered (a file read, any etcd response or progress
    /// notification); `None` before the first.
    pub last_contact: Option<Instant>,
    /// The last revision applied (etcd store revision; for a file, none).
    pub revision: Option<i64>,
    /// The etcd cluster ID the watch talks to, once known.
    pub cluster_id: Option<u64>,
    /// Whether the source is reachable and followed now.
    pub connected: bool,
    /// Failures since the start.
    pub failures: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

impl Status {
    /// The time since the last contact, or `None` before the first.
    pub fn since_last_contact(&self) -> Option<Duration> {
        self.last_contact.map(|at| at.elapsed())
    }
}

/// A shared, cheap-to-clone view of a watch's [`Status`], updated by the watch.
#[derive(Clone, Default)]
pub struct StatusHandle {
    inner: Arc<Mutex<Status>>,
}

impl fmt::Debug for StatusHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

impl StatusHandle {
    /// A handle with an empty status.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Status> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The status now.
    pub fn get(&self) -> Status {
        self.lock().clone()
    }

    /// Records a successful contact (and the revision it brought, if any).
    pub fn contact(&self, revision: Option<i64>) {
        let mut s = self.lock();
        s.last_contact = Some(Instant::now());
        s.connected = true;
        if revision.is_some() {
            s.revision = revision;
        }
    }

    /// Records the cluster ID the watch talks to.
    pub fn cluster(&self, cluster_id: u64) {
        self.lock().cluster_id = Some(cluster_id);
    }

    /// Records a failure.
    pub fn failure(&self, error: &dyn fmt::Display) {
        let mut s = self.lock();
        s.connected = false;
        s.failures += 1;
        s.last_error = Some(error.to_string());
    }

    /// Edits the status in place (for implementations of [`Source`](crate::Source)).
    pub fn update(&self, edit: impl FnOnce(&mut Status)) {
        edit(&mut self.lock());
    }
}
