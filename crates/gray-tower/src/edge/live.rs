//! The rule set in force, swapped atomically while requests flow.
//!
//! [`LiveRules`] holds the current [`Snapshot`] behind `arc-swap`: a request loads it once
//! (no lock, no contention with writers) and is decided by that one snapshot from start to
//! end, even if a reload lands meanwhile. Every accepted version gets the next
//! *generation* number; the [`Revision`] says where it came from. A version that fails to
//! parse or validate is **rejected**: the previous snapshot stays in force, a `tracing`
//! error event (target `gray::rules`) is emitted, and [`Status`] records it.
//!
//! ```
//! use gray_core::rules::{Format, RuleSet};
//! use gray_tower::edge::{LiveRules, Revision};
//!
//! let live = LiveRules::new(RuleSet::default());
//! assert_eq!(live.status().generation, 1);
//!
//! let ok = live.apply(r#"{"rules":[{"lane":"gray"}]}"#, Format::Json, "inline", Revision::Manual(2));
//! assert_eq!(ok.unwrap(), 2);
//! let bad = live.apply(r#"{"rules":[{"lane":"not valid"}]}"#, Format::Json, "inline", Revision::Manual(3));
//! assert!(bad.is_err());
//!
//! let status = live.status();
//! assert_eq!(status.generation, 2); // the valid version stays in force
//! assert_eq!(status.revision, Revision::Manual(2));
//! assert_eq!(status.rejected, 1);
//! assert!(status.last_error.unwrap().contains("field `lane`"));
//! assert_eq!(live.load().rules().rules().len(), 1);
//! ```

use std::{
    fmt,
    ops::Deref,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use arc_swap::ArcSwap;
use gray_core::rules::{Format, RuleSet, RulesError};
use tokio::sync::watch;

/// Where a rule-set version came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Revision {
    /// Given in code at start-up.
    Initial,
    /// Set by the caller, with its own number.
    Manual(u64),
    /// Read from a file.
    File {
        /// The file's modification time, when the platform reports one.
        modified: Option<SystemTime>,
        /// [`content_hash`](gray_core::rules::content_hash) of the file's bytes.
        hash: u64,
    },
    /// Read from an etcd key.
    Etcd {
        /// The key's `mod_revision`.
        mod_revision: i64,
    },
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Revision::Initial => f.write_str("initial"),
            Revision::Manual(n) => write!(f, "manual {n}"),
            Revision::File { hash, .. } => write!(f, "file {hash:016x}"),
            Revision::Etcd { mod_revision } => write!(f, "etcd mod_revision {mod_revision}"),
        }
    }
}

/// One accepted rule-set version.
#[derive(Debug)]
pub struct Snapshot {
    rules: RuleSet,
    generation: u64,
    revision: Revision,
}

impl Snapshot {
    /// The rules.
    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// The generation: 1 for the first version, +1 for each accepted one.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Where this version came from.
    pub fn revision(&self) -> &Revision {
        &self.revision
    }
}

/// What is in force and what was last rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The generation in force.
    pub generation: u64,
    /// The revision in force.
    pub revision: Revision,
    /// How many versions were rejected so far.
    pub rejected: u64,
    /// The last rejection (or source failure), if any.
    pub last_error: Option<String>,
}

struct Shared {
    current: ArcSwap<Snapshot>,
    // Serializes writers so generations are handed out in store order.
    write: Mutex<()>,
    next_generation: AtomicU64,
    rejected: AtomicU64,
    status: watch::Sender<Status>,
}

/// The rule set in force, shared by every clone; see the [module docs](self).
#[derive(Clone)]
pub struct LiveRules {
    shared: Arc<Shared>,
}

impl fmt::Debug for LiveRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveRules")
            .field("status", &*self.shared.status.borrow())
            .finish()
    }
}

/// A loaded snapshot; dereferences to [`Snapshot`]. Hold it only while deciding a request.
pub struct SnapshotGuard(arc_swap::Guard<Arc<Snapshot>>);

impl Deref for SnapshotGuard {
    type Target = Snapshot;

    fn deref(&self) -> &Snapshot {
        &self.0
    }
}

impl fmt::Debug for SnapshotGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl From<RuleSet> for LiveRules {
    fn from(rules: RuleSet) -> Self {
        LiveRules::new(rules)
    }
}

impl LiveRules {
    /// `rules` in force as generation 1, [`Revision::Initial`].
    pub fn new(rules: RuleSet) -> Self {
        Self::with_revision(rules, Revision::Initial)
    }

    /// `rules` in force as generation 1, from `revision`.
    pub fn with_revision(rules: RuleSet, revision: Revision) -> Self {
        let status = Status {
            generation: 1,
            revision: revision.clone(),
            rejected: 0,
            last_error: None,
        };
        LiveRules {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(Snapshot {
                    rules,
                    generation: 1,
                    revision,
                }),
                write: Mutex::new(()),
                next_generation: AtomicU64::new(2),
                rejected: AtomicU64::new(0),
                status: watch::Sender::new(status),
            }),
        }
    }

    /// The snapshot in force: one atomic load, no lock.
    pub fn load(&self) -> SnapshotGuard {
        SnapshotGuard(self.shared.current.load())
    }

    /// The snapshot in force, as an owned handle.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.current.load_full()
    }

    /// Puts `rules` in force; returns the new generation.
    pub fn replace(&self, rules: RuleSet, revision: Revision) -> u64 {
        let _writer = self
            .shared
            .write
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let generation = self.shared.next_generation.fetch_add(1, Ordering::Relaxed);
        self.shared.current.store(Arc::new(Snapshot {
            rules,
            generation,
            revision: revision.clone(),
        }));
        tracing::info!(
            target: "gray::rules",
            generation,
            %revision,
            "rule set in force",
        );
        self.shared.status.send_modify(|s| {
            s.generation = generation;
            s.revision = revision;
        });
        generation
    }

    /// Parses `text` and puts it in force, or rejects it (the previous version stays).
    pub fn apply(
        &self,
        text: &str,
        format: Format,
        source: &str,
        revision: Revision,
    ) -> Result<u64, RulesError> {
        match RuleSet::parse(text, format, source) {
            Ok(rules) => Ok(self.replace(rules, revision)),
            Err(e) => {
                self.reject(&e, &revision);
                Err(e)
            }
        }
    }

    /// Records a rejected version: an error event, [`Status::rejected`] and
    /// [`Status::last_error`]. The rules in force do not change.
    pub fn reject(&self, error: &dyn fmt::Display, revision: &Revision) {
        let rejected = self.shared.rejected.fetch_add(1, Ordering::Relaxed) + 1;
        let message = error.to_string();
        tracing::error!(
            target: "gray::rules",
            %revision,
            error = %message,
            "rule set rejected; the previous version stays in force",
        );
        self.shared.status.send_modify(|s| {
            s.rejected = rejected;
            s.last_error = Some(message);
        });
    }

    /// Records that a source failed (unreadable file, lost etcd connection): a warning
    /// event and [`Status::last_error`]. Nothing is rejected and the rules do not change.
    pub fn source_failed(&self, error: &dyn fmt::Display) {
        let message = error.to_string();
        tracing::warn!(
            target: "gray::rules",
            error = %message,
            "rule source failed; the rules in force stay",
        );
        self.shared
            .status
            .send_modify(|s| s.last_error = Some(message));
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.shared.status.borrow().clone()
    }

    /// A receiver that sees every status change (accepted or rejected versions).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.shared.status.subscribe()
    }
}
