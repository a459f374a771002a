//! The check a watch makes on every new connection before it resumes: the keys at the
//! revision handed out, listed again.

use std::collections::HashMap;

use etcd_client::{GetOptions, ResponseHeader};
use tokio::time::Instant;
use tonic::Code;

use super::{Conn, Watcher};
use crate::{
    SourceError,
    etcd::verify::{self, Reset, Seen},
};

// === impl Watcher ===

impl Watcher {
    /// On a new connection, before resuming: lists the keys (keys only, no values) **at the
    /// revision handed out**, linearizably (so a member that lags behind catches up first),
    /// and compares them with the keys held, their versions and last changes.
    ///
    /// In the cluster that handed them out they are the same, whatever happened since (the
    /// watch delivers the later changes from that revision + 1). A cluster that lost its
    /// data starts again from revision 1: one still behind the revision handed out refuses
    /// it as a future revision, one that has passed it shows other keys there. Either way
    /// it would accept a watch from our old revision as one from its own history, and keys
    /// that it does not have would stay held. Then the whole is listed again. A compacted
    /// revision cannot be listed: the whole is listed again too, as the watch would.
    pub(super) async fn check(&mut self, conn: &mut Conn, held: i64) -> Result<(), SourceError> {
        if held < 1 {
            // Listed without a revision (no header): nothing to compare at.
            self.held = None;
            return Ok(());
        }
        let key = &self.source.key;
        let mut options = GetOptions::new().with_keys_only().with_revision(held);
        if self.source.prefix {
            options = options.with_prefix();
        }
        let started = Instant::now();
        let listed = self
            .source
            .config
            .timed(
                || format!("get {key} at revision {held} at {}", conn.endpoint),
                conn.client.get(key.as_str(), Some(options)),
            )
            .await;
        let response = match listed {
            Ok(response) => response,
            Err(error) => return self.unlisted(conn, held, error).await,
        };
        self.answered(conn);
        conn.checked = true;
        // A contact, but not yet followed: `connected` waits for the watch.
        self.status
            .update(|s| s.last_contact = Some(std::time::Instant::now()));
        tracing::debug!(target: "gray::source", key = %self.source.key, endpoint = %conn.endpoint,
            revision = held, keys = response.kvs().len(), took = ?started.elapsed(),
            "etcd keys at the revision handed out listed again");
        let now = response.header().map_or(0, ResponseHeader::revision);
        if let Some(header) = response.header() {
            self.status.cluster(header.cluster_id());
            if let Some(reset) = self.identity.observe(header) {
                self.reset(&reset, conn, now);
                return Ok(());
            }
        }
        let listed: HashMap<String, Seen> = response
            .kvs()
            .iter()
            .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), Seen::of(kv)))
            .collect();
        let differences = self
            .held
            .as_ref()
            .and_then(|h| verify::differences(&h.keys, &listed));
        if let Some(differences) = differences {
            let reset = Reset::Keys {
                revision: held,
                differences,
            };
            self.reset(&reset, conn, now);
        }
        Ok(())
    }

    /// The keys at the revision handed out could not be listed: a revision in the future
    /// is a store that lost its data; a compacted one, history gone (list again). Any
    /// other error is a failure.
    async fn unlisted(
        &mut self,
        conn: &mut Conn,
        held: i64,
        error: SourceError,
    ) -> Result<(), SourceError> {
        let out_of_range = |needle: &str| match &error {
            SourceError::Etcd {
                source: etcd_client::Error::GRpcStatus(status),
                ..
            } => status.code() == Code::OutOfRange && status.message().contains(needle),
            _ => false,
        };
        if out_of_range("compacted") {
            self.answered(conn);
            tracing::info!(target: "gray::source", key = %self.source.key, revision = held,
                "etcd revision compacted; listing again");
            self.held = None;
            return Ok(());
        }
        if !out_of_range("future revision") {
            return Err(error);
        }
        self.answered(conn);
        // Behind: the store's revision, and its identity, for the warning.
        let key = &self.source.key;
        let response = self
            .source
            .config
            .timed(
                || format!("get {key} at {}", conn.endpoint),
                conn.client
                    .get(key.as_str(), Some(GetOptions::new().with_count_only())),
            )
            .await?;
        let now = response.header().map_or(0, ResponseHeader::revision);
        let reset = response
            .header()
            .and_then(|header| {
                self.status.cluster(header.cluster_id());
                self.identity.observe(header)
            })
            .unwrap_or(Reset::Revision {
                old: held,
                new: now,
            });
        self.reset(&reset, conn, now);
        Ok(())
    }
}
