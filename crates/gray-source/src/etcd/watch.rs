//! The watch loop of an [`EtcdSource`]: list, watch, resume, re-list.

use std::collections::VecDeque;

use etcd_client::{Client, WatchOptions, WatchResponse, WatchStream};
use futures_util::stream;

use super::EtcdSource;
use crate::{Entry, Revision, Snapshot, SourceError, StatusHandle, Update, Updates};

pub(super) fn start(source: EtcdSource) -> Updates {
    let status = StatusHandle::new();
    let state = State {
        source,
        client: None,
        queue: VecDeque::new(),
        revision: 0,
        listed: false,
        watch: None,
        failures: 0,
        status: status.clone(),
    };
    Updates::new(
        stream::unfold(state, |mut state| async move {
            let update = state.next().await;
            Some((update, state))
        }),
        status,
    )
}

struct State {
    source: EtcdSource,
    client: Option<Client>,
    queue: VecDeque<Update>,
    /// The last revision whose changes were handed out.
    revision: i64,
    /// Whether the consumer holds a listing (false at first and after a compaction).
    listed: bool,
    watch: Option<WatchStream>,
    /// Failed attempts since the last success.
    failures: u32,
    status: StatusHandle,
}

impl State {
    async fn next(&mut self) -> Update {
        loop {
            if let Some(update) = self.queue.pop_front() {
                return update;
            }
            if let Err(error) = self.step().await {
                self.fail(&error);
                tokio::time::sleep(self.source.config.backoff().delay(self.failures)).await;
            }
        }
    }

    /// One step towards the next update: connect, list, watch or read the watch.
    async fn step(&mut self) -> Result<(), SourceError> {
        let client = match &mut self.client {
            Some(client) => client,
            None => self.client.insert(self.source.config.connect().await?),
        };
        if !self.listed {
            let (entries, revision) = self.source.list(client).await?;
            tracing::debug!(target: "gray::source", key = %self.source.key, revision,
                entries = entries.len(), "etcd listed");
            self.revision = revision;
            self.listed = true;
            self.recovered(Some(revision));
            self.queue.push_back(Update::Reset(Snapshot {
                entries,
                revision: Revision::Etcd {
                    mod_revision: revision,
                },
            }));
            return Ok(());
        }
        let Some(watch) = self.watch.as_mut() else {
            let start = self.revision + 1;
            let mut options = WatchOptions::new().with_start_revision(start);
            if self.source.prefix {
                options = options.with_prefix();
            }
            let key = &self.source.key;
            let watch = self
                .source
                .config
                .timed(
                    || format!("watch {key} from revision {start}"),
                    client.watch(key.as_str(), Some(options)),
                )
                .await?;
            self.watch = Some(watch);
            // Connected and watching: the next change arrives as soon as etcd sends it.
            self.recovered(None);
            return Ok(());
        };
        match watch.message().await {
            Ok(Some(response)) => {
                self.on_response(response);
                Ok(())
            }
            Ok(None) => {
                self.watch = None;
                Err(SourceError::Etcd {
                    action: format!("watch {}", self.source.key),
                    source: etcd_client::Error::WatchError("the watch stream ended".into()),
                })
            }
            Err(source) => {
                self.watch = None;
                Err(SourceError::Etcd {
                    action: format!("watch {}", self.source.key),
                    source,
                })
            }
        }
    }

    fn recovered(&mut self, revision: Option<i64>) {
        if self.failures > 0 {
            tracing::info!(target: "gray::source", key = %self.source.key, revision = self.revision,
                "etcd reachable again; following changes");
        }
        self.failures = 0;
        self.status.contact(revision);
    }

    fn fail(&mut self, error: &SourceError) {
        self.failures = self.failures.saturating_add(1);
        self.status.failure(error);
        // A broken connection is made anew: the client may be bound to a dead member.
        if self.watch.is_none() {
            self.client = None;
        }
        tracing::warn!(target: "gray::source", key = %self.source.key, %error,
            failures = self.failures, revision = self.revision,
            "etcd unavailable; what it held stays in force");
    }

    fn on_response(&mut self, response: WatchResponse) {
        let revision = response.header().map(|h| h.revision());
        self.status.contact(None);
        if response.compact_revision() > 0 {
            tracing::info!(target: "gray::source", key = %self.source.key, revision = self.revision,
                compacted = response.compact_revision(),
                "etcd revision compacted; listing again");
            self.watch = None;
            self.listed = false;
            return;
        }
        if response.canceled() {
            tracing::warn!(target: "gray::source", key = %self.source.key,
                reason = response.cancel_reason(),
                "etcd canceled the watch; watching again from the last revision");
            self.watch = None;
            return;
        }
        // A revision's events all come in one response, so every event of a later response
        // is newer than `seen`; this guard only protects against a misbehaving server.
        let seen = self.revision;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if kv.mod_revision() <= seen {
                continue;
            }
            self.revision = self.revision.max(kv.mod_revision());
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let revision = Revision::Etcd {
                mod_revision: kv.mod_revision(),
            };
            // A delete (or lease expiry) event carries the key with version 0; a put, the
            // key's version from 1. Reading it so avoids `Event::event_type`, which panics on
            // an event type it does not know.
            self.queue.push_back(if kv.version() == 0 {
                Update::Delete { key, revision }
            } else {
                Update::Put(Entry {
                    key,
                    value: kv.value().to_vec(),
                    revision,
                })
            });
        }
        if let Some(revision) = revision {
            self.status
                .update(|s| s.revision = Some(revision.max(self.revision)));
        }
    }
}
