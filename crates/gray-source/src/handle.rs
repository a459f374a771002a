//! The background task that follows a source.

use tokio::task::JoinHandle;

use crate::{Status, StatusHandle};

/// A running watch: the task that follows a source, and the source's [`Status`]. Dropping
/// it (or calling [`WatchHandle::stop`]) stops the task.
#[derive(Debug)]
pub struct WatchHandle {
    task: JoinHandle<()>,
    status: StatusHandle,
}

impl WatchHandle {
    /// Takes ownership of the task that follows a source, without a status (it stays
    /// empty).
    #[must_use]
    pub fn new(task: JoinHandle<()>) -> Self {
        WatchHandle::with_status(task, StatusHandle::new())
    }

    /// Takes ownership of the task that follows a source, and of the status it reports to
    /// (usually [`Updates::status_handle`](crate::Updates::status_handle)).
    #[must_use]
    pub fn with_status(task: JoinHandle<()>, status: StatusHandle) -> Self {
        WatchHandle { task, status }
    }

    /// How fresh the followed source is now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// A handle that reads the source's status from elsewhere (a metrics endpoint).
    #[must_use]
    pub fn status_handle(&self) -> StatusHandle {
        self.status.clone()
    }

    /// Stops watching.
    pub fn stop(self) {}

    /// Whether the task has ended (it only ends when stopped, or when its runtime does).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
