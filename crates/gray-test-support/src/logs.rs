//! What the code under test logs, captured so that a test can wait for an event that only
//! a log line shows (a rejected file: nothing else changes, by design).
//!
//! Two ways to capture:
//! - [`capture`]: this thread, while the guard lives (use a current-thread runtime, so
//!   that the tasks under test run on this thread and log under this subscriber);
//! - [`capture_process`]: the whole process from the first call on (the gateway and the
//!   registries log from their own tasks, on any runtime thread); every caller shares one
//!   buffer, so a test looks for lines that name something of its own.

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock, PoisonError},
    time::Duration,
};

use crate::WAIT;

/// A captured log.
#[derive(Debug, Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything logged so far.
    #[must_use]
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Waits (at most [`WAIT`]) until a line contains `what`; returns that line.
    pub async fn line(&self, what: &str) -> String {
        self.line_with(&[what], WAIT).await
    }

    /// Waits (at most `within`) until a line contains every one of `words`; returns it.
    pub async fn line_with(&self, words: &[&str], within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let text = self.text();
            if let Some(line) = text
                .lines()
                .find(|line| words.iter().all(|w| line.contains(w)))
            {
                return line.to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no line with {words:?} logged within {within:?}; the log:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures what `tracing` logs on this thread (every level) until the guard is dropped.
#[must_use]
pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let guard = tracing::subscriber::set_default(logs.subscriber(tracing::Level::TRACE));
    (logs, guard)
}

/// The process's log (INFO and above), captured from the first call on.
///
/// # Panics
///
/// If another global subscriber was installed first.
pub fn capture_process() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        tracing::subscriber::set_global_default(logs.subscriber(tracing::Level::INFO))
            .expect("no other global subscriber in the test process");
        logs
    })
    .clone()
}
