//! The watch loop of an [`EtcdSource`]: connect to one member, list, watch, resume on
//! another member, list again when what was handed out cannot be trusted.

use std::collections::{HashMap, VecDeque};

use etcd_client::{Client, ResponseHeader, WatchOptions, WatchResponse, WatchStream};
use futures_util::stream;
use tokio::time::Instant;

mod check;

use super::{
    EtcdSource, Listing,
    verify::{Identity, Reset, Seen},
};
use crate::{Entry, Revision, Snapshot, SourceError, StatusHandle, Update, Updates};

pub(super) fn start(source: EtcdSource) -> Updates {
    let status = StatusHandle::new();
    let watcher = Watcher {
        // The endpoint that answered last (a load, usually, just before): a watch that
        // started on the first endpoint would wait for its timeouts when it is down.
        next_endpoint: source.answered(),
        source,
        status: status.clone(),
        queue: VecDeque::new(),
        conn: None,
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
    /// Every key held, with its version and last change: a history that does not follow
    /// from it, or a listing at `revision` that does not show it, comes from another
    /// cluster (or one that lost its data).
    keys: HashMap<String, Seen>,
}

struct Conn {
    client: Client,
    endpoint: String,
    /// The endpoint's index in the configuration.
    index: usize,
    /// Whether the member answered a request on this connection.
    answered: bool,
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
        match self.advance(&mut conn).await {
            Ok(()) => {}
            // A member that drops a new plain-text connection at once may speak TLS only.
            Err(error) if !conn.answered => return Err(error.first_on_plain_text()),
            Err(error) => return Err(error),
        }
        self.conn = Some(conn);
        Ok(())
    }

    async fn connect(&mut self) -> Result<Conn, SourceError> {
        let endpoints = self.source.config.endpoints();
        let index = self.next_endpoint % endpoints.len().max(1);
        let Some(endpoint) = endpoints.get(index) else {
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
            index,
            answered: false,
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
            keys,
            header,
        } = self.source.list(&mut conn.client, &conn.endpoint).await?;
        self.answered(conn);
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
        self.held = Some(Held { revision, keys });
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

    /// Records that the member answered on this connection: the endpoint to start from
    /// next time.
    fn answered(&mut self, conn: &mut Conn) {
        if !conn.answered {
            conn.answered = true;
            self.source.set_answered(conn.index);
        }
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
                let expected = held.keys.get(&key).map_or(1, |seen| seen.version + 1);
                if kv.version() != expected {
                    return Err(format!(
                        "{key} at version {} at revision {}, where version {expected} was due",
                        kv.version(),
                        kv.mod_revision()
                    ));
                }
                held.keys.insert(key.clone(), Seen::of(kv));
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
