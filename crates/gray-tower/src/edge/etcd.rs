//! A rule set in one etcd key (feature `etcd`).
//!
//! [`EtcdSource::watch`] connects, reads the key, then watches it from the revision it read,
//! so no change is missed. Every `put` is parsed and put in force, or rejected (the
//! previous rules stay); a `delete` changes nothing (a warning says so). When the
//! connection or the watch fails, it reconnects with exponential backoff (100 ms doubling
//! to 5 s by default) and reads the key again, so changes made while it was away are
//! picked up. The revision in force is [`Revision::Etcd`] with the key's `mod_revision`.
//!
//! ```no_run
//! use gray_core::rules::Format;
//! use gray_tower::edge::EtcdSource;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let source = EtcdSource::new(["http://127.0.0.1:2379"], "/gray/rules").with_format(Format::Json);
//! let live = source.live().await?;
//! let _watch = source.watch(live.clone());
//! assert!(live.status().generation >= 1);
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, WatchOptions};
use gray_core::rules::{Format, RuleSet};

use super::{
    error::SourceError,
    file::WatchHandle,
    live::{LiveRules, Revision},
};

/// A rule set stored in the value of one etcd key.
#[derive(Debug, Clone)]
pub struct EtcdSource {
    endpoints: Vec<String>,
    key: String,
    format: Format,
    backoff_min: Duration,
    backoff_max: Duration,
    timeout: Duration,
}

impl EtcdSource {
    /// The key `key` on the cluster at `endpoints`, holding JSON.
    pub fn new<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        key: impl Into<String>,
    ) -> Self {
        EtcdSource {
            endpoints: endpoints
                .into_iter()
                .map(|e| e.as_ref().to_owned())
                .collect(),
            key: key.into(),
            format: Format::Json,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            timeout: Duration::from_secs(5),
        }
    }

    /// The value's format (default JSON).
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Reconnection backoff: starts at `min`, doubles up to `max`.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min.max(Duration::from_millis(1));
        self.backoff_max = max.max(self.backoff_min);
        self
    }

    /// Connect and request timeout (default 5 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    async fn connect(&self) -> Result<Client, SourceError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_timeout(self.timeout);
        Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(SourceError::Etcd)
    }

    fn source_name(&self) -> String {
        format!("etcd key {}", self.key)
    }

    fn parse(&self, value: &[u8]) -> Result<RuleSet, SourceError> {
        let text =
            std::str::from_utf8(value).map_err(|_| SourceError::NotText(self.key.clone()))?;
        Ok(RuleSet::parse(text, self.format, &self.source_name())?)
    }

    /// Reads the key once: its rule set and revision, plus the store revision it was read at.
    async fn get(&self, client: &mut Client) -> Result<(Option<(Vec<u8>, i64)>, i64), SourceError> {
        let resp = client
            .get(self.key.as_bytes(), None)
            .await
            .map_err(SourceError::Etcd)?;
        let store_revision = resp.header().map_or(0, |h| h.revision());
        let kv = resp
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision()));
        Ok((kv, store_revision))
    }

    /// Connects and reads the key once.
    pub async fn load(&self) -> Result<(RuleSet, Revision), SourceError> {
        let mut client = self.connect().await?;
        match self.get(&mut client).await? {
            (Some((value, mod_revision)), _) => {
                Ok((self.parse(&value)?, Revision::Etcd { mod_revision }))
            }
            (None, _) => Err(SourceError::MissingKey(self.key.clone())),
        }
    }

    /// Reads the key once and puts it in force in new [`LiveRules`].
    pub async fn live(&self) -> Result<LiveRules, SourceError> {
        let (rules, revision) = self.load().await?;
        Ok(LiveRules::with_revision(rules, revision))
    }

    /// Watches the key in a background task and keeps `live` up to date while the returned
    /// handle lives. Must be called inside a tokio runtime.
    pub fn watch(&self, live: LiveRules) -> WatchHandle {
        let source = self.clone();
        WatchHandle::new(tokio::spawn(async move { source.run(live).await }))
    }

    async fn run(self, live: LiveRules) {
        let mut delay = self.backoff_min;
        loop {
            let err = self.session(&live, &mut delay).await;
            live.source_failed(&err);
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(self.backoff_max);
        }
    }

    /// Applies a value unless that revision is already in force.
    fn apply(&self, live: &LiveRules, value: &[u8], mod_revision: i64) {
        if let Revision::Etcd { mod_revision: now } = live.load().revision() {
            if *now == mod_revision {
                return;
            }
        }
        let revision = Revision::Etcd { mod_revision };
        match self.parse(value) {
            Ok(rules) => {
                live.replace(rules, revision);
            }
            Err(e) => live.reject(&e, &revision),
        }
    }

    /// One connection: read, then watch until something fails. Returns why it ended.
    async fn session(&self, live: &LiveRules, delay: &mut Duration) -> SourceError {
        let mut client = match self.connect().await {
            Ok(c) => c,
            Err(e) => return e,
        };
        let (kv, store_revision) = match self.get(&mut client).await {
            Ok(read) => read,
            Err(e) => return e,
        };
        match kv {
            Some((value, mod_revision)) => self.apply(live, &value, mod_revision),
            None => live.source_failed(&SourceError::MissingKey(self.key.clone())),
        }
        let options = WatchOptions::new().with_start_revision(store_revision + 1);
        let mut stream = match client.watch(self.key.as_bytes(), Some(options)).await {
            Ok(s) => s,
            Err(e) => return SourceError::Etcd(e),
        };
        // Connected, read and watching: the next failure starts the backoff afresh.
        *delay = self.backoff_min;
        loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    return SourceError::Etcd(etcd_client::Error::WatchError(
                        "watch stream ended".into(),
                    ));
                }
                Err(e) => return SourceError::Etcd(e),
            };
            if resp.canceled() {
                return SourceError::Etcd(etcd_client::Error::WatchError(format!(
                    "watch canceled (compact revision {})",
                    resp.compact_revision()
                )));
            }
            for event in resp.events() {
                let Some(kv) = event.kv() else { continue };
                match event.event_type() {
                    EventType::Put => self.apply(live, kv.value(), kv.mod_revision()),
                    EventType::Delete => live.source_failed(&format_args!(
                        "etcd key {:?} was deleted; the rules in force stay",
                        self.key
                    )),
                }
            }
        }
    }
}
