//! What the code under test logs, captured so that a test can wait for an event that only
//! a log line shows (a rejected file: nothing else changes, by design).
//!
//! [`capture`] installs one global `tracing` subscriber for the process (the gateway and
//! the registries log from their own tasks, on any runtime thread), at most once; every
//! caller shares its buffer, so a test looks for lines that name something of its own (its
//! temporary directory).

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

/// The captured log, shared by every test of the process.
#[derive(Debug, Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything logged so far.
    #[must_use]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Waits (at most `within`) until a line contains every one of `words`; returns it.
    pub async fn line(&self, words: &[&str], within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(line) = self
                .text()
                .lines()
                .find(|line| words.iter().all(|w| line.contains(w)))
            {
                return line.to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no line with {words:?} logged within {within:?}; the log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The process's log (INFO and above), captured from the first call on.
pub fn capture() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the test process");
        logs
    })
    .clone()
}
