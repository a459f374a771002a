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
//! - **Leadership follows progress**: a gateway whose controller has not completed a look
//!   of a rollout for a lease TTL (a look that hangs is cancelled after that long, one
//!   that panics is caught: see the controller) deletes its leader key, in a transaction
//!   on the key's value and lease, and does not campaign for that rollout until a look
//!   completes again; another gateway leads within a third of the TTL.
//! - **Fencing**: a save compares the state key's `mod_revision` with the one the writer
//!   read (`create_revision` 0 for the first save). A save fenced by [`Fence::Leader`]
//!   also compares the leader key's `create_revision` with this gateway's tenure, so a
//!   deposed leader's write fails. A save that loses reads what is there, for the caller
//!   to adopt.
//! - **Contact**: the last answer from etcd (a lease renewal, a request, a watch event or
//!   an answer to a watch's progress request), for the controller's rule that a gateway
//!   cut off holds its weight for `[rollouts] partition_hold_ms`, then drops it to 0 while
//!   the rollout is in progress (a final weight is held).
//! - **The watch** of each state key is gray-source's
//!   [`EtcdSource::key`](gray_tower::edge::EtcdSource::key): resumed after a failure,
//!   listed again after a compaction, a frozen member left within the progress deadline.
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
    sync::{Arc, Mutex},
    time::Duration,
};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::future::BoxFuture;
use gray_rollout::{Report, State};
use gray_tower::edge::EtcdConfig;
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};

mod session;

use self::session::{Session, failed, stored};
use super::store::{Contact, Fence, RolloutStore, Saved, StoreError, Stored};

/// The rollouts of several gateways in one etcd; see the [module docs](self).
#[derive(Debug)]
pub struct EtcdStore {
    inner: Arc<Session>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
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
        let inner = Arc::new(Session {
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
                .is_some_and(|s| s.tenure.is_some() && !s.unfit)
    }

    fn looked(&self, service: &str) {
        self.inner.looked(service);
    }

    fn unfit(&self, service: &str) {
        self.inner.unfit(service);
    }

    fn watch(&self, service: &str) -> watch::Receiver<Option<Stored>> {
        self.inner.join(service)
    }

    fn reports_holder(&self) -> u64 {
        self.inner.lease().0.cast_unsigned()
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
