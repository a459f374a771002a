//! Where a rollout's state lives, and what gateways that share a rollout tell each other:
//! [`RolloutStore`], and [`FileStore`], one gateway's local files (etcd, shared by several
//! gateways: `rollout::etcd::EtcdStore`, feature `etcd`).
//!
//! The gateway's controller (`src/rollout/controller/`) decides who looks and who transitions; a store
//! only keeps and fences. With several gateways (etcd, issue 20 item 6) a store also
//! carries every gateway's cumulative [`Report`] to the leader, says whether this gateway
//! leads, and how fresh its contact with the shared store is, for the rule that a gateway
//! cut off holds its weight for a bounded time and then drops it to 0.
//!
//! ```
//! use gray_gateway::rollout::store::{Fence, FileStore, RolloutStore, Saved};
//! use gray_rollout::{Rollout, RolloutConfig};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let dir = std::env::temp_dir().join(format!("gray-store-doc-{}", std::process::id()));
//! let store = FileStore::new(&dir);
//! let mut rollout = Rollout::new(RolloutConfig::new("canary")).unwrap();
//! rollout.start(std::time::Duration::from_secs(1)).unwrap();
//!
//! // the first save expects nothing stored; the next one names the version it saw
//! let saved = store.save("orders", rollout.state(), None, Fence::Leader).await.unwrap();
//! assert_eq!(saved, Saved::Won(1));
//! let stale = store.save("orders", rollout.state(), None, Fence::Leader).await.unwrap();
//! assert!(matches!(stale, Saved::Lost(Some(_))));
//!
//! // a restart reads it back
//! let back = FileStore::new(&dir).load("orders").await.unwrap().unwrap();
//! assert_eq!((back.version, &back.state), (1, rollout.state()));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # });
//! ```

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use futures_util::future::BoxFuture;
use gray_rollout::{Report, State};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// A rollout's state as a store holds it, with the version a later save must name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Stored {
    /// Incremented by every save that won (etcd: the key's mod revision).
    pub version: u64,
    /// The state machine's state.
    pub state: State,
}

/// Who may write a save: the leader only (a step, a pause, a rollback by the test), or
/// any gateway (an abort: the safe direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fence {
    /// Only while this gateway holds the leader key (etcd: a transaction that compares it).
    Leader,
    /// Any gateway.
    Any,
}

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Saved {
    /// Written, as this version.
    Won(u64),
    /// Not written: the stored version was not the expected one, or the fence did not
    /// hold. What the store has now, for the caller to adopt.
    Lost(Option<Box<Stored>>),
}

/// How fresh the store's contact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contact {
    /// When the store last answered (`None`: never).
    pub last: Option<Instant>,
}

/// A store failed (I/O, a damaged file, a lost connection).
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Where rollouts' states live; see the [module docs](self). Object-safe: the gateway
/// holds an `Arc<dyn RolloutStore>`.
pub trait RolloutStore: Send + Sync + std::fmt::Debug + 'static {
    /// The state of `service`'s rollout, if one was ever saved.
    fn load<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>>;

    /// Saves `state` if the stored version is `expected` (`None`: nothing stored yet) and
    /// the fence holds.
    fn save<'a>(
        &'a self,
        service: &'a str,
        state: &'a State,
        expected: Option<u64>,
        fence: Fence,
    ) -> BoxFuture<'a, Result<Saved, StoreError>>;

    /// Publishes this gateway's cumulative report for `service`.
    fn publish_report<'a>(
        &'a self,
        service: &'a str,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Every gateway's latest report for `service` (this one's included).
    fn reports<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Vec<Report>, StoreError>>;

    /// Whether this gateway leads `service`'s rollout: it alone observes and advances.
    fn is_leader(&self, service: &str) -> bool;

    /// The states written for `service`, by any gateway, as they are written.
    fn watch(&self, service: &str) -> watch::Receiver<Option<Stored>>;

    /// How fresh the contact with the store is.
    fn contact(&self) -> Contact;

    /// What this gateway's reports are held under (etcd: its lease). When it changes, the
    /// reports published before may be gone, and the next one is published at once. The
    /// default: 0, reports that never go.
    fn reports_holder(&self) -> u64 {
        0
    }

    /// `service`'s controller completed a look. A store with an election lets go of the
    /// leadership of a rollout whose controller has not completed a look for a bounded
    /// time (etcd: a lease TTL), and does not take it until looks complete again, so that
    /// a stuck leader does not freeze the rollout. The default does nothing.
    fn looked(&self, service: &str) {
        let _ = service;
    }

    /// This gateway's configuration of `service`'s rollout does not fit the stored state
    /// (a skew): a store with an election gives up its leadership of the rollout at once,
    /// and does not take it until a look completes again ([`looked`](Self::looked)). The
    /// default does nothing.
    fn unfit(&self, service: &str) {
        let _ = service;
    }

    /// Lets go of what this gateway holds in the store (etcd: revokes its lease, so that
    /// its leader keys and reports go at once and another gateway leads); called by
    /// [`Gateway::shutdown`](crate::Gateway::shutdown). The default does nothing.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

// === impl FileStore ===

/// One gateway's rollouts, each in `<dir>/<service>.rollout.json`, written atomically
/// (a temporary file, fsync, rename, fsync of the folder) on tokio's blocking threads,
/// never on the async runtime. This gateway always leads; the reports are its own.
///
/// [`FileStore::open`] takes an exclusive lock on `<dir>/gray-rollouts.lock` for as long
/// as the store lives (until [`close`](RolloutStore::close)): a second gateway given the
/// same folder refuses to start, rather than both leading the same rollouts. Several
/// gateways share rollouts through etcd, never through one folder.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    inner: Mutex<std::collections::BTreeMap<String, Local>>,
    lock: Mutex<Option<std::fs::File>>,
}

#[derive(Debug)]
struct Local {
    report: Option<Report>,
    watch: watch::Sender<Option<Stored>>,
}

impl FileStore {
    /// States in `dir` (created on the first save), without the folder's lock: for one
    /// process that knows it is alone (a test, a tool reading states). A gateway uses
    /// [`FileStore::open`].
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Arc<Self> {
        Arc::new(FileStore {
            dir: dir.into(),
            inner: Mutex::default(),
            lock: Mutex::new(None),
        })
    }

    /// States in `dir` (created now), holding its lock file `gray-rollouts.lock`; an
    /// error naming the folder when another process (or another store of this one)
    /// holds it.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Arc<Self>, StoreError> {
        let dir = dir.into();
        let path = dir.join(LOCK_FILE);
        let locked = std::fs::create_dir_all(&dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
            })
            .map_err(|e| format!("rollouts: {}: {e}", path.display()))?;
        match locked.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(format!(
                    "rollouts: {} is locked: another gateway keeps its rollouts in {} \
                     (two gateways on one state_dir would both lead them); give each \
                     gateway its own `[rollouts] state_dir`, or share rollouts through etcd",
                    path.display(),
                    dir.display()
                )
                .into());
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("rollouts: {}: cannot lock: {e}", path.display()).into());
            }
        }
        Ok(Arc::new(FileStore {
            dir,
            inner: Mutex::default(),
            lock: Mutex::new(Some(locked)),
        }))
    }

    /// The file of `service`'s rollout.
    #[must_use]
    pub fn path(&self, service: &str) -> PathBuf {
        self.dir.join(format!("{service}.rollout.json"))
    }

    fn local<T>(&self, service: &str, f: impl FnOnce(&mut Local) -> T) -> T {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let local = inner.entry(service.to_owned()).or_insert_with(|| Local {
            report: None,
            watch: watch::Sender::new(None),
        });
        f(local)
    }

    /// `f` on one of tokio's blocking threads (file I/O and fsync never block the runtime).
    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| format!("rollouts: the file store's I/O task failed: {e}"))?
    }

    fn read(path: &Path) -> Result<Option<Stored>, StoreError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{}: not a rollout state: {e}", path.display()).into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display()).into()),
        }
    }

    fn write(dir: &Path, path: &Path, stored: &Stored) -> Result<(), StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(stored).map_err(std::io::Error::other)?)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            // the rename itself is durable once the folder is
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", path.display()).into()
        })
    }
}

impl RolloutStore for FileStore {
    fn load<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async move {
            let path = self.path(service);
            let stored = Self::blocking(move || Self::read(&path)).await?;
            self.local(service, |l| l.watch.send_replace(stored.clone()));
            Ok(stored)
        })
    }

    fn save<'a>(
        &'a self,
        service: &'a str,
        state: &'a State,
        expected: Option<u64>,
        _fence: Fence,
    ) -> BoxFuture<'a, Result<Saved, StoreError>> {
        let (dir, path, state) = (self.dir.clone(), self.path(service), state.clone());
        Box::pin(async move {
            let saved = Self::blocking(move || {
                let current = Self::read(&path)?;
                if current.as_ref().map(|s| s.version) != expected {
                    return Ok(Err(current.map(Box::new)));
                }
                let stored = Stored {
                    version: expected.map_or(1, |v| v.saturating_add(1)),
                    state,
                };
                Self::write(&dir, &path, &stored)?;
                Ok(Ok(stored))
            })
            .await?;
            match saved {
                Ok(stored) => {
                    let version = stored.version;
                    self.local(service, |l| l.watch.send_replace(Some(stored)));
                    Ok(Saved::Won(version))
                }
                Err(current) => Ok(Saved::Lost(current)),
            }
        })
    }

    fn publish_report<'a>(
        &'a self,
        service: &'a str,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.local(service, |l| l.report = Some(report.clone()));
        Box::pin(async { Ok(()) })
    }

    fn reports<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Vec<Report>, StoreError>> {
        let reports = self.local(service, |l| l.report.clone().into_iter().collect());
        Box::pin(async move { Ok(reports) })
    }

    fn is_leader(&self, _service: &str) -> bool {
        true
    }

    fn watch(&self, service: &str) -> watch::Receiver<Option<Stored>> {
        self.local(service, |l| l.watch.subscribe())
    }

    fn contact(&self) -> Contact {
        Contact {
            last: Some(Instant::now()),
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        // the lock goes with the file
        drop(self.lock.lock().unwrap_or_else(|p| p.into_inner()).take());
        Box::pin(async {})
    }
}

/// The lock file [`FileStore::open`] holds in its folder.
pub const LOCK_FILE: &str = "gray-rollouts.lock";

#[cfg(test)]
mod tests {
    use gray_rollout::{Rollout, RolloutConfig};

    use super::*;

    #[tokio::test]
    async fn a_state_round_trips_and_stale_versions_lose() {
        let dir =
            std::env::temp_dir().join(format!("gray-store-{}-{}", std::process::id(), line!()));
        let store = FileStore::new(&dir);
        assert_eq!(store.load("orders").await.unwrap(), None);
        let mut rollout = Rollout::new(RolloutConfig::new("canary")).unwrap();
        rollout.start(std::time::Duration::from_secs(5)).unwrap();
        let state = rollout.state().clone();
        let mut watch = store.watch("orders");

        assert_eq!(
            store
                .save("orders", &state, None, Fence::Leader)
                .await
                .unwrap(),
            Saved::Won(1)
        );
        assert_eq!(
            watch.borrow_and_update().as_ref().map(|s| s.version),
            Some(1)
        );
        // a writer that did not see version 1 loses, and is told what is there
        let lost = store
            .save("orders", &state, None, Fence::Leader)
            .await
            .unwrap();
        assert!(
            matches!(&lost, Saved::Lost(Some(s)) if s.version == 1),
            "{lost:?}"
        );
        assert_eq!(
            store
                .save("orders", &state, Some(1), Fence::Any)
                .await
                .unwrap(),
            Saved::Won(2)
        );

        // another store on the same folder (a restart) reads the same state back
        let again = FileStore::new(&dir).load("orders").await.unwrap().unwrap();
        assert_eq!((again.version, &again.state), (2, &state));
        // no temporary file is left behind
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["orders.rollout.json"]);

        // a damaged file is an error naming it, never a fresh start
        std::fs::write(store.path("orders"), "{").unwrap();
        let err = store.load("orders").await.unwrap_err().to_string();
        assert!(
            err.contains("orders.rollout.json") && err.contains("not a rollout state"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_second_store_on_one_folder_is_refused_until_the_first_closes() {
        let dir =
            std::env::temp_dir().join(format!("gray-store-{}-{}", std::process::id(), line!()));
        let first = FileStore::open(&dir).unwrap();
        let err = FileStore::open(&dir).unwrap_err().to_string();
        assert!(
            err.contains(LOCK_FILE) && err.contains("is locked") && err.contains("state_dir"),
            "{err}"
        );
        first.close().await;
        let again = FileStore::open(&dir).expect("the lock went with the first store");
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
