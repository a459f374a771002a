//! What a source hands to its consumer.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
    time::SystemTime,
};

use futures_core::Stream;

use crate::status::{Status, StatusHandle};

/// Where a version of a rule set or an instance came from.
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
        /// [`content_hash`](gray_core::hash::content_hash) of the file's bytes.
        hash: u64,
    },
    /// Read from etcd.
    Etcd {
        /// The key's `mod_revision` (for a whole listing: the store revision it was read at).
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

/// One key and its value: a whole file (the key is its path), or one etcd key.
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key: the file's path, or the etcd key (as UTF-8, lossily).
    pub key: String,
    /// The bytes.
    pub value: Vec<u8>,
    /// The version these bytes are.
    pub revision: Revision,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("len", &self.value.len())
            .field("revision", &self.revision)
            .finish()
    }
}

/// The whole content of a source at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Every key, sorted by key.
    pub entries: Vec<Entry>,
    /// The revision of the whole: the file's, or the etcd store revision it was listed at.
    pub revision: Revision,
}

/// One change of a source, in the order the source saw them.
///
/// Non-exhaustive: a consumer matches the kinds it knows and ignores (or logs) the others.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Update {
    /// The whole content: every key not listed is gone. The first update of every watch,
    /// every change of a file, and an etcd re-list (after a compaction or a reset cluster).
    Reset(Snapshot),
    /// A key was created or changed.
    Put(Entry),
    /// A key was deleted (or its lease expired).
    Delete {
        /// The key.
        key: String,
        /// The revision of the deletion.
        revision: Revision,
    },
}

/// The stream of [`Update`]s of one watch, and its [`Status`]; see [`Source::watch`].
///
/// [`Source::watch`]: crate::Source::watch
pub struct Updates {
    inner: Pin<Box<dyn Stream<Item = Update> + Send>>,
    status: StatusHandle,
}

impl fmt::Debug for Updates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Updates")
            .field("status", &self.status.get())
            .finish_non_exhaustive()
    }
}

impl Updates {
    /// Wraps a stream of updates and the handle it reports its status to (for
    /// implementations of [`Source`](crate::Source)).
    pub fn new(stream: impl Stream<Item = Update> + Send + 'static, status: StatusHandle) -> Self {
        Updates {
            inner: Box::pin(stream),
            status,
        }
    }

    /// How fresh this watch is now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// A handle that reads the status from elsewhere (a metrics endpoint).
    #[must_use]
    pub fn status_handle(&self) -> StatusHandle {
        self.status.clone()
    }
}

impl Stream for Updates {
    type Item = Update;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Update>> {
        self.inner.as_mut().poll_next(cx)
    }
}
