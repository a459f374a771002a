//! One file, polled for changes (feature `file`).
//!
//! [`FileSource::watch`] checks the file every 250 ms (configurable): its modification time,
//! size and (on Unix) identity (device and inode, through every symlink) first, and its
//! bytes when they changed or when the file was modified in the last few seconds (a second
//! edit within the granularity of the file system's clock does not show in the
//! modification time). Whenever the bytes differ from the last ones
//! handed out, the stream yields an [`Update::Reset`] with one [`Entry`]: the key is the
//! path, the value the bytes, the revision [`Revision::File`].
//!
//! No platform file watcher is used, so it works the same on every file system, bind
//! mounts and Kubernetes ConfigMaps included: the path is resolved at every check, so a
//! ConfigMap update (a new timestamped directory, the `..data` symlink swapped to it, the
//! old directory removed) is followed, even when the new file has the old one's length and
//! modification time. A missing or unreadable file is logged once (WARN, target `gray::source`),
//! recorded in the [`Status`](crate::Status), and changes nothing; when it is readable
//! again, its content is handed out if it changed meanwhile.
//!
//! # Files written in place
//!
//! Write files atomically (write a temporary file, then rename it over the old one). A
//! file written **in place** (truncated, then written in several writes) can be read
//! between two writes: empty, or a prefix of the new version that may well parse. So a
//! version is handed out only once it has **settled**: a second read, the settle delay
//! later ([`DEFAULT_SETTLE`], 100 ms; [`FileSource::with_settle`]), gave the same bytes.
//! A writer still at work by then has changed them, and the wait starts again. A change
//! thus takes the polling interval plus the settle delay to be handed out (350 ms at
//! most by default). A file not modified in the last 3 s that did not change while it was
//! read is handed out at once (the usual case for [`Source::load`] at start-up). A writer
//! that pauses longer than the settle delay in the middle of a file can still be caught
//! half-way: raise the delay, or write atomically. [`Source::load`] waits for a file to
//! settle too, up to 20 settle delays; then it returns what it read last.
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_source::{Source, Update, file::FileSource};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("gray-file-doc-{}.txt", std::process::id()));
//! std::fs::write(&path, "one")?;
//! let source = FileSource::new(&path)
//!     .with_interval(Duration::from_millis(10))
//!     .with_settle(Duration::from_millis(20));
//! assert_eq!(source.settle(), Duration::from_millis(20));
//! let mut updates = source.watch();
//! let Some(Update::Reset(first)) = updates.next().await else { unreachable!() };
//! assert_eq!(first.entries[0].value, b"one");
//!
//! std::fs::write(&path, "two")?;
//! let Some(Update::Reset(second)) = updates.next().await else { unreachable!() };
//! assert_eq!(second.entries[0].value, b"two");
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures_util::stream;
use gray_core::hash::content_hash;
use tokio::time::{Interval, MissedTickBehavior};

use self::settle::{Read, Settle};
use crate::{Entry, Revision, Snapshot, Source, SourceError, StatusHandle, Update, Updates};

mod settle;

/// The default polling interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);

/// The default settle delay: a version read is handed out once a second read this much
/// later gives the same bytes (see [Files written in place](self#files-written-in-place)).
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(100);

/// How many settle delays [`Source::load`] waits for a file that keeps changing.
const LOAD_PATIENCE: u32 = 20;

/// A file modified less than this long ago is compared by content as well, as its
/// modification time may not change on a second edit on file systems with coarse times.
const RACY_WINDOW: Duration = Duration::from_secs(3);

/// One file, polled; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct FileSource {
    path: Arc<Path>,
    interval: Duration,
    settle: Duration,
}

impl FileSource {
    /// The file at `path`, polled every [`DEFAULT_INTERVAL`], each version handed out once
    /// it has settled for [`DEFAULT_SETTLE`].
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileSource {
            path: Arc::from(path.as_ref()),
            interval: DEFAULT_INTERVAL,
            settle: DEFAULT_SETTLE,
        }
    }

    /// Polls every `interval` (at least 1 ms).
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Hands a version out only once a second read, `settle` later, gave the same bytes
    /// (see [Files written in place](self#files-written-in-place)). `Duration::ZERO` hands
    /// out every read at once, as written in place or not.
    #[must_use]
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The polling interval.
    #[must_use]
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The settle delay.
    #[must_use]
    pub fn settle(&self) -> Duration {
        self.settle
    }

    fn settler(&self) -> Settle {
        Settle::new(self.settle, RACY_WINDOW)
    }

    fn read_error(&self, source: std::io::Error) -> SourceError {
        SourceError::Read {
            path: self.path.to_path_buf(),
            source,
        }
    }

    fn snapshot(&self, stamp: Stamp, bytes: Vec<u8>) -> Snapshot {
        let revision = Revision::File {
            modified: stamp.modified,
            hash: content_hash(&bytes),
        };
        Snapshot {
            entries: vec![Entry {
                key: self.path.display().to_string(),
                value: bytes,
                revision: revision.clone(),
            }],
            revision,
        }
    }

    /// Reads the bytes, with the stamp before, and whether it was the same after.
    async fn read(&self, before: Option<Stamp>) -> Result<(Stamp, Vec<u8>, bool), SourceError> {
        let before = match before {
            Some(stamp) => stamp,
            None => self.stamp().await?,
        };
        let bytes = tokio::fs::read(&self.path)
            .await
            .map_err(|e| self.read_error(e))?;
        let still = self.stamp().await? == before;
        Ok((before, bytes, still))
    }

    async fn stamp(&self) -> Result<Stamp, SourceError> {
        let meta = tokio::fs::metadata(&self.path)
            .await
            .map_err(|e| self.read_error(e))?;
        Ok(Stamp::of(&meta))
    }
}

impl Source for FileSource {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// Reads the file once it has settled (see [Files written in place](self#files-written-in-place)).
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(async move {
            let mut settle = self.settler();
            let mut reads = 0;
            loop {
                let (stamp, bytes, still) = self.read(None).await?;
                let read = Read::of(stamp, &bytes, still);
                reads += 1;
                if settle.ready(read, tokio::time::Instant::now()) {
                    return Ok(self.snapshot(stamp, bytes));
                }
                let Some(due) = settle.due().filter(|_| reads < LOAD_PATIENCE) else {
                    tracing::warn!(target: "gray::source", file = %self.path.display(), reads,
                        "file still changing; read as it is");
                    return Ok(self.snapshot(stamp, bytes));
                };
                tokio::time::sleep_until(due).await;
            }
        })
    }

    fn watch(&self) -> Updates {
        let status = StatusHandle::new();
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let poller = Poller {
            settle: self.settler(),
            source: self.clone(),
            ticker,
            stamp: None,
            hash: None,
            failing: false,
            status: status.clone(),
        };
        Updates::new(
            stream::unfold(poller, |mut p| async move {
                let update = p.next().await;
                Some((update, p))
            }),
            status,
        )
    }
}

/// What identifies a version of the file cheaply: its modification time, its length and
/// (on Unix) the file itself, device and inode, at the end of every symlink. A file
/// renamed over the old one, or a symlink swapped to a new file (a Kubernetes ConfigMap
/// update), is a new file, whatever its time and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    file: Option<(u64, u64)>,
}

impl Read {
    fn of(stamp: Stamp, bytes: &[u8], still: bool) -> Read {
        Read {
            modified: stamp.modified,
            still,
            len: bytes.len(),
            hash: content_hash(bytes),
        }
    }
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        #[cfg(unix)]
        let file = {
            use std::os::unix::fs::MetadataExt;
            Some((meta.dev(), meta.ino()))
        };
        #[cfg(not(unix))]
        let file = None;
        Stamp {
            modified: meta.modified().ok(),
            len: meta.len(),
            file,
        }
    }

    /// Whether the file was modified so recently that an edit may not show in the stamp.
    fn is_recent(&self) -> bool {
        match self.modified {
            Some(modified) => SystemTime::now()
                .duration_since(modified)
                .map_or(true, |age| age < RACY_WINDOW),
            None => true,
        }
    }
}

struct Poller {
    source: FileSource,
    ticker: Interval,
    /// The stamp at the last read.
    stamp: Option<Stamp>,
    /// The hash of the bytes last handed out.
    hash: Option<u64>,
    /// Whether the last check failed, so that a failure is logged once.
    failing: bool,
    /// When the version read last may be handed out.
    settle: Settle,
    status: StatusHandle,
}

impl Poller {
    /// Waits for the next version of the file.
    async fn next(&mut self) -> Update {
        loop {
            match self.settle.due() {
                // A version read waits for the read that confirms it.
                Some(due) => tokio::time::sleep_until(due).await,
                // The first tick completes at once: the first version is read immediately.
                None => {
                    self.ticker.tick().await;
                }
            }
            match self.check().await {
                Ok(Some(snapshot)) => return Update::Reset(snapshot),
                Ok(None) => {}
                Err(error) => {
                    // Read again at the next tick, not at once.
                    self.settle.clear();
                    self.status.failure(&error);
                    if !self.failing {
                        self.failing = true;
                        tracing::warn!(target: "gray::source", %error, "file unreadable; what it held stays in force");
                    }
                }
            }
        }
    }

    /// The file's new content, if it changed.
    async fn check(&mut self) -> Result<Option<Snapshot>, SourceError> {
        let path = &self.source.path;
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| self.source.read_error(e))?;
        let stamp = Stamp::of(&meta);
        if self.failing {
            self.failing = false;
            tracing::info!(target: "gray::source", file = %path.display(), "file readable again");
        }
        if self.stamp == Some(stamp) && !stamp.is_recent() && self.settle.due().is_none() {
            self.status.contact(None);
            return Ok(None);
        }
        let (stamp, bytes, still) = self.source.read(Some(stamp)).await?;
        self.status.contact(None);
        self.stamp = Some(stamp);
        let read = Read::of(stamp, &bytes, still);
        if self.hash == Some(read.hash) {
            // Back to what was handed out (or never left it).
            self.settle.clear();
            return Ok(None);
        }
        if !self.settle.ready(read, tokio::time::Instant::now()) {
            return Ok(None);
        }
        self.hash = Some(read.hash);
        Ok(Some(self.source.snapshot(stamp, bytes)))
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use std::path::PathBuf;

    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("gray-source-{}-{name}", std::process::id()))
    }

    #[tokio::test]
    async fn yields_each_new_content_once_and_survives_deletion() {
        let path = temp("survive");
        std::fs::write(&path, "a").unwrap();
        let source = FileSource::new(&path).with_interval(Duration::from_millis(5));
        let mut updates = source.watch();
        let next = |u: Option<Update>| match u {
            Some(Update::Reset(s)) => String::from_utf8(s.entries[0].value.clone()).unwrap(),
            other => panic!("expected a reset, got {other:?}"),
        };
        assert_eq!(next(updates.next().await), "a");

        std::fs::remove_file(&path).unwrap();
        // Deleted: nothing is yielded, the failure shows in the status.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while updates.status().failures == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no failure recorded"
            );
            tokio::select! {
                u = updates.next() => panic!("nothing expected, got {u:?}"),
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        assert!(!updates.status().connected);
        assert!(updates.status().last_error.unwrap().contains("cannot read"));

        // Back with the same content: nothing new. Then a new content.
        std::fs::write(&path, "a").unwrap();
        std::fs::write(&path, "b").unwrap();
        assert_eq!(next(updates.next().await), "b");
        assert!(updates.status().connected);
        std::fs::remove_file(&path).unwrap();
    }

    /// A Kubernetes ConfigMap update swaps the `..data` symlink to a new directory. In the
    /// last swap, the new file has the old one's length and modification time, long past:
    /// only its identity (device and inode) tells the versions apart.
    #[cfg(unix)]
    #[tokio::test]
    async fn follows_a_configmap_swap_that_keeps_length_and_mtime() {
        use gray_test_support::{WAIT, configmap::ConfigMap};

        let past = SystemTime::now() - Duration::from_secs(3600);
        let mut map = ConfigMap::mount("configmap-swap", &[("rules.toml", "aaaa")]);
        let source =
            FileSource::new(map.path("rules.toml")).with_interval(Duration::from_millis(5));
        let mut updates = source.watch();
        let mut next = async || match tokio::time::timeout(WAIT, updates.next()).await {
            Ok(Some(Update::Reset(s))) => String::from_utf8(s.entries[0].value.clone()).unwrap(),
            other => panic!("expected a reset within {WAIT:?}, got {other:?}"),
        };
        assert_eq!(next().await, "aaaa");
        map.update_with_mtime(&[("rules.toml", "bbbb")], Some(past));
        assert_eq!(next().await, "bbbb");
        // Same length, same modification time, an hour old.
        map.update_with_mtime(&[("rules.toml", "cccc")], Some(past));
        assert_eq!(next().await, "cccc");
    }

    #[tokio::test]
    async fn load_reports_a_missing_file() {
        let err = FileSource::new(temp("missing")).load().await.unwrap_err();
        assert!(matches!(err, SourceError::Read { .. }), "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
