//! The watch loop of an [`EtcdSource`]: connect to one member, list, watch, resume on
//! another member, list again when what was handed out cannot be trusted.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
};

use etcd_client::{Client, GetOptions, ResponseHeader, WatchOptions, WatchResponse, WatchStream};
use futures_util::stream;
use tokio::time::Instant;

use super::{EtcdSource, Listing};
use crate::{Entry, Revision, Snapshot, SourceError, StatusHandle, Update, Updates};

pub(super) fn start(source: EtcdSource) -> Updates {
    let status = StatusHandle::new();
    let watcher = Watcher {
        source,
        status: status.clone(),
        queue: VecDeque::new(),
        conn: None,
        next_endpoint: 0,
        held: None,
        identity: Identity::default(),
        failures: 0,
        handed: None,
    };
    Updates::new(
        stream::unfold(watcher, |mut watcher| async move {
            let update = watcher.next().await;
            Some((update, watcher))
        }),
        status,
    )
}

struct Watcher {
    source: EtcdSource,
    status: StatusHandle,
    /// Updates not handed out yet (empty whenever a step starts).
    queue: VecDeque<Update>,
    /// The connection to one member, while it works.
    conn: Option<Conn>,
    /// The endpoint to connect to next (an index into the endpoints).
    next_endpoint: usize,
    /// What the consumer holds; `None` before the first listing and whenever it must be
    /// listed again.
    held: Option<Held>,
    /// Which cluster, which members, as seen in the response headers.
    identity: Identity,
    /// Failed attempts since the last success.
    failures: u32,
    /// The revision of the last update handed out, to tell a listing that went back in
    /// time; forgotten once a reset has been reported.
    handed: Option<i64>,
}

/// What the consumer holds, as far as the watch can tell.
struct Held {
    /// The revision of the last update handed out.
    revision: i64,
    /// Every key held, with its version: a history that does not follow from it comes
    /// from another cluster (or one that lost its data).
    keys: HashMap<String, i64>,
}

struct Conn {
    client: Client,
    endpoint: String,
    /// Whether this connection checked that the cluster still holds what was handed out.
    checked: bool,
    watch: Option<Watch>,
}

struct Watch {
    stream: WatchStream,
    /// When the member last said anything on this watch.
    heard: Instant,
    /// When the last progress request was sent.
    asked: Option<Instant>,
}

/// The cluster ID and each member's raft term: neither changes in a cluster's life except
/// the term, which only grows.
#[derive(Default)]
struct Identity {
    cluster: Option<u64>,
    terms: HashMap<u64, u64>,
}

/// Why what was handed out cannot be trusted any more.
enum Reset {
    Cluster { old: u64, new: u64 },
    Term { member: u64, old: u64, new: u64 },
    Revision { old: i64, new: i64 },
    History(String),
}

// === impl Reset ===

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reset::Cluster { old, new } => {
                write!(f, "the cluster ID changed from {old:x} to {new:x}")
            }
            Reset::Term { member, old, new } => write!(
                f,
                "member {member:x} went back from raft term {old} to {new} (it restarted without its data)"
            ),
            Reset::Revision { old, new } => write!(
                f,
                "the store is at revision {new}, behind revision {old} already handed out (it lost its data)"
            ),
            Reset::History(what) => write!(f, "the history does not follow: {what}"),
        }
    }
}

// === impl Identity ===

impl Identity {
    /// Records a response header; says why the cluster cannot be the one seen before.
    fn observe(&mut self, header: &ResponseHeader) -> Option<Reset> {
        let mut reset = None;
        let cluster = header.cluster_id();
        if cluster == 0 {
            // Not filled in (a proxy in between): nothing to tell.
            return None;
        }
        match self.cluster {
            Some(old) if old != cluster => {
                reset = Some(Reset::Cluster { old, new: cluster });
                self.terms.clear();
            }
            _ => {}
        }
        self.cluster = Some(cluster);
        let (member, term) = (header.member_id(), header.raft_term());
        if let Some(old) = self.terms.insert(member, term) {
            if term < old && reset.is_none() {
                reset = Some(Reset::Term {
                    member,
                    old,
                    new: term,
                });
            }
        }
        reset
    }
}

// === impl Watcher ===

impl Watcher {
    async fn next(&mut self) -> Update {
        loop {
            if let Some(update) = self.queue.pop_front() {
                let revision = match &update {
                    Update::Reset(Snapshot { revision, .. })
                    | Update::Put(Entry { revision, .. })
                    | Update::Delete { revision, .. } => revision,
                };
                if let Revision::Etcd { mod_revision } = revision {
                    let mod_revision = *mod_revision;
                    self.handed = Some(mod_revision);
                    self.status.update(|s| s.revision = Some(mod_revision));
                }
                return update;
            }
            if let Err(error) = self.step().await {
                self.fail(&error);
                tokio::time::sleep(self.source.config.backoff().delay(self.failures)).await;
            }
        }
    }

    /// One step towards the next update: connect, list, check, watch or read the watch.
    /// A failure drops the connection.
    async fn step(&mut self) -> Result<(), SourceError> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        self.advance(&mut conn).await?;
        self.conn = Some(conn);
        Ok(())
    }

    async fn connect(&mut self) -> Result<Conn, SourceError> {
        let endpoints = self.source.config.endpoints();
        let Some(endpoint) = endpoints.get(self.next_endpoint % endpoints.len().max(1)) else {
            return Err(SourceError::Config {
                field: "endpoints",
                message: "expected at least one etcd endpoint".into(),
            });
        };
        let endpoint = endpoint.clone();
        let client = self
            .source
            .config
            .connect_to(std::slice::from_ref(&endpoint))
            .await?;
        self.status.update(|s| s.endpoint = Some(endpoint.clone()));
        Ok(Conn {
            client,
            endpoint,
            checked: false,
            watch: None,
        })
    }

    async fn advance(&mut self, conn: &mut Conn) -> Result<(), SourceError> {
        let Some(held) = &self.held else {
            return self.list(conn).await;
        };
        if !conn.checked {
            return self.check(conn, held.revision).await;
        }
        match &mut conn.watch {
            None => self.create_watch(conn, held.revision).await,
            Some(_) => self.read(conn).await,
        }
    }

    /// Lists the key or prefix and hands the whole of it out.
    async fn list(&mut self, conn: &mut Conn) -> Result<(), SourceError> {
        let Listing {
            entries,
            versions,
            header,
        } = self.source.list(&mut conn.client, &conn.endpoint).await?;
        let revision = header.as_ref().map_or(0, ResponseHeader::revision);
        if let Some(header) = &header {
            // Listing anyway: a changed cluster only needs saying.
            let reset = self.identity.observe(header).or_else(|| {
                let old = self.handed.filter(|old| revision < *old)?;
                Some(Reset::Revision { old, new: revision })
            });
            if let Some(reset) = reset {
                self.warn_reset(&reset, conn, revision);
                self.status.update(|s| s.resets += 1);
            }
            self.status.cluster(header.cluster_id());
        }
        tracing::debug!(target: "gray::source", key = %self.source.key, endpoint = %conn.endpoint,
            revision, entries = entries.len(), "etcd listed");
        self.held = Some(Held {
            revision,
            keys: versions,
        });
        conn.checked = true;
        self.queue.push_back(Update::Reset(Snapshot {
            entries,
            revision: Revision::Etcd {
                mod_revision: revision,
            },
        }));
        self.recovered(conn);
        Ok(())
    }

    /// On a new connection, before resuming: a linearizable read (so a member that lags
    /// behind catches up first) says whether the cluster still has every revision handed
    /// out. A cluster restarted without its data starts again from revision 1, and would
    /// accept a watch from our old revision as one from its future.
    async fn check(&mut self, conn: &mut Conn, held: i64) -> Result<(), SourceError> {
        let key = &self.source.key;
        let mut options = GetOptions::new().with_count_only();
        if self.source.prefix {
            options = options.with_prefix();
        }
        let response = self
            .source
            .config
            .timed(
                || format!("get {key} at {}", conn.endpoint),
                conn.client.get(key.as_str(), Some(options)),
            )
            .await?;
        conn.checked = true;
        // A contact, but not yet followed: `connected` waits for the watch.
        self.status
            .update(|s| s.last_contact = Some(std::time::Instant::now()));
        if let Some(header) = response.header() {
            self.status.cluster(header.cluster_id());
            let reset = self.identity.observe(header).or_else(|| {
                (header.revision() < held).then_some(Reset::Revision {
                    old: held,
                    new: header.revision(),
                })
            });
            if let Some(reset) = reset {
                self.reset(&reset, conn, header.revision());
            }
        }
        Ok(())
    }

    async fn create_watch(&mut self, conn: &mut Conn, held: i64) -> Result<(), SourceError> {
        let start = held + 1;
        let mut options = WatchOptions::new().with_start_revision(start);
        if self.source.prefix {
            options = options.with_prefix();
        }
        let key = &self.source.key;
        let stream = self
            .source
            .config
            .timed(
                || format!("watch {key} from revision {start} at {}", conn.endpoint),
                conn.client.watch(key.as_str(), Some(options)),
            )
            .await?;
        conn.watch = Some(Watch {
            stream,
            heard: Instant::now(),
            asked: None,
        });
        // Connected and watching: the next change arrives as soon as etcd sends it.
        self.recovered(conn);
        Ok(())
    }

    /// Reads the watch until the next response, asking for progress while it is idle and
    /// giving up on a member that stays silent past the progress deadline.
    async fn read(&mut self, conn: &mut Conn) -> Result<(), SourceError> {
        let Some(watch) = conn.watch.as_mut() else {
            return Ok(());
        };
        let deadline = self.source.config.progress_deadline();
        let message = loop {
            let Some(deadline) = deadline else {
                break watch.stream.message().await;
            };
            let silent_at = watch.heard + deadline;
            let ask_at = watch.asked.unwrap_or(watch.heard).max(watch.heard) + deadline / 3;
            if Instant::now() >= silent_at {
                return Err(SourceError::Timeout {
                    action: format!(
                        "watch {} at {} (no event and no answer to progress requests)",
                        self.source.key, conn.endpoint
                    ),
                    after: deadline,
                });
            }
            tokio::select! {
                message = watch.stream.message() => break message,
                () = tokio::time::sleep_until(ask_at.min(silent_at)) => {
                    if Instant::now() >= ask_at {
                        // A full request channel (a member that reads nothing) is waited
                        // for no longer than the deadline.
                        let asked = tokio::time::timeout_at(silent_at, watch.stream.request_progress()).await;
                        if let Ok(Err(source)) = asked {
                            return Err(SourceError::Etcd {
                                action: format!("watch {} at {}", self.source.key, conn.endpoint),
                                source,
                            });
                        }
                        watch.asked = Some(Instant::now());
                    }
                }
            }
        };
        match message {
            Ok(Some(response)) => {
                watch.heard = Instant::now();
                self.on_response(conn, response)
            }
            Ok(None) => Err(SourceError::Etcd {
                action: format!("watch {} at {}", self.source.key, conn.endpoint),
                source: etcd_client::Error::WatchError("the watch stream ended".into()),
            }),
            Err(source) => Err(SourceError::Etcd {
                action: format!("watch {} at {}", self.source.key, conn.endpoint),
                source,
            }),
        }
    }

    fn on_response(&mut self, conn: &mut Conn, response: WatchResponse) -> Result<(), SourceError> {
        self.status.contact(None);
        let Some(held) = self.held.as_ref().map(|h| h.revision) else {
            return Ok(());
        };
        if let Some(header) = response.header() {
            self.status.cluster(header.cluster_id());
            if let Some(reset) = self.identity.observe(header) {
                self.reset(&reset, conn, header.revision());
                return Ok(());
            }
        }
        if response.compact_revision() > 0 {
            tracing::info!(target: "gray::source", key = %self.source.key, revision = held,
                compacted = response.compact_revision(),
                "etcd revision compacted; listing again");
            conn.watch = None;
            self.held = None;
            return Ok(());
        }
        if response.canceled() {
            conn.watch = None;
            return Err(SourceError::Etcd {
                action: format!("watch {} at {}", self.source.key, conn.endpoint),
                source: etcd_client::Error::WatchError(format!(
                    "etcd canceled the watch: {}",
                    response.cancel_reason()
                )),
            });
        }
        // The member answered a linearizable read on this connection before the watch was
        // created, so it cannot be lagging: a lower revision is a loss. (A response about
        // a compaction or a cancellation may carry no revision, 0: handled above.)
        let revision = response.header().map_or(0, ResponseHeader::revision);
        if revision > 0 && revision < held {
            let reset = Reset::Revision {
                old: held,
                new: revision,
            };
            self.reset(&reset, conn, revision);
            return Ok(());
        }
        if let Err(what) = self.apply(response.events()) {
            self.queue.clear();
            let revision = response.header().map_or(0, ResponseHeader::revision);
            self.reset(&Reset::History(what), conn, revision);
        }
        Ok(())
    }

    /// Queues the events that follow what is held; an event that cannot follow from it
    /// (the creation of a key held, a change or deletion of a key not held) is an error.
    fn apply(&mut self, events: &[etcd_client::Event]) -> Result<(), String> {
        let Some(held) = self.held.as_mut() else {
            return Ok(());
        };
        for event in events {
            let Some(kv) = event.kv() else { continue };
            // Every event of a later response is newer than what is held; this only
            // guards against a misbehaving server.
            if kv.mod_revision() <= held.revision {
                continue;
            }
            held.revision = kv.mod_revision();
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let revision = Revision::Etcd {
                mod_revision: kv.mod_revision(),
            };
            // A delete (or lease expiry) event carries the key with version 0; a put, the
            // key's version from 1. Reading it so avoids `Event::event_type`, which panics on
            // an event type it does not know.
            if kv.version() == 0 {
                if held.keys.remove(&key).is_none() {
                    return Err(format!(
                        "{key} deleted at revision {}, but it did not exist",
                        kv.mod_revision()
                    ));
                }
                self.queue.push_back(Update::Delete { key, revision });
            } else {
                let expected = held.keys.get(&key).map_or(1, |version| version + 1);
                if kv.version() != expected {
                    return Err(format!(
                        "{key} at version {} at revision {}, where version {expected} was due",
                        kv.version(),
                        kv.mod_revision()
                    ));
                }
                held.keys.insert(key.clone(), kv.version());
                self.queue.push_back(Update::Put(Entry {
                    key,
                    value: kv.value().to_vec(),
                    revision,
                }));
            }
        }
        Ok(())
    }

    /// What was handed out cannot be trusted: list again (on this connection) and hand
    /// out the whole, which the consumer diffs against what it has.
    fn reset(&mut self, reset: &Reset, conn: &mut Conn, new_revision: i64) {
        self.warn_reset(reset, conn, new_revision);
        self.status.update(|s| s.resets += 1);
        self.held = None;
        self.handed = None;
        conn.watch = None;
    }

    fn warn_reset(&self, reset: &Reset, conn: &Conn, new_revision: i64) {
        let old_revision = self.held.as_ref().map(|h| h.revision).or(self.handed);
        let old_cluster = match reset {
            Reset::Cluster { old, .. } => Some(*old),
            _ => self.identity.cluster,
        };
        tracing::warn!(target: "gray::source", key = %self.source.key, endpoint = %conn.endpoint,
            old_cluster_id = ?old_cluster.map(|c| format!("{c:x}")),
            new_cluster_id = ?self.identity.cluster.map(|c| format!("{c:x}")),
            old_revision, new_revision, %reset,
            "etcd cluster changed or lost its data; listing again");
    }

    fn recovered(&mut self, conn: &Conn) {
        if self.failures > 0 {
            tracing::info!(target: "gray::source", key = %self.source.key,
                revision = self.held.as_ref().map(|h| h.revision), endpoint = %conn.endpoint,
                "etcd reachable again; following changes");
        }
        self.failures = 0;
        self.status.contact(None);
    }

    fn fail(&mut self, error: &SourceError) {
        self.failures = self.failures.saturating_add(1);
        self.status.failure(error);
        // The connection is gone (`step` dropped it); the next attempt goes to the next
        // member, which is most likely fine when this one is frozen, cut off or down.
        self.conn = None;
        self.next_endpoint = self.next_endpoint.wrapping_add(1);
        tracing::warn!(target: "gray::source", key = %self.source.key, %error,
            failures = self.failures, revision = self.held.as_ref().map(|h| h.revision),
            "etcd unavailable; what it held stays in force");
    }
}
