//! The background task that follows a source.

use tokio::task::JoinHandle;

/// A running watch: the task that follows a source. Dropping it (or calling
/// [`WatchHandle::stop`]) stops the task.
#[derive(Debug)]
pub struct WatchHandle {
    task: JoinHandle<()>,
}

impl WatchHandle {
    /// Takes ownership of the task that follows a source.
    pub fn new(task: JoinHandle<()>) -> Self {
        WatchHandle { task }
    }

    /// Stops watching.
    pub fn stop(self) {}

    /// Whether the task has ended (it only ends when stopped, or when its runtime does).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}
