//! Live inputs for **gray**: the staining rules and the instance lists that change while a
//! service runs, read from polled files or watched etcd keys.
//!
//! A gray deployment changes two things at run time, without restarts: the *rules* that
//! stain requests at the edge (gray-tower's `LiveRules`) and the *instances* of every
//! service with their labels (gray-discovery's `Registry`). Both come from the same places,
//! a file or etcd, and both need the same care: read once at start, then follow every
//! change, survive restarts and outages, never lose or repeat a change, report how fresh
//! they are. This crate is that care, written once:
//!
//! - [`Source`]: what a place to read from offers: [`Source::load`] (read it all once) and
//!   [`Source::watch`] (a stream of [`Update`]s that starts with the whole content);
//! - [`file::FileSource`] (feature `file`, on by default): one file, polled, each version
//!   handed out once it has settled (a file written in place is never handed out
//!   half-written);
//! - `etcd::EtcdSource` (feature `etcd`): one etcd key or every key under a prefix, watched
//!   from the last revision seen, on one member at a time (the next one when it fails or
//!   falls silent), its keys checked at every reconnection, listed again when the watch
//!   cannot resume or the cluster lost its data; `etcd::EtcdConfig` holds the client options (timeouts, keep-alive, progress
//!   deadline, backoff, user and password, TLS) and deserializes from a config file;
//! - [`Status`]: how fresh a watch is (last contact, revision, cluster, endpoint,
//!   failures, resets, last error), for metrics and alerts;
//! - [`WatchHandle`]: the background task a consumer runs to follow a source, stopped when
//!   dropped, with the source's status.
//!
//! A place this crate does not read (a registry's HTTP API, a Kubernetes watch) is a
//! [`Source`] of your own: `load` reads it once into a [`Snapshot`], `watch` hands out
//! [`Update`]s through [`Updates::new`], reporting contacts and failures to its
//! [`StatusHandle`]; [`SourceError::other`] says why a read failed. `examples/extension`
//! implements one over a Consul-style HTTP catalogue.
//!
//! The consumers decide what the bytes mean: gray-tower parses a rule set, gray-discovery
//! parses instances. A consumer applies each [`Update`] in order: a [`Update::Reset`]
//! replaces everything it knew, a [`Update::Put`] adds or replaces one key, a
//! [`Update::Delete`] removes one.
//!
//! # Cargo features
//!
//! | feature | default | what | dependencies |
//! |---|---|---|---|
//! | `file` | yes | [`file::FileSource`] | tokio's `fs` |
//! | `etcd` | no | `etcd::EtcdSource` | `etcd-client` (building it needs `protoc` and the well-known protos) |
//! | `etcd-tls` | no | TLS to etcd (`etcd::EtcdTls`) | etcd-client's rustls on `ring` |
//!
//! # Example
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_source::{Source, Update, file::FileSource};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = std::env::temp_dir().join(format!("gray-source-doc-{}.json", std::process::id()));
//! std::fs::write(&path, r#"{"rules": []}"#)?;
//!
//! let source = FileSource::new(&path);
//! assert_eq!(source.load().await?.entries[0].value, br#"{"rules": []}"#);
//!
//! let mut updates = source.watch();
//! let Some(Update::Reset(first)) = updates.next().await else { unreachable!() };
//! assert_eq!(first.entries.len(), 1);
//! assert!(updates.status().last_contact.is_some());
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file;
mod handle;
mod status;
mod update;

use std::{fmt, future::Future, pin::Pin};

pub use self::{
    error::SourceError,
    handle::WatchHandle,
    status::{Status, StatusHandle},
    update::{Entry, Revision, Snapshot, Update, Updates},
};

/// A place that rules or instances are read from: a file, an etcd key, an etcd prefix.
///
/// Implementations do no parsing: they hand out bytes by key, with the revision they were
/// read at. Both methods are cheap to call more than once; every [`Source::watch`] is an
/// independent watch.
pub trait Source: fmt::Debug + Send + Sync + 'static {
    /// What this source reads, as error messages name it before a line number: a file's
    /// path (`/etc/gray/rules.toml`), `etcd key /gray/rules`, `etcd prefix /gray/`. (The
    /// etcd endpoint in use is in the watch's [`Status`].)
    fn describe(&self) -> String;

    /// Reads the whole source once. Fails with what went wrong (the file is missing, etcd
    /// is unreachable): this is what a program calls at start, where a failure should stop
    /// it.
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>>;

    /// Watches the source. The stream's first item is an [`Update::Reset`] with the whole
    /// content, as soon as it can be read; then every change, in order, none twice. It
    /// never ends and never yields an error: failures are logged (`tracing`, target
    /// `gray::source`), retried with backoff, and visible in [`Updates::status`]; meanwhile
    /// the consumer keeps what it has. After a failure from which the source cannot tell
    /// what changed (an etcd compaction, a reset cluster), the next item is a `Reset`
    /// again.
    ///
    /// The stream does its work when polled; a consumer polls it from a task of its own.
    /// Must be called within a tokio runtime with timers enabled.
    fn watch(&self) -> Updates;
}

impl<S: Source + ?Sized> Source for std::sync::Arc<S> {
    fn describe(&self) -> String {
        (**self).describe()
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        (**self).load()
    }

    fn watch(&self) -> Updates {
        (**self).watch()
    }
}
