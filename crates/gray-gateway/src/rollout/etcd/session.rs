//! One gateway's session with etcd: the connection, the lease and its renewal, the
//! elections, and the watches of the state keys (see the [store's docs](super)).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::StreamExt;
use gray_rollout::State;
use gray_source::{Revision, Source, StatusHandle, Update};
use gray_tower::edge::{EtcdConfig, EtcdSource};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};

use crate::rollout::store::{StoreError, Stored};

/// One gateway's session with etcd; see the [module docs](self).
pub(super) struct Session {
    pub(super) config: EtcdConfig,
    /// `<prefix>/rollouts/`.
    pub(super) root: String,
    /// This gateway's id: its reports' key, the leader key's value.
    pub(super) id: String,
    pub(super) ttl_secs: i64,
    pub(super) client: Mutex<Option<Client>>,
    /// This gateway's lease (0: none now) and when etcd last renewed it.
    pub(super) lease: Mutex<(i64, Option<Instant>)>,
    pub(super) services: Mutex<BTreeMap<String, Service>>,
    pub(super) contact: Mutex<Option<Instant>>,
}

/// A rollout this gateway takes part in.
#[derive(Debug)]
pub(super) struct Service {
    /// This gateway's tenure: the leader key's `create_revision`, while it leads.
    pub(super) tenure: Option<i64>,
    /// When the controller last completed a look (from joining, so that a new controller
    /// has a lease TTL to complete its first).
    pub(super) looked: Instant,
    /// The controller's configuration does not fit the stored state: not led from here
    /// until a look completes again.
    pub(super) unfit: bool,
    state: watch::Sender<Option<Stored>>,
    pub(super) status: StatusHandle,
    pub(super) follow: JoinHandle<()>,
}

/// Why a gateway does not lead a rollout it takes part in.
#[derive(Debug, Clone, Copy)]
enum Resign {
    /// Its controller has not completed a look for a lease TTL.
    Stuck,
    /// Its configuration does not fit the stored state.
    Unfit,
}

/// A store error naming what failed.
pub(super) fn failed(what: impl std::fmt::Display, e: impl std::fmt::Display) -> StoreError {
    format!("etcd: {what}: {e}").into()
}

// === impl Session ===

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("root", &self.root)
            .field("id", &self.id)
            .field("ttl_secs", &self.ttl_secs)
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(super) fn key(&self, service: &str, what: &str) -> String {
        format!("{}{service}/{what}", self.root)
    }

    fn touch(&self) {
        *self.contact.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    pub(super) fn lease(&self) -> (i64, Option<Instant>) {
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
    pub(super) async fn call<T, F>(
        &self,
        what: &str,
        op: impl FnOnce(Client) -> F,
    ) -> Result<T, StoreError>
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
    pub(super) async fn grant(&self) -> Result<(), StoreError> {
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
    pub(super) async fn keep(self: Arc<Self>, mut stopped: oneshot::Receiver<()>) {
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

    /// For every rollout this gateway has: leads if nobody does, else learns who does;
    /// but a rollout whose controller has not completed a look for a lease TTL is not led
    /// from here (its leader key, if this gateway holds it, is given up).
    async fn campaign(&self) {
        let ttl = Duration::from_secs(u64::try_from(self.ttl_secs).unwrap_or(60));
        let services: Vec<(String, Option<Resign>)> = self
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, s)| {
                let why = if s.unfit {
                    Some(Resign::Unfit)
                } else if s.looked.elapsed() > ttl {
                    Some(Resign::Stuck)
                } else {
                    None
                };
                (name.clone(), why)
            })
            .collect();
        let (lease, _) = self.lease();
        for (service, resign) in services {
            let key = self.key(&service, "leader");
            if let Some(why) = resign {
                self.resign(&service, &key, lease, ttl, why).await;
                continue;
            }
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

    /// Gives up `service`'s leader key if this gateway holds it (a transaction on its value
    /// and lease, so that another gateway's key is never deleted).
    async fn resign(&self, service: &str, key: &str, lease: i64, ttl: Duration, why: Resign) {
        let held = self
            .services
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(service)
            .and_then(|s| s.tenure.take());
        if held.is_none() {
            return;
        }
        match why {
            Resign::Stuck => {
                tracing::error!(target: "gray::rollout", %service, id = %self.id, ?ttl, "rollouts: this gateway's controller has not completed a look for a lease TTL: it gives up leading");
            }
            Resign::Unfit => {
                tracing::warn!(target: "gray::rollout", %service, id = %self.id, "rollouts: this gateway's configuration does not fit the stored state: it gives up leading");
            }
        }
        let txn = Txn::new()
            .when([
                Compare::value(key, CompareOp::Equal, self.id.as_str()),
                Compare::lease(key, CompareOp::Equal, lease),
            ])
            .and_then([TxnOp::delete(key, None)]);
        if let Err(e) = self
            .call("give up leading", |mut c| async move { c.txn(txn).await })
            .await
        {
            tracing::warn!(target: "gray::rollout", %service, error = %e, "rollouts: cannot delete the leader key; it goes with the lease");
        }
    }

    /// Notes that `service`'s controller completed a look.
    pub(super) fn looked(&self, service: &str) {
        self.update(service, |s| {
            s.looked = Instant::now();
            s.unfit = false;
        });
    }

    /// Notes that `service`'s controller does not fit the stored state: it gives up
    /// leading at the next campaign, and does not campaign until it looks again.
    pub(super) fn unfit(&self, service: &str) {
        self.update(service, |s| s.unfit = true);
    }

    fn update(&self, service: &str, change: impl FnOnce(&mut Service)) {
        let mut services = self.services.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = services.get_mut(service) {
            change(s);
        }
    }

    /// Takes part in `service`'s election, and follows its state key.
    pub(super) fn join(self: &Arc<Self>, service: &str) -> watch::Receiver<Option<Stored>> {
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
                looked: Instant::now(),
                unfit: false,
                state,
                status,
                follow,
            },
        );
        rx
    }

    pub(super) async fn get_state(&self, service: &str) -> Result<Option<Stored>, StoreError> {
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
pub(super) fn stored(key: &str, value: &[u8], mod_revision: i64) -> Result<Stored, StoreError> {
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
