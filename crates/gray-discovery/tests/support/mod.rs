//! Test helpers: temporary directories and change streams as text; `etcd`: a real etcd server
//! and a TCP proxy that can cut connections.

#![allow(dead_code, unreachable_pub)]

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use futures_util::{Stream, StreamExt};
use gray_discovery::{Instance, InstanceId};
use tower::discover::Change;

#[cfg(feature = "etcd")]
pub mod etcd;

/// How long any single wait in these tests may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "gray-discovery-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A change as text: `+id address {k=v,..}` or `-id`.
pub fn describe(change: &Change<InstanceId, Instance>) -> String {
    match change {
        Change::Insert(id, instance) => {
            let labels: Vec<String> = instance
                .labels()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("+{id} {} {{{}}}", instance.address(), labels.join(","))
        }
        Change::Remove(id) => format!("-{id}"),
    }
}

/// The next change of `stream`, as text; fails the test after [`WAIT`].
pub async fn next<S, E>(stream: &mut S) -> String
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(change))) => describe(&change),
        Ok(Some(Err(e))) => panic!("the stream yielded an error: {e}"),
        Ok(None) => panic!("the stream ended"),
        Err(_) => panic!("no change within {WAIT:?}"),
    }
}

/// The next `n` changes.
pub async fn take<S, E>(stream: &mut S, n: usize) -> Vec<String>
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        changes.push(next(stream).await);
    }
    changes
}

/// Asserts that `stream` yields nothing (no change, no error, no end) for `quiet`.
pub async fn assert_quiet<S, E>(stream: &mut S, quiet: Duration)
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    if let Ok(item) = tokio::time::timeout(quiet, stream.next()).await {
        let item = item.map(|r| r.map(|c| describe(&c)).map_err(|e| e.to_string()));
        panic!("expected nothing, the stream yielded {item:?}");
    }
}
