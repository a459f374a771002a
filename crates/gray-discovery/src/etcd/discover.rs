use std::{
    collections::VecDeque,
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use etcd_client::{GetOptions, KeyValue, WatchOptions, WatchResponse, WatchStream};
use futures_core::Stream;
use futures_util::stream::{self, BoxStream, StreamExt};
use tower::discover::Change;

use super::EtcdRegistry;
use crate::{Error, Instance, InstanceId, InstanceSet, Record};

/// The discover stream of one service registered in etcd; see the [module docs](super).
pub struct EtcdDiscover {
    key_prefix: String,
    inner: BoxStream<'static, Result<Change<InstanceId, Instance>, Error>>,
}

impl fmt::Debug for EtcdDiscover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdDiscover")
            .field("key_prefix", &self.key_prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdDiscover {
    pub(super) fn new(registry: EtcdRegistry, service: &str) -> Self {
        let key_prefix = format!("{}/{service}/", registry.prefix);
        let state = State {
            registry,
            key_prefix: key_prefix.clone(),
            set: InstanceSet::new(),
            queue: VecDeque::new(),
            revision: 0,
            listed: false,
            watch: None,
            failures: 0,
        };
        EtcdDiscover {
            key_prefix,
            inner: stream::unfold(state, State::next).boxed(),
        }
    }
}

impl Stream for EtcdDiscover {
    type Item = Result<Change<InstanceId, Instance>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

struct State {
    registry: EtcdRegistry,
    /// `<prefix>/<service>/`.
    key_prefix: String,
    /// What the stream has yielded so far, as a set.
    set: InstanceSet,
    queue: VecDeque<Change<InstanceId, Instance>>,
    /// The last revision whose changes are in `set`.
    revision: i64,
    /// Whether `set` reflects a list (false at first and after a compaction).
    listed: bool,
    watch: Option<WatchStream>,
    /// Failed attempts since the last success.
    failures: u32,
}

type Step = Option<(Result<Change<InstanceId, Instance>, Error>, State)>;

impl State {
    async fn next(mut self) -> Step {
        loop {
            if let Some(change) = self.queue.pop_front() {
                return Some((Ok(change), self));
            }
            if self.failures > 0 {
                tokio::time::sleep(self.registry.backoff.delay(self.failures)).await;
            }
            if !self.listed {
                if let Err(error) = self.list().await {
                    self.fail(&error);
                }
                continue;
            }
            let Some(watch) = self.watch.as_mut() else {
                if let Err(error) = self.start_watch().await {
                    self.fail(&error);
                }
                continue;
            };
            match watch.message().await {
                Ok(Some(response)) => self.on_response(response),
                Ok(None) => {
                    self.watch = None;
                    self.failures += 1;
                    tracing::warn!(prefix = %self.key_prefix, revision = self.revision,
                        "etcd watch closed; watching again from the last revision");
                }
                Err(error) => {
                    self.watch = None;
                    self.failures += 1;
                    tracing::warn!(prefix = %self.key_prefix, revision = self.revision, %error,
                        "etcd watch broke; watching again from the last revision");
                }
            }
        }
    }

    fn fail(&mut self, error: &Error) {
        self.failures = self.failures.saturating_add(1);
        tracing::warn!(prefix = %self.key_prefix, %error, failures = self.failures,
            "etcd unavailable; serving the last known instances");
    }

    /// Lists the prefix and queues the difference from what was yielded so far.
    async fn list(&mut self) -> Result<(), Error> {
        let mut client = self.registry.client.clone();
        let prefix = &self.key_prefix;
        let response = self
            .registry
            .timed(
                || format!("list {prefix}"),
                client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let instances: Vec<Instance> = response
            .kvs()
            .iter()
            .filter_map(|kv| self.decode(kv).ok().flatten())
            .collect();
        let changes = self.set.replace(instances);
        tracing::debug!(prefix = %self.key_prefix, revision, changes = changes.len(), "etcd listed");
        self.queue.extend(changes);
        self.revision = revision;
        self.listed = true;
        self.failures = 0;
        Ok(())
    }

    async fn start_watch(&mut self) -> Result<(), Error> {
        let mut client = self.registry.client.clone();
        let prefix = &self.key_prefix;
        let start = self.revision + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(start);
        let watch = self
            .registry
            .timed(
                || format!("watch {prefix} from revision {start}"),
                client.watch(prefix.as_str(), Some(options)),
            )
            .await?;
        self.watch = Some(watch);
        Ok(())
    }

    fn on_response(&mut self, response: WatchResponse) {
        if response.compact_revision() > 0 {
            tracing::info!(prefix = %self.key_prefix, revision = self.revision,
                compacted = response.compact_revision(),
                "etcd revision compacted; listing again");
            self.watch = None;
            self.listed = false;
            return;
        }
        if response.canceled() {
            self.watch = None;
            self.failures += 1;
            tracing::warn!(prefix = %self.key_prefix, reason = response.cancel_reason(),
                "etcd canceled the watch; watching again from the last revision");
            return;
        }
        if response.created() {
            self.failures = 0;
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
            // A delete (or lease expiry) event carries the key with version 0; a put, the
            // key's version from 1. Reading it so avoids `Event::event_type`, which panics on
            // an event type it does not know.
            let change = if kv.version() == 0 {
                self.id_of(kv).and_then(|id| self.set.remove(id.as_str()))
            } else {
                match self.decode(kv) {
                    Ok(Some(instance)) => self.set.insert(instance),
                    Ok(None) => None,
                    Err(id) => self.set.remove(id.as_str()),
                }
            };
            self.queue.extend(change);
        }
    }

    /// The instance id a key names, or `None` (logged) for keys that do not name one.
    fn id_of(&self, kv: &KeyValue) -> Option<InstanceId> {
        let rest = kv.key().strip_prefix(self.key_prefix.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok();
        match rest.map(InstanceId::new) {
            Some(Ok(id)) => Some(id),
            Some(Err(error)) => {
                tracing::debug!(key = %String::from_utf8_lossy(kv.key()), %error,
                    "etcd key ignored: not <prefix>/<service>/<instance-id>");
                None
            }
            None => None,
        }
    }

    /// The instance a key/value holds: `Ok(None)` for keys that name no instance,
    /// `Err(id)` (logged) for an instance key with a malformed value.
    fn decode(&self, kv: &KeyValue) -> Result<Option<Instance>, InstanceId> {
        let Some(id) = self.id_of(kv) else {
            return Ok(None);
        };
        match serde_json::from_slice::<Record>(kv.value()) {
            Ok(record) => Ok(Some(record.into_instance(id))),
            Err(error) => {
                tracing::warn!(
                    key = %String::from_utf8_lossy(kv.key()),
                    revision = kv.mod_revision(),
                    %error,
                    "etcd value skipped: expected {{\"address\": \"host:port\", \"labels\": {{..}}}}"
                );
                Err(id)
            }
        }
    }
}
