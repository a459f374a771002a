//! [`EtcdStore`]: the rollouts of several gateways in one etcd (feature `etcd`; the
//! gateway uses it when its configuration has an `[etcd]` table).
//!
//! | key | value | written by |
//! |---|---|---|
//! | `<prefix>/rollouts/<service>/state` | the rollout's [`State`] (JSON); its `mod_revision` is the [`Stored::version`] | the leader's transitions; any gateway's commands and aborts |
//! | `<prefix>/rollouts/<service>/leader` | the id of the gateway that leads, under its lease | the election |
//! | `<prefix>/rollouts/<service>/reports/<gateway-id>` | that gateway's cumulative [`Report`] (JSON), under its lease | every gateway, once a look |
//!
//! `<prefix>` is the `[etcd]` table's, without its trailing `/` (instances live under
//! `<prefix>/<service>/<id>`; discovery ignores keys nested deeper, as these are).
//!
//! - **One lease per gateway**, `[rollouts] lease_ttl_ms` (default 5 s, whole seconds),
//!   renewed every third of it. The leader key and the reports live under it: a gateway
//!   that dies leaves no key behind once its lease expires; one shut down revokes it.
//! - **The election** is a transaction on the leader key: create it under this gateway's
//!   lease if it does not exist, else read it. Every gateway tries every third of the TTL,
//!   so when the leader dies another leads within the TTL + a third of it (+ etcd's
//!   delay in expiring a lease, up to 500 ms). The leader's
//!   tenure is the key's `create_revision`.
//! - **Fencing**: a save compares the state key's `mod_revision` with the one the writer
//!   read (`create_revision` 0 for the first save). A save fenced by [`Fence::Leader`]
//!   also compares the leader key's `create_revision` with this gateway's tenure, so a
//!   deposed leader's write fails. A save that loses reads what is there, for the caller
//!   to adopt.
//! - **Contact**: the last answer from etcd (a lease renewal, a request, a watch event or
//!   an answer to a watch's progress request), for the controller's rule that a gateway
//!   cut off holds its weight for `[rollouts] partition_hold_ms`, then drops it to 0.
//! - **The watch** of each state key is gray-source's [`EtcdSource::key`]: resumed
//!   after a failure, listed again after a compaction, a frozen member left within the
//!   progress deadline.
//!
//! ```
//! use std::time::Duration;
//! use gray_gateway::rollout::{etcd::EtcdStore, store::{Fence, RolloutStore, Saved}};
//! use gray_rollout::{Rollout, RolloutConfig};
//! use gray_tower::edge::EtcdConfig;
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! # let etcd = gray_test_support::etcd::Etcd::start().await;
//! # let endpoint = etcd.endpoint();
//! let config = EtcdConfig::new([endpoint]);
//! let ttl = Duration::from_secs(2);
//! let (a, b) = (
//!     EtcdStore::start(config.clone(), "/gray", ttl).await?,
//!     EtcdStore::start(config, "/gray", ttl).await?,
//! );
//! assert_eq!(a.load("orders").await?, None); // a takes part in the election ...
//! while !a.is_leader("orders") {
//!     tokio::time::sleep(Duration::from_millis(50)).await; // ... and wins it (bounded: the TTL)
//! }
//! let mut watch = b.watch("orders"); // b follows the state
//!
//! let mut rollout = Rollout::new(RolloutConfig::new("canary"))?;
//! rollout.start(Duration::from_secs(1))?;
//! let Saved::Won(version) = a.save("orders", rollout.state(), None, Fence::Leader).await? else {
//!     panic!("the leader's first save wins");
//! };
//! // b does not lead: its fenced save loses, and says what is stored
//! let lost = b.save("orders", rollout.state(), Some(version), Fence::Leader).await?;
//! assert!(matches!(lost, Saved::Lost(Some(s)) if s.version == version));
//! // b sees the state a wrote
//! let seen = watch.wait_for(|s| s.is_some()).await?.clone().unwrap();
//! assert_eq!((seen.version, seen.state.weight), (version, 1.0));
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! # }).unwrap();
//! ```

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::{StreamExt, future::BoxFuture};
use gray_rollout::{Report, State};
use gray_source::{Revision, Source, StatusHandle, Update};
use gray_tower::edge::{EtcdConfig, EtcdSource};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};

use super::store::{Contact, Fence, RolloutStore, Saved, StoreError, Stored};

/// The rollouts of several gateways in one etcd; see the [module docs](self).
#[derive(Debug)]
pub struct EtcdStore {
    inner: Arc<Inner>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    config: EtcdConfig,
    /// `<prefix>/rollouts/`.
    root: String,
    /// This gateway's id: its reports' key, the leader key's value.
    id: String,
    ttl_secs: i64,
    client: Mutex<Option<Client>>,
    /// This gateway's lease (0: none now) and when etcd last renewed it.
    lease: Mutex<(i64, Option<Instant>)>,
    services: Mutex<BTreeMap<String, Service>>,
    contact: Mutex<Option<Instant>>,
}

#[derive(Debug)]
struct Service {
    /// This gateway's tenure: the leader key's `create_revision`, while it leads.
    tenure: Option<i64>,
    state: watch::Sender<Option<Stored>>,
    status: StatusHandle,
    follow: JoinHandle<()>,
}

/// A store error naming what failed.
fn failed(what: impl std::fmt::Display, e: impl std::fmt::Display) -> StoreError {
    format!("etcd: {what}: {e}").into()
}

// === impl EtcdStore ===

impl EtcdStore {
    /// Connects to etcd with `config`, takes a lease of `lease_ttl` (rounded up to whole
    /// seconds, at least 1) and keeps it alive; rollouts live under `<prefix>/rollouts/`.
    pub async fn start(
        config: EtcdConfig,
        prefix: &str,
        lease_ttl: Duration,
    ) -> Result<Arc<EtcdStore>, StoreError> {
        let ttl_secs = i64::try_from(lease_ttl.as_millis().div_ceil(1000).max(1)).unwrap_or(60);
        let inner = Arc::new(Inner {
            root: format!("{}/rollouts/", prefix.trim_end_matches('/')),
            id: format!(
                "{}-{:016x}",
                std::process::id(),
                gray_core::rand::random_u64()
            ),
            ttl_secs,
            client: Mutex::default(),
            lease: Mutex::default(),
            services: Mutex::default(),
            contact: Mutex::default(),
            config,
        });
        inner.grant().await?;
        let (stop, stopped) = oneshot::channel();
        let keeper = tokio::spawn(inner.clone().keep(stopped));
        Ok(Arc::new(EtcdStore {
            inner,
            stop: Mutex::new(Some(stop)),
            keeper: Mutex::new(Some(keeper)),
        }))
    }

    /// This gateway's id in etcd (its reports' key, the leader key's value).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The key of `service`'s state.
    #[must_use]
    pub fn state_key(&self, service: &str) -> String {
        self.inner.key(service, "state")
    }

    /// The key of `service`'s leader.
    #[must_use]
    pub fn leader_key(&self, service: &str) -> String {
        self.inner.key(service, "leader")
    }

    /// Tells the keeper to revoke the lease and exit; stops the watches.
    fn stop(&self) -> Option<JoinHandle<()>> {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
        let services = self
            .inner
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for s in services.values() {
            s.follow.abort();
        }
        self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        // Best effort: the keeper revokes the lease if the runtime lets it run; else the
        // lease expires.
        drop(self.stop());
    }
}

// === impl Inner ===

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("root", &self.root)
            .field("id", &self.id)
            .field("ttl_secs", &self.ttl_secs)
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn key(&self, service: &str, what: &str) -> String {
        format!("{}{service}/{what}", self.root)
    }

    fn touch(&self) {
        *self.contact.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    fn lease(&self) -> (i64, Option<Instant>) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection, made again after a failure (it may be bound to a dead member).
    async fn client(&self) -> Result<Client, StoreError> {
        if let Some(c) = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(c);
        }
        let client = self
            .config
            .connect()
            .await
            .map_err(|e| failed("connect", e))?;
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client.clone());
        Ok(client)
    }

    /// Runs one request on the connection, bounded by the request timeout; a failure
    /// drops the connection, an answer is contact.
    async fn call<T, F>(&self, what: &str, op: impl FnOnce(Client) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let client = self.client().await?;
        let bound = self.config.request_timeout();
        let result = match tokio::time::timeout(bound, op(client)).await {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(failed(what, e)),
            Err(_) => Err(failed(what, format_args!("no answer within {bound:?}"))),
        };
        match &result {
            Ok(_) => self.touch(),
            Err(_) => *self.client.lock().unwrap_or_else(|p| p.into_inner()) = None,
        }
        result
    }

    /// Grants a new lease; the elections start again under it.
    async fn grant(&self) -> Result<(), StoreError> {
        let ttl = self.ttl_secs;
        let granted = self
            .call("grant a lease", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) =
            (granted.id(), Some(Instant::now()));
        tracing::info!(target: "gray::rollout", id = %self.id, lease = granted.id(), ttl, "rollouts: etcd lease granted");
        Ok(())
    }

    /// Renews the lease, a third of the TTL apart, and runs the elections after each
    /// renewal; revokes the lease when `stopped`.
    async fn keep(self: Arc<Self>, mut stopped: oneshot::Receiver<()>) {
        let period = Duration::from_millis(u64::try_from(self.ttl_secs).unwrap_or(60) * 1000 / 3);
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep(period) => {}
            }
            if let Err(e) = self.renew().await {
                tracing::warn!(target: "gray::rollout", id = %self.id, error = %e, "rollouts: cannot renew the etcd lease");
                continue;
            }
            self.campaign().await;
        }
        let (lease, _) = self.lease();
        if lease != 0 {
            let revoked = self
                .call("revoke the lease", |mut c| async move {
                    c.lease_revoke(lease).await
                })
                .await;
            match revoked {
                Ok(_) => {
                    tracing::info!(target: "gray::rollout", id = %self.id, lease, "rollouts: etcd lease revoked")
                }
                Err(e) => {
                    tracing::warn!(target: "gray::rollout", id = %self.id, lease, error = %e, "rollouts: cannot revoke the etcd lease; it expires by itself")
                }
            }
        }
    }

    /// Renews the lease, or grants a new one when etcd no longer has it.
    async fn renew(&self) -> Result<(), StoreError> {
        let (lease, _) = self.lease();
        if lease == 0 {
            return self.grant().await;
        }
        let renewed = self
            .call("renew the lease", |mut c| async move {
                c.lease_keep_alive(lease).await
            })
            .await;
        match renewed {
            Ok(_) => {
                self.lease.lock().unwrap_or_else(|p| p.into_inner()).1 = Some(Instant::now());
                Ok(())
            }
            Err(e) if e.to_string().contains("lease not found") => {
                tracing::warn!(target: "gray::rollout", id = %self.id, lease, "rollouts: the etcd lease expired; taking a new one");
                for s in self
                    .services
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values_mut()
                {
                    s.tenure = None;
                }
                self.grant().await
            }
            Err(e) => Err(e),
        }
    }

    /// For every rollout this gateway has: leads if nobody does, else learns who does.
    async fn campaign(&self) {
        let services: Vec<String> = self
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let (lease, _) = self.lease();
        for service in services {
            let key = self.key(&service, "leader");
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    self.id.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let answer = self
                .call("campaign", |mut c| async move { c.txn(txn).await })
                .await;
            let tenure = match answer {
                Ok(r) if r.succeeded() => r.header().map(|h| h.revision()),
                Ok(r) => r.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .filter(|kv| kv.value() == self.id.as_bytes() && kv.lease() == lease)
                        .map(|kv| kv.create_revision()),
                    _ => None,
                }),
                Err(e) => {
                    tracing::warn!(target: "gray::rollout", %service, error = %e, "rollouts: the election failed");
                    continue;
                }
            };
            let mut services = self.services.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = services.get_mut(&service) {
                if s.tenure.is_none() && tenure.is_some() {
                    tracing::info!(target: "gray::rollout", %service, id = %self.id, tenure = ?tenure, "rollouts: this gateway leads");
                } else if s.tenure.is_some() && tenure.is_none() {
                    tracing::warn!(target: "gray::rollout", %service, id = %self.id, "rollouts: this gateway no longer leads");
                }
                s.tenure = tenure;
            }
        }
    }

    /// Takes part in `service`'s election, and follows its state key.
    fn join(self: &Arc<Self>, service: &str) -> watch::Receiver<Option<Stored>> {
        let mut services = self.services.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = services.get(service) {
            return s.state.subscribe();
        }
        let state = watch::Sender::new(None);
        let source = EtcdSource::key(self.config.clone(), self.key(service, "state"));
        let updates = source.watch();
        let status = updates.status_handle();
        let follow = tokio::spawn(follow(updates, state.clone(), self.key(service, "state")));
        let rx = state.subscribe();
        services.insert(
            service.to_owned(),
            Service {
                tenure: None,
                state,
                status,
                follow,
            },
        );
        rx
    }

    async fn get_state(&self, service: &str) -> Result<Option<Stored>, StoreError> {
        let key = self.key(service, "state");
        let got = self
            .call("read the state", |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        got.kvs()
            .first()
            .map(|kv| stored(&key, kv.value(), kv.mod_revision()))
            .transpose()
    }
}

/// A state as read under `key` at `mod_revision`.
fn stored(key: &str, value: &[u8], mod_revision: i64) -> Result<Stored, StoreError> {
    let state: State = serde_json::from_slice(value)
        .map_err(|e| failed(key, format_args!("not a rollout state: {e}")))?;
    Ok(Stored {
        version: u64::try_from(mod_revision).unwrap_or(0),
        state,
    })
}

/// Hands the states written under `key` to `state` as they come.
async fn follow(
    mut updates: gray_source::Updates,
    state: watch::Sender<Option<Stored>>,
    key: String,
) {
    while let Some(update) = updates.next().await {
        let entry = match update {
            Update::Reset(snapshot) => snapshot.entries.into_iter().next(),
            Update::Put(entry) => Some(entry),
            Update::Delete { .. } => None,
            _ => continue,
        };
        let now = match entry {
            Some(e) => {
                let Revision::Etcd { mod_revision } = e.revision else {
                    continue;
                };
                match stored(&key, &e.value, mod_revision) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::error!(target: "gray::rollout", error = %e, "rollouts: a stored state cannot be read");
                        continue;
                    }
                }
            }
            None => None,
        };
        state.send_replace(now);
    }
}

impl RolloutStore for EtcdStore {
    fn load<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Option<Stored>, StoreError>> {
        Box::pin(async move {
            self.inner.join(service);
            self.inner.get_state(service).await
        })
    }

    fn save<'a>(
        &'a self,
        service: &'a str,
        state: &'a State,
        expected: Option<u64>,
        fence: Fence,
    ) -> BoxFuture<'a, Result<Saved, StoreError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let key = inner.key(service, "state");
            let mut when = vec![match expected {
                None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Some(v) => Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    i64::try_from(v).unwrap_or(i64::MAX),
                ),
            }];
            if fence == Fence::Leader {
                let tenure = inner
                    .services
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(service)
                    .and_then(|s| s.tenure);
                let Some(tenure) = tenure else {
                    let current = inner.get_state(service).await?;
                    return Ok(Saved::Lost(current.map(Box::new)));
                };
                let leader = inner.key(service, "leader");
                when.push(Compare::create_revision(leader, CompareOp::Equal, tenure));
            }
            let value = serde_json::to_vec(state).map_err(|e| failed(&key, e))?;
            let txn = Txn::new()
                .when(when)
                .and_then([TxnOp::put(key.as_str(), value, None)])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let answer = inner
                .call("save the state", |mut c| async move { c.txn(txn).await })
                .await?;
            if answer.succeeded() {
                let revision = answer.header().map_or(0, |h| h.revision());
                return Ok(Saved::Won(u64::try_from(revision).unwrap_or(0)));
            }
            let current = answer.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => g
                    .kvs()
                    .first()
                    .map(|kv| stored(&key, kv.value(), kv.mod_revision())),
                _ => None,
            });
            Ok(Saved::Lost(current.transpose()?.map(Box::new)))
        })
    }

    fn publish_report<'a>(
        &'a self,
        service: &'a str,
        report: &'a Report,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let inner = &self.inner;
            let (lease, _) = inner.lease();
            if lease == 0 {
                return Err(failed("publish a report", "no lease yet"));
            }
            let key = inner.key(service, &format!("reports/{}", inner.id));
            let value = serde_json::to_vec(report).map_err(|e| failed(&key, e))?;
            inner
                .call("publish a report", |mut c| async move {
                    c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                        .await
                })
                .await?;
            Ok(())
        })
    }

    fn reports<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<Vec<Report>, StoreError>> {
        Box::pin(async move {
            let prefix = self.inner.key(service, "reports/");
            let got = self
                .inner
                .call("read the reports", |mut c| async move {
                    c.get(prefix, Some(GetOptions::new().with_prefix())).await
                })
                .await?;
            Ok(got
                .kvs()
                .iter()
                .filter_map(|kv| match serde_json::from_slice(kv.value()) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        tracing::warn!(target: "gray::rollout", key = %String::from_utf8_lossy(kv.key()), error = %e, "rollouts: not a report, skipped");
                        None
                    }
                })
                .collect())
        })
    }

    fn is_leader(&self, service: &str) -> bool {
        let ttl = Duration::from_secs(u64::try_from(self.inner.ttl_secs).unwrap_or(0));
        // a lease not renewed for a TTL may be gone: no longer lead, even before the
        // election says so
        let renewed = self.inner.lease().1.is_some_and(|t| t.elapsed() < ttl);
        renewed
            && self
                .inner
                .services
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(service)
                .is_some_and(|s| s.tenure.is_some())
    }

    fn watch(&self, service: &str) -> watch::Receiver<Option<Stored>> {
        self.inner.join(service)
    }

    fn contact(&self) -> Contact {
        let mut last = *self.inner.contact.lock().unwrap_or_else(|p| p.into_inner());
        for s in self
            .inner
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            last = last.max(s.status.get().last_contact);
        }
        Contact { last }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        let keeper = self.stop();
        Box::pin(async move {
            if let Some(keeper) = keeper {
                // bounded: the revocation is one request, within the request timeout
                let _ = keeper.await;
            }
        })
    }
}
