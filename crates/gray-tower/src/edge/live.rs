//! The rule set in force, swapped atomically while requests flow, and kept up to date
//! from a file or an etcd key.
//!
//! [`LiveRules`] holds the current [`RulesSnapshot`] behind `arc-swap`: a request loads it once
//! (no lock, no contention with writers) and is decided by that one snapshot from start to
//! end, even if a reload lands meanwhile. Every accepted version gets the next
//! *generation* number; the [`Revision`] says where it came from. A version that fails to
//! parse or validate is **rejected**: the previous snapshot stays in force, a `tracing`
//! error event (target `gray::rules`) is emitted, and [`RulesStatus`] records it.
//!
//! ```
//! use gray_rules::{Format, RuleSet};
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
//!
//! # Rules from a file or etcd
//!
//! A rule set is a [`Source`] whose one entry parses as a [`RuleSet`]: a file
//! ([`FileSource`](gray_source::file::FileSource), polled) or one etcd key
//! ([`EtcdSource::key`](gray_source::etcd::EtcdSource::key), watched; feature `etcd`).
//! [`LiveRules::from_source`] reads it once (a failure there should stop the program), and
//! [`LiveRules::follow`] applies every later version in a background task while the
//! returned [`WatchHandle`] lives:
//!
//! - a new version is parsed and put in force, or rejected (the previous one stays);
//! - an **empty** version (0 bytes, or blanks and comments only) is rejected, with an error
//!   that names the source ([`RuleSourceError::Empty`]), and refused by
//!   [`LiveRules::from_source`]: it is what a file written in place looks like for a
//!   moment, never a way to say "no rules". A document says that explicitly: `rules = []`
//!   (YAML `rules: []`, JSON `{"rules": []}`). A file is handed out only once its writer
//!   is done with it ([`FileSource`](gray_source::file::FileSource)'s settle delay), so a
//!   file written in place never puts a prefix of itself in force either;
//! - a deleted key, or a source that cannot be read for a while (a missing file, etcd
//!   unreachable), changes nothing: a warning event, and [`RulesStatus::last_error`];
//! - the source's own freshness (last contact, etcd revision and cluster, failures) is
//!   [`WatchHandle::status`].
//!
//! The format is given, or told by the key's extension (`.toml`, `.yaml`/`.yml`,
//! `.json`). What each etcd fault does and how fast it heals is in [`gray_source::etcd`].
//!
//! ```
//! use std::time::Duration;
//! use gray_tower::edge::{FileSource, LiveRules};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("gray-live-doc-{}.json", std::process::id()));
//! std::fs::write(&path, r#"{"rules":[{"name":"one","lane":"gray"}]}"#)?;
//!
//! let source = FileSource::new(&path).with_interval(Duration::from_millis(10));
//! let live = LiveRules::from_source(&source, None).await?; // JSON, by the extension
//! let watch = live.follow(&source, None); // later versions, while `watch` lives
//! assert_eq!(live.load().rules().rules()[0].name(), Some("one"));
//!
//! std::fs::write(&path, r#"{"rules":[{"name":"two","lane":"gray"}]}"#)?;
//! let mut status = live.subscribe();
//! tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.generation == 2)).await??;
//! assert_eq!(live.load().rules().rules()[0].name(), Some("two"));
//! assert!(watch.status().connected);
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
//! From etcd (the value in JSON, whatever the key's name):
//!
//! ```no_run
//! # #[cfg(feature = "etcd")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use gray_rules::Format;
//! use gray_tower::edge::{EtcdConfig, EtcdSource, LiveRules};
//!
//! let config = EtcdConfig::new(["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
//! let source = EtcdSource::key(config, "/gray/rules");
//! let live = LiveRules::from_source(&source, Format::Json).await?;
//! let _watch = live.follow(&source, Format::Json);
//! # Ok(())
//! # }
//! ```

use std::{
    fmt,
    ops::Deref,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use arc_swap::ArcSwap;
use futures_util::StreamExt;
use gray_core::hash::content_hash;
use gray_rules::{Format, RuleSet, RulesError};
pub use gray_source::Revision;
use gray_source::{Entry, Source, StatusHandle, Update, WatchHandle};
use tokio::sync::watch;

use super::error::RuleSourceError;

mod overrides;

pub use overrides::PercentOverride;
use overrides::Writer;

/// One accepted rule-set version.
#[derive(Debug)]
pub struct RulesSnapshot {
    rules: RuleSet,
    generation: u64,
    revision: Revision,
    /// The hash of the bytes it was parsed from, when read from a source.
    content: Option<u64>,
}

// === impl RulesSnapshot ===

impl RulesSnapshot {
    /// The rules.
    #[must_use]
    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    /// The generation: 1 for the first version, +1 for each accepted one.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Where this version came from.
    #[must_use]
    pub fn revision(&self) -> &Revision {
        &self.revision
    }
}

/// What is in force and what was last rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RulesStatus {
    /// The generation in force.
    pub generation: u64,
    /// The revision in force.
    pub revision: Revision,
    /// How many versions were rejected so far.
    pub rejected: u64,
    /// The last rejection (or source failure), if any.
    pub last_error: Option<String>,
}

/// What every clone of a [`LiveRules`] shares: the snapshot in force, its one writer, its
/// counts and status.
struct RulesCell {
    current: ArcSwap<RulesSnapshot>,
    // Serializes writers so generations are handed out in store order; holds the
    // percentage overrides and the rules as their source gave them.
    write: Mutex<Writer>,
    next_generation: AtomicU64,
    rejected: AtomicU64,
    status: watch::Sender<RulesStatus>,
}

/// The rule set in force, shared by every clone; see the [module docs](self).
#[derive(Clone)]
pub struct LiveRules {
    shared: Arc<RulesCell>,
}

// === impl LiveRules ===

impl fmt::Debug for LiveRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveRules")
            .field("status", &*self.shared.status.borrow())
            .finish()
    }
}

/// A loaded snapshot; dereferences to [`RulesSnapshot`]. Hold it only while deciding a request.
pub struct RulesGuard(arc_swap::Guard<Arc<RulesSnapshot>>);

// === impl RulesGuard ===

impl Deref for RulesGuard {
    type Target = RulesSnapshot;

    fn deref(&self) -> &RulesSnapshot {
        &self.0
    }
}

impl fmt::Debug for RulesGuard {
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
    #[must_use]
    pub fn new(rules: RuleSet) -> Self {
        Self::with_revision(rules, Revision::Initial)
    }

    /// `rules` in force as generation 1, from `revision`.
    #[must_use]
    pub fn with_revision(rules: RuleSet, revision: Revision) -> Self {
        Self::first(rules, revision, None)
    }

    fn first(rules: RuleSet, revision: Revision, content: Option<u64>) -> Self {
        let status = RulesStatus {
            generation: 1,
            revision: revision.clone(),
            rejected: 0,
            last_error: None,
        };
        LiveRules {
            shared: Arc::new(RulesCell {
                current: ArcSwap::from_pointee(RulesSnapshot {
                    rules,
                    generation: 1,
                    revision,
                    content,
                }),
                write: Mutex::new(Writer::default()),
                next_generation: AtomicU64::new(2),
                rejected: AtomicU64::new(0),
                status: watch::Sender::new(status),
            }),
        }
    }

    /// The snapshot in force: one atomic load, no lock.
    #[must_use]
    pub fn load(&self) -> RulesGuard {
        RulesGuard(self.shared.current.load())
    }

    /// The snapshot in force, as an owned handle.
    #[must_use]
    pub fn snapshot(&self) -> Arc<RulesSnapshot> {
        self.shared.current.load_full()
    }

    /// Puts `rules` in force; returns the new generation.
    #[must_use]
    pub fn replace(&self, rules: RuleSet, revision: Revision) -> u64 {
        self.put(rules, revision, None)
    }

    fn put(&self, rules: RuleSet, revision: Revision, content: Option<u64>) -> u64 {
        let mut writer = self.writer();
        let rules = writer.loaded(rules);
        self.store(&writer, rules, revision, content)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.shared
            .write
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Puts `rules` in force under the writer's lock (`_writer`); returns the generation.
    fn store(
        &self,
        _writer: &Writer,
        rules: RuleSet,
        revision: Revision,
        content: Option<u64>,
    ) -> u64 {
        let generation = self.shared.next_generation.fetch_add(1, Ordering::Relaxed);
        self.shared.current.store(Arc::new(RulesSnapshot {
            rules,
            generation,
            revision: revision.clone(),
            content,
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

    /// Records a rejected version: an error event, [`RulesStatus::rejected`] and
    /// [`RulesStatus::last_error`]. The rules in force do not change.
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
    /// event and [`RulesStatus::last_error`]. Nothing is rejected and the rules do not change.
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
    #[must_use]
    pub fn status(&self) -> RulesStatus {
        self.shared.status.borrow().clone()
    }

    /// A receiver that sees every status change (accepted or rejected versions).
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<RulesStatus> {
        self.shared.status.subscribe()
    }

    /// Reads the rule set from `source` once, in `format` (`None`: by the key's
    /// extension), and puts it in force as generation 1. Fails when the source cannot be
    /// read, holds no key or several, or its rule set is empty or invalid: at start-up, a
    /// reason to stop. See the [module docs](self).
    pub async fn from_source(
        source: &(impl Source + ?Sized),
        format: impl Into<Option<Format>>,
    ) -> Result<LiveRules, RuleSourceError> {
        let reader = Reader::new(source, format.into());
        let snapshot = source.load().await?;
        let entry = match snapshot.entries.as_slice() {
            [entry] => entry,
            [] => return Err(RuleSourceError::Missing(reader.name)),
            many => {
                return Err(RuleSourceError::NotOneKey {
                    source: reader.name,
                    keys: many.iter().map(|e| e.key.clone()).collect(),
                });
            }
        };
        let rules = reader.parse(entry)?;
        Ok(Self::first(
            rules,
            entry.revision.clone(),
            Some(content_hash(&entry.value)),
        ))
    }

    /// Follows `source` in a background task and puts each new version in force (or
    /// rejects it) while the returned handle lives; see the [module docs](self). Must be
    /// called inside a tokio runtime.
    pub fn follow(
        &self,
        source: &(impl Source + ?Sized),
        format: impl Into<Option<Format>>,
    ) -> WatchHandle {
        let reader = Reader::new(source, format.into());
        let updates = source.watch();
        let status = updates.status_handle();
        let follower = Follower {
            live: self.clone(),
            reader,
            seen: {
                let current = self.load();
                current.content.map(|hash| (current.revision.clone(), hash))
            },
            failing: false,
        };
        WatchHandle::with_status(tokio::spawn(follower.run(updates, status.clone())), status)
    }
}

// === Reading rules from a source ===

/// Turns a source's entries into rule sets.
struct Reader {
    /// The source, for messages: `/etc/gray/rules.toml`, `etcd key /gray/rules`.
    name: String,
    format: Option<Format>,
}

// === impl Reader ===

impl Reader {
    fn new(source: &(impl Source + ?Sized), format: Option<Format>) -> Self {
        Reader {
            name: source.describe(),
            format,
        }
    }

    fn parse(&self, entry: &Entry) -> Result<RuleSet, RuleSourceError> {
        let format = self
            .format
            .or_else(|| Format::from_path(Path::new(&entry.key)))
            .ok_or_else(|| RuleSourceError::UnknownFormat(entry.key.clone()))?;
        let text = std::str::from_utf8(&entry.value)
            .map_err(|_| RuleSourceError::NotText(format!("{} ({})", entry.key, self.name)))?;
        if is_blank(text, format) {
            return Err(RuleSourceError::Empty {
                source: self.name.clone(),
                format,
            });
        }
        Ok(RuleSet::parse(text, format, &self.name)?)
    }
}

/// Whether a document holds nothing: blanks, and the comments and document markers of its
/// format. Such a rule set would parse as "no rules", and is refused: it is what a file
/// written in place looks like between its truncation and its first write (or after a
/// first write of its opening comments).
fn is_blank(text: &str, format: Format) -> bool {
    text.trim_start_matches('\u{feff}').lines().all(|line| {
        let line = line.trim();
        line.is_empty()
            || match format {
                Format::Toml => line.starts_with('#'),
                Format::Yaml => line.starts_with('#') || line == "---" || line == "...",
                _ => false,
            }
    })
}

/// The task behind [`LiveRules::follow`].
struct Follower {
    live: LiveRules,
    reader: Reader,
    /// The revision and content hash of the last version applied or rejected.
    seen: Option<(Revision, u64)>,
    /// Whether the source's failure was reported (once per outage).
    failing: bool,
}

// === impl Follower ===

impl Follower {
    async fn run(mut self, mut updates: gray_source::Updates, status: StatusHandle) {
        let mut changes = status.subscribe();
        loop {
            tokio::select! {
                update = updates.next() => match update {
                    Some(update) => self.on_update(update),
                    None => return,
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let status = changes.borrow_and_update().clone();
                    if status.connected {
                        self.failing = false;
                    } else if !self.failing
                        && let Some(error) = &status.last_error {
                            self.failing = true;
                            self.live.source_failed(error);
                        }
                }
            }
        }
    }

    fn on_update(&mut self, update: Update) {
        match update {
            Update::Reset(snapshot) => match snapshot.entries.as_slice() {
                [entry] => self.on_entry(entry),
                [] => self.live.source_failed(&format_args!(
                    "{} holds no rule set (the key does not exist); the rules in force stay",
                    self.reader.name
                )),
                many => self.live.reject(
                    &RuleSourceError::NotOneKey {
                        source: self.reader.name.clone(),
                        keys: many.iter().map(|e| e.key.clone()).collect(),
                    },
                    &snapshot.revision,
                ),
            },
            Update::Put(entry) => self.on_entry(&entry),
            Update::Delete { key, .. } => self.live.source_failed(&format_args!(
                "{key} was deleted from {}; the rules in force stay",
                self.reader.name
            )),
            other => tracing::debug!(target: "gray::edge", update = ?other,
                "update of a kind the rules do not follow ignored"),
        }
    }

    fn on_entry(&mut self, entry: &Entry) {
        let hash = content_hash(&entry.value);
        let version = (entry.revision.clone(), hash);
        if self.seen.as_ref() == Some(&version) {
            return;
        }
        self.seen = Some(version);
        match self.reader.parse(entry) {
            Ok(rules) => {
                self.live.put(rules, entry.revision.clone(), Some(hash));
            }
            Err(e) => self.live.reject(&e, &entry.revision),
        }
    }
}
