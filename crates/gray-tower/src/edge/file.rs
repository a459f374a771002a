//! A rule file, watched by polling.
//!
//! [`FileSource::watch`] reads the file every 250 ms (configurable) and compares its bytes
//! with the last version seen; a changed file is parsed and put in force, or rejected (the
//! previous rules stay). A missing or unreadable file is reported once per failure and
//! changes nothing. No platform file watcher is used, so it works the same on every
//! filesystem, including bind mounts and Kubernetes ConfigMaps. Write the file atomically
//! (write a temporary file, then rename) so a half-written file is never seen; if one is,
//! it is rejected and the complete file is picked up at the next poll.
//!
//! ```
//! use gray_tower::edge::FileSource;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("gray-doc-{}.json", std::process::id()));
//! std::fs::write(&path, r#"{"rules":[{"name":"all","lane":"gray"}]}"#)?;
//!
//! let source = FileSource::new(&path);
//! let live = source.live().await?;   // the first load must succeed
//! let watch = source.watch(live.clone()); // later versions are picked up while it lives
//! assert_eq!(live.load().rules().rules()[0].name(), Some("all"));
//! drop(watch); // stops polling
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gray_core::rules::{Format, RuleSet, content_hash};
use tokio::time::MissedTickBehavior;

use super::{
    error::SourceError,
    live::{LiveRules, Revision},
};

/// The default polling interval.
pub const DEFAULT_POLL: Duration = Duration::from_millis(250);

/// A rule file in TOML, YAML or JSON (by extension, or [`FileSource::with_format`]).
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    format: Option<Format>,
    interval: Duration,
}

/// A running watch; dropping it (or [`WatchHandle::stop`]) stops the background task.
#[derive(Debug)]
pub struct WatchHandle {
    task: tokio::task::JoinHandle<()>,
}

impl WatchHandle {
    pub(crate) fn new(task: tokio::task::JoinHandle<()>) -> Self {
        WatchHandle { task }
    }

    /// Stops watching.
    pub fn stop(self) {}
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FileSource {
    /// The file at `path`, polled every 250 ms.
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileSource {
            path: path.as_ref().to_path_buf(),
            format: None,
            interval: DEFAULT_POLL,
        }
    }

    /// Reads the file as `format`, whatever its extension.
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = Some(format);
        self
    }

    /// Polls every `interval` (at least 10 ms).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn format(&self) -> Result<Format, SourceError> {
        self.format
            .or_else(|| Format::from_path(&self.path))
            .ok_or_else(|| SourceError::UnknownFormat(self.path.clone()))
    }

    async fn read(&self) -> Result<(Vec<u8>, Revision), SourceError> {
        let io = |source| SourceError::Io {
            path: self.path.clone(),
            source,
        };
        let bytes = tokio::fs::read(&self.path).await.map_err(io)?;
        let modified = tokio::fs::metadata(&self.path)
            .await
            .ok()
            .and_then(|m| m.modified().ok());
        let revision = Revision::File {
            modified,
            hash: content_hash(&bytes),
        };
        Ok((bytes, revision))
    }

    fn parse(&self, bytes: &[u8]) -> Result<RuleSet, SourceError> {
        let text = std::str::from_utf8(bytes).map_err(|e| SourceError::Io {
            path: self.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        let source = self.path.display().to_string();
        Ok(RuleSet::parse(text, self.format()?, &source)?)
    }

    /// Reads and compiles the file once.
    pub async fn load(&self) -> Result<(RuleSet, Revision), SourceError> {
        let (bytes, revision) = self.read().await?;
        Ok((self.parse(&bytes)?, revision))
    }

    /// Reads the file once and puts it in force in new [`LiveRules`].
    pub async fn live(&self) -> Result<LiveRules, SourceError> {
        let (rules, revision) = self.load().await?;
        Ok(LiveRules::with_revision(rules, revision))
    }

    /// Polls the file in a background task and keeps `live` up to date while the returned
    /// handle lives. Must be called inside a tokio runtime.
    pub fn watch(&self, live: LiveRules) -> WatchHandle {
        let source = self.clone();
        WatchHandle::new(tokio::spawn(async move { source.run(live).await }))
    }

    async fn run(self, live: LiveRules) {
        // The version in force when the watch starts counts as seen.
        let mut seen = match live.load().revision() {
            Revision::File { hash, .. } => Some(*hash),
            _ => None,
        };
        let mut failing = false;
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (bytes, revision) = match self.read().await {
                Ok(read) => read,
                Err(e) => {
                    if !failing {
                        live.source_failed(&e);
                        failing = true;
                    }
                    continue;
                }
            };
            failing = false;
            let Revision::File { hash, .. } = revision else {
                continue;
            };
            if seen == Some(hash) {
                continue;
            }
            seen = Some(hash);
            match self.parse(&bytes) {
                Ok(rules) => {
                    live.replace(rules, revision);
                }
                Err(e) => live.reject(&e, &revision),
            }
        }
    }
}
