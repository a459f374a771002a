//! etcd keys and prefixes, watched (feature `etcd`).
//!
//! [`EtcdSource::key`] follows one key (a rule set); [`EtcdSource::prefix`] follows every
//! key under a prefix (the instances of every service). Both list first, at a store
//! revision, then watch from that revision + 1, so every change made after the listing is
//! delivered once, in order, and none twice.
//!
//! When the watch breaks (etcd restarts, the connection drops), the stream reconnects with
//! backoff and watches again from the last revision it delivered + 1, so the changes made
//! meanwhile arrive as if nothing had happened. When that revision has been compacted away,
//! it lists again and yields an [`Update::Reset`](crate::Update::Reset). Meanwhile the
//! consumer keeps what it has: the stream does not yield errors, it logs them (`tracing`,
//! target `gray::source`, WARN) and records them in the [`Status`](crate::Status).
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use gray_source::{Source, etcd::{EtcdConfig, EtcdSource}};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = EtcdConfig::new(["http://127.0.0.1:2379"]);
//! let source = EtcdSource::prefix(config, "/gray/");
//! let mut updates = source.watch();
//! while let Some(update) = updates.next().await {
//!     println!("{update:?}");
//! }
//! # Ok(())
//! # }
//! ```

mod watch;

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use etcd_client::{Client, ConnectOptions, GetOptions};
use gray_core::backoff::Backoff;

use crate::{Entry, Revision, Snapshot, Source, SourceError, Updates};

/// How to reach an etcd cluster: endpoints and client options, shared by every
/// [`EtcdSource`] and by self-registration.
#[derive(Clone)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    keep_alive: Option<(Duration, Duration)>,
    backoff: Backoff,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("keep_alive", &self.keep_alive)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl EtcdConfig {
    /// The cluster at `endpoints` (`http://127.0.0.1:2379`, or `127.0.0.1:2379`): 5 s to
    /// connect and per request, HTTP/2 keep-alive every 5 s with a 5 s timeout, reconnecting
    /// after 100 ms doubling to 5 s.
    pub fn new<E: AsRef<str>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            keep_alive: Some((Duration::from_secs(5), Duration::from_secs(5))),
            backoff: Backoff::default(),
        }
    }

    /// How long connecting may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long one request (a listing, a watch creation) may take before it is abandoned
    /// and retried.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// HTTP/2 keep-alive pings every `interval`, the connection dropped when one is not
    /// answered within `timeout`; `None` turns them off.
    pub fn with_keep_alive(mut self, keep_alive: Option<(Duration, Duration)>) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// Reconnects with `backoff`.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The time allowed per request.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The reconnection backoff.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Connects a client with these options.
    pub async fn connect(&self) -> Result<Client, SourceError> {
        if self.endpoints.is_empty() {
            return Err(SourceError::Config {
                field: "endpoints",
                message: "expected at least one etcd endpoint".into(),
            });
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout);
        if let Some((interval, timeout)) = self.keep_alive {
            options = options
                .with_keep_alive(interval, timeout)
                .with_keep_alive_while_idle(true);
        }
        let action = || format!("connect to {:?}", self.endpoints);
        match tokio::time::timeout(
            self.connect_timeout,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await
        {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(source)) => Err(SourceError::Etcd {
                action: action(),
                source,
            }),
            Err(_) => Err(SourceError::Timeout {
                action: action(),
                after: self.connect_timeout,
            }),
        }
    }

    /// Runs one request with the request timeout.
    pub(crate) async fn timed<T>(
        &self,
        action: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, SourceError> {
        match tokio::time::timeout(self.request_timeout, fut).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(source)) => Err(SourceError::Etcd {
                action: action(),
                source,
            }),
            Err(_) => Err(SourceError::Timeout {
                action: action(),
                after: self.request_timeout,
            }),
        }
    }
}

/// One etcd key, or every key under a prefix; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct EtcdSource {
    config: Arc<EtcdConfig>,
    key: String,
    prefix: bool,
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
    pub fn key_or_prefix(&self) -> &str {
        &self.key
    }

    /// Whether this source follows a prefix rather than one key.
    pub fn is_prefix(&self) -> bool {
        self.prefix
    }

    /// The cluster and its options.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    fn get_options(&self) -> Option<GetOptions> {
        self.prefix.then(|| GetOptions::new().with_prefix())
    }

    /// Lists the key or prefix: the entries, and the store revision they were read at.
    pub(crate) async fn list(&self, client: &mut Client) -> Result<(Vec<Entry>, i64), SourceError> {
        let response = self
            .config
            .timed(
                || format!("get {}", self.key),
                client.get(self.key.as_str(), self.get_options()),
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut entries: Vec<Entry> = response
            .kvs()
            .iter()
            .map(|kv| Entry {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                revision: Revision::Etcd {
                    mod_revision: kv.mod_revision(),
                },
            })
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok((entries, revision))
    }
}

impl Source for EtcdSource {
    fn describe(&self) -> String {
        let what = if self.prefix { "prefix" } else { "key" };
        format!("etcd {what} {} at {:?}", self.key, self.config.endpoints)
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(async move {
            let mut client = self.config.connect().await?;
            let (entries, revision) = self.list(&mut client).await?;
            Ok(Snapshot {
                entries,
                revision: Revision::Etcd {
                    mod_revision: revision,
                },
            })
        })
    }

    fn watch(&self) -> Updates {
        watch::start(self.clone())
    }
}
