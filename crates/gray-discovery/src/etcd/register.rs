use std::{fmt, time::Duration};

use etcd_client::{Client, PutOptions};
use tokio::{sync::oneshot, task::JoinHandle};

use super::Registrar;
use crate::{Error, Instance};

/// An instance registered in etcd under a lease that a background task keeps alive; see the
/// [module docs](super).
///
/// Dropping it deregisters the instance from the background task (best effort: if the
/// runtime stops first, the key goes away when the lease expires).
pub struct Registration {
    key: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Registration {
    pub(super) async fn start(
        registrar: &Registrar,
        service: &str,
        instance: &Instance,
    ) -> Result<Registration, Error> {
        let key = registrar.key(service, instance.id().as_str());
        let value = serde_json::to_vec(&instance.record()).map_err(|_| Error::Invalid {
            what: "instance record",
            value: instance.id().to_string(),
            reason: "it cannot be written as JSON",
        })?;
        let ttl = registrar.ttl;
        let mut keeper = Keeper {
            registrar: registrar.clone(),
            client: None,
            key: key.clone(),
            value,
            ttl_secs: i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
                .unwrap_or(i64::MAX),
        };
        let lease = keeper.register().await?;
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(keeper.run(lease, rx));
        Ok(Registration {
            key,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// The etcd key of the instance.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Stops keeping the lease alive and revokes it, which deletes the key. Returns the
    /// error of the revocation, if any (the key then goes away when the lease expires).
    pub async fn deregister(mut self) -> Result<(), Error> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            // The task revokes the lease and exits.
            let _ = tx.send(());
        }
    }
}

struct Keeper {
    registrar: Registrar,
    /// The connection, made again after a failure (it may be bound to a dead member).
    client: Option<Client>,
    key: String,
    value: Vec<u8>,
    ttl_secs: i64,
}

/// Why a keep-alive session ended.
enum Ended {
    /// The lease no longer exists: register again.
    Lost,
    /// The connection failed: keep the lease alive again once etcd answers.
    Broken(Error),
}

impl Keeper {
    async fn client(&mut self) -> Result<Client, Error> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = self
            .registrar
            .config
            .connect()
            .await
            .map_err(Error::Source)?;
        Ok(self.client.insert(client).clone())
    }

    /// Grants a lease and writes the key under it; returns the lease id.
    async fn register(&mut self) -> Result<i64, Error> {
        let attempt = self.try_register().await;
        if attempt.is_err() {
            self.client = None;
        }
        attempt
    }

    async fn try_register(&mut self) -> Result<i64, Error> {
        let mut client = self.client().await?;
        let key = &self.key;
        let lease = self
            .registrar
            .timed(
                || format!("grant a lease for {key}"),
                client.lease_grant(self.ttl_secs, None),
            )
            .await?
            .id();
        let put = self
            .registrar
            .timed(
                || format!("put {key}"),
                client.put(
                    key.as_str(),
                    self.value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            )
            .await;
        if let Err(error) = put {
            // Do not leave the lease behind; it expires by itself if this fails too.
            let _ = self
                .registrar
                .timed(String::new, client.lease_revoke(lease))
                .await;
            return Err(error);
        }
        tracing::info!(target: "gray::discovery", key = %self.key, lease, ttl = self.ttl_secs,
            "registered in etcd");
        Ok(lease)
    }

    async fn run(
        mut self,
        mut lease: i64,
        mut shutdown: oneshot::Receiver<()>,
    ) -> Result<(), Error> {
        let backoff = self.registrar.config.backoff();
        let mut failures = 0u32;
        loop {
            let ended = tokio::select! {
                _ = &mut shutdown => return self.revoke(lease).await,
                ended = self.keep_alive(lease) => ended,
            };
            match ended {
                Ended::Broken(error) => {
                    failures = failures.saturating_add(1);
                    self.client = None;
                    tracing::warn!(target: "gray::discovery", key = %self.key, lease, %error,
                        "etcd lease keep-alive failed; retrying");
                }
                Ended::Lost => {
                    tracing::warn!(target: "gray::discovery", key = %self.key, lease,
                        "etcd lease lost; registering again");
                    loop {
                        let attempt = tokio::select! {
                            _ = &mut shutdown => return Ok(()),
                            attempt = self.register() => attempt,
                        };
                        match attempt {
                            Ok(new) => {
                                lease = new;
                                failures = 0;
                                break;
                            }
                            Err(error) => {
                                failures = failures.saturating_add(1);
                                tracing::warn!(target: "gray::discovery", key = %self.key,
                                    %error, "etcd registration failed; retrying");
                                tokio::select! {
                                    _ = &mut shutdown => return Ok(()),
                                    () = tokio::time::sleep(backoff.delay(failures)) => {}
                                }
                            }
                        }
                    }
                    continue;
                }
            }
            tokio::select! {
                _ = &mut shutdown => return self.revoke(lease).await,
                () = tokio::time::sleep(backoff.delay(failures)) => {}
            }
        }
    }

    /// Keeps `lease` alive until it is lost or the connection fails.
    async fn keep_alive(&mut self, lease: i64) -> Ended {
        let mut client = match self.client().await {
            Ok(client) => client,
            Err(error) => return Ended::Broken(error),
        };
        let key = &self.key;
        let action = || format!("keep the lease of {key} alive");
        let (mut keeper, mut responses) = match self
            .registrar
            .timed(action, client.lease_keep_alive(lease))
            .await
        {
            Ok(pair) => pair,
            Err(Error::Etcd {
                source: etcd_client::Error::LeaseKeepAliveError(_),
                ..
            }) => return Ended::Lost,
            Err(error) => return Ended::Broken(error),
        };
        // `lease_keep_alive` already renewed it once.
        let period = Duration::from_secs_f64((self.ttl_secs as f64 / 3.0).max(0.5));
        loop {
            tokio::time::sleep(period).await;
            if let Err(source) = keeper.keep_alive().await {
                return Ended::Broken(Error::Etcd {
                    action: action(),
                    source,
                });
            }
            match tokio::time::timeout(period, responses.message()).await {
                Ok(Ok(Some(response))) if response.ttl() <= 0 => return Ended::Lost,
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => {
                    return Ended::Broken(Error::Etcd {
                        action: action(),
                        source: etcd_client::Error::LeaseKeepAliveError(
                            "the keep-alive stream ended".to_owned(),
                        ),
                    });
                }
                Ok(Err(source)) => {
                    return Ended::Broken(Error::Etcd {
                        action: action(),
                        source,
                    });
                }
                Err(_) => return Ended::Broken(Error::Timeout { action: action() }),
            }
        }
    }

    async fn revoke(&mut self, lease: i64) -> Result<(), Error> {
        let revoked = async {
            let mut client = self.client().await?;
            let key = &self.key;
            self.registrar
                .timed(
                    || format!("revoke the lease of {key}"),
                    client.lease_revoke(lease),
                )
                .await
        }
        .await;
        match &revoked {
            Ok(_) => {
                tracing::info!(target: "gray::discovery", key = %self.key, lease,
                    "deregistered from etcd");
            }
            Err(error) => tracing::warn!(target: "gray::discovery", key = %self.key, lease, %error,
                "etcd deregistration failed; the key goes away when the lease expires"),
        }
        revoked.map(|_| ())
    }
}
