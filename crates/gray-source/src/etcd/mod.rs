//! etcd keys and prefixes, watched (feature `etcd`; TLS with `etcd-tls`).
//!
//! [`EtcdSource::key`] follows one key (a rule set); [`EtcdSource::prefix`] follows every
//! key under a prefix (the instances of every service). Both list first, at a store
//! revision, then watch from that revision + 1, so every change made after the listing is
//! delivered once, in order, and none twice. [`EtcdConfig`] says how to reach the cluster
//! (endpoints, timeouts, keep-alive, progress deadline, backoff, user and password, TLS);
//! it is also what a configuration file's `[etcd]` table deserializes into.
//!
//! A watch talks to **one member at a time**, starting with the first endpoint. When
//! anything fails it drops the connection, waits its backoff, and connects to the **next**
//! endpoint (round robin), where it resumes from the last revision it handed out + 1: the
//! changes made meanwhile arrive as if nothing had happened. The stream never yields an
//! error: failures are logged (`tracing`, target `gray::source`, WARN), counted in the
//! [`Status`](crate::Status) ([`Updates::status`]), and meanwhile
//! the consumer keeps what it has.
//!
//! # Faults, and how fast they heal
//!
//! Bounds are for the defaults (5 s connect and request timeouts, 5 s progress deadline,
//! keep-alive after 10 s of silence with a 5 s timeout while a stream is open, backoff
//! 100 ms doubling to 5 s between failed attempts) and a cluster where another member
//! answers.
//!
//! | fault | detected by | recovery | changes flow again |
//! |---|---|---|---|
//! | a member is killed or restarts, a connection is cut | the watch stream errors or ends | next endpoint after one backoff step; resume from the last revision + 1 | after ~100 ms (the first backoff step) |
//! | a member freezes (SIGSTOP, a hung host, a network black hole: nothing closes the connection) | no event and no answer to progress requests (asked every third of the deadline while idle) within the **progress deadline**; HTTP/2 keep-alive (10 s + 5 s) as a second guard | drop the connection, next endpoint, resume | within the progress deadline + one backoff step: ~5 s (< 10 s) |
//! | a request hangs (a frozen member at connect, a slow listing) | the request timeout | next endpoint after one backoff step | within 5 s + backoff |
//! | the whole cluster is down | connections refused | retried with backoff, capped at its max (5 s) | at most one backoff sleep after etcd is back (≤ 5 s); then at once: no backoff is slept after a successful reconnection |
//! | revisions compacted while away | the watch answers with a compact revision | list again, hand out an [`Update::Reset`](crate::Update::Reset) | one listing |
//! | the cluster restarted **without its data** (a member restored empty, a wrong data dir) or was **replaced** | before resuming on a new connection, a linearizable read shows a store revision below the one handed out; the cluster ID changes; a member's raft term goes back; any watch response carries a revision below the one handed out; the history does not follow from what was handed out (a key held is created again, a key not held changes or is deleted, a version is skipped) | list again, hand out an `Update::Reset` (the consumer diffs it: keys gone are deleted, none comes back); WARN with the old and new cluster ID and revision; [`Status::resets`](crate::Status::resets) + 1 | at reconnection, or at the first change that does not follow |
//! | wrong user or password, TLS mismatch, no permission | the login, handshake or request fails | [`Source::load`] fails at once with the reason; a watch logs WARN, records it in its status, and retries with backoff | when the operator fixes it |
//!
//! What cannot be detected: a cluster that lost its data and, before the watch reconnects,
//! got **more** revisions than were handed out, with the same cluster ID, no lower raft
//! term, and only keys the consumer does not hold. The watch then resumes in the middle of
//! the new history: it sees every later change, but not the keys created before, nor that
//! the keys it holds are gone, until one of them changes (which shows the history does not
//! follow). Rebuild a cluster with a new `--initial-cluster-token` (a new cluster ID) to
//! rule this out. Membership changes alone (a member added or removed) are not a reset and
//! are not reported.
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use gray_source::{Source, etcd::{EtcdConfig, EtcdSource}};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = EtcdConfig::new(["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"])
//!     .with_user("gray", "secret");
//! let source = EtcdSource::prefix(config, "/gray/");
//! let mut updates = source.watch();
//! while let Some(update) = updates.next().await {
//!     println!("{update:?} (cluster {:?})", updates.status().cluster_id);
//! }
//! # Ok(())
//! # }
//! ```

mod config;
mod tls;
mod watch;

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc};

use etcd_client::{Client, GetOptions, ResponseHeader};
use tonic::Code;

pub(crate) use self::config::OVER_TLS;
pub use self::{
    config::{DEFAULT_KEEP_ALIVE, DEFAULT_PROGRESS_DEADLINE, DEFAULT_TIMEOUT, EtcdConfig},
    tls::EtcdTls,
};
use crate::{Entry, Revision, Snapshot, Source, SourceError, Updates};

/// One etcd key, or every key under a prefix; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct EtcdSource {
    config: Arc<EtcdConfig>,
    key: String,
    prefix: bool,
}

/// A listing: the entries, each key's version, and the response header.
pub(crate) struct Listing {
    pub(crate) entries: Vec<Entry>,
    pub(crate) versions: HashMap<String, i64>,
    pub(crate) header: Option<ResponseHeader>,
}

impl EtcdSource {
    /// The single key `key`.
    pub fn key(config: EtcdConfig, key: impl Into<String>) -> Self {
        EtcdSource {
            config: Arc::new(config),
            key: key.into(),
            prefix: false,
        }
    }

    /// Every key that starts with `prefix` (give a trailing `/` to watch a folder).
    pub fn prefix(config: EtcdConfig, prefix: impl Into<String>) -> Self {
        EtcdSource {
            config: Arc::new(config),
            key: prefix.into(),
            prefix: true,
        }
    }

    /// The key, or the prefix.
    #[must_use]
    pub fn key_or_prefix(&self) -> &str {
        &self.key
    }

    /// Whether this source follows a prefix rather than one key.
    #[must_use]
    pub fn is_prefix(&self) -> bool {
        self.prefix
    }

    /// The cluster and its options.
    #[must_use]
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Lists the key or prefix: the entries, sorted by key, and the header (whose
    /// revision is the store revision they were read at).
    pub(crate) async fn list(
        &self,
        client: &mut Client,
        endpoint: &str,
    ) -> Result<Listing, SourceError> {
        let options = self.prefix.then(|| GetOptions::new().with_prefix());
        let mut response = self
            .config
            .timed(
                || format!("get {} at {endpoint}", self.key),
                client.get(self.key.as_str(), options),
            )
            .await?;
        let header = response.take_header();
        let mut versions = HashMap::with_capacity(response.kvs().len());
        let mut entries: Vec<Entry> = response
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                versions.insert(key.clone(), kv.version());
                Entry {
                    key,
                    value: kv.value().to_vec(),
                    revision: Revision::Etcd {
                        mod_revision: kv.mod_revision(),
                    },
                }
            })
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Listing {
            entries,
            versions,
            header,
        })
    }
}

/// Whether trying another endpoint could help: not when the request itself is refused
/// (credentials, permissions, a configuration error).
fn worth_another_endpoint(error: &SourceError) -> bool {
    match error {
        SourceError::Etcd {
            source: etcd_client::Error::GRpcStatus(status),
            ..
        } => !matches!(
            status.code(),
            Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated
        ),
        SourceError::Etcd {
            source: etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_),
            ..
        }
        | SourceError::Config { .. } => false,
        _ => true,
    }
}

impl Source for EtcdSource {
    fn describe(&self) -> String {
        let what = if self.prefix { "prefix" } else { "key" };
        format!("etcd {what} {}", self.key)
    }

    /// Lists the key or prefix through the first endpoint that answers (each one tried in
    /// turn, each bounded by the connect and request timeouts); fails at once when the
    /// request itself is refused (wrong credentials, no permission, TLS misconfigured).
    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(async move {
            let mut last = None;
            for endpoint in self.config.endpoints() {
                let attempt = async {
                    let mut client = self
                        .config
                        .connect_to(std::slice::from_ref(endpoint))
                        .await?;
                    self.list(&mut client, endpoint).await
                };
                match attempt.await {
                    Ok(listing) => {
                        let revision = listing.header.as_ref().map_or(0, ResponseHeader::revision);
                        return Ok(Snapshot {
                            entries: listing.entries,
                            revision: Revision::Etcd {
                                mod_revision: revision,
                            },
                        });
                    }
                    Err(error) if worth_another_endpoint(&error) => last = Some(error),
                    Err(error) => return Err(error),
                }
            }
            Err(last.unwrap_or_else(|| SourceError::Config {
                field: "endpoints",
                message: "expected at least one etcd endpoint".into(),
            }))
        })
    }

    fn watch(&self) -> Updates {
        watch::start(self.clone())
    }
}
