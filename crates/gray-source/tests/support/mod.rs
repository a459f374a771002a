//! Following a source from a task of its own, as a consumer does, with bounded waits.

#![allow(dead_code, unreachable_pub)]

use std::{collections::BTreeMap, time::Duration};

use futures_util::StreamExt;
use gray_core::backoff::Backoff;
use gray_source::{Source, Status, StatusHandle, Update, etcd::EtcdConfig};
use gray_test_support::WAIT;
use tokio::sync::mpsc;

/// The keys of a reset, in order (panics on any other update).
pub fn reset_keys(update: &Update) -> Vec<&str> {
    match update {
        Update::Reset(s) => s.entries.iter().map(|e| e.key.as_str()).collect(),
        other => panic!("expected a reset, got {other:?}"),
    }
}

/// A config that retries fast, for tests whose outages are short.
pub fn fast(endpoints: impl IntoIterator<Item = String>) -> EtcdConfig {
    EtcdConfig::new(endpoints)
        .with_backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(500),
        ))
        .with_request_timeout(Duration::from_secs(2))
}

/// A watch polled by a task of its own (the stream only works while polled), its updates
/// forwarded here, and what a consumer applying them holds.
pub struct Follow {
    rx: mpsc::UnboundedReceiver<Update>,
    status: StatusHandle,
    task: tokio::task::JoinHandle<()>,
    /// Key → value, as a consumer that applies every update holds them.
    pub held: BTreeMap<String, Vec<u8>>,
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follow {
    pub fn start(source: &impl Source) -> Follow {
        let mut updates = source.watch();
        let status = updates.status_handle();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(update) = updates.next().await {
                if tx.send(update).is_err() {
                    return;
                }
            }
        });
        Follow {
            rx,
            status,
            task,
            held: BTreeMap::new(),
        }
    }

    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// The next update, applied to [`Follow::held`]; fails the test after `within`.
    pub async fn next_within(&mut self, within: Duration) -> Update {
        let update = tokio::time::timeout(within, self.rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no update within {within:?}; status {:?}; holding {:?}",
                    self.status(),
                    self.keys()
                )
            })
            .expect("the watch task ended");
        match &update {
            Update::Reset(snapshot) => {
                self.held = snapshot
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect();
            }
            Update::Put(entry) => {
                self.held.insert(entry.key.clone(), entry.value.clone());
            }
            Update::Delete { key, .. } => {
                self.held.remove(key);
            }
            other => panic!("an update of a kind these tests do not know: {other:?}"),
        }
        update
    }

    /// The next update; fails the test after [`WAIT`].
    pub async fn next(&mut self) -> Update {
        self.next_within(WAIT).await
    }

    /// Applies updates until `done` holds for what is held; returns every update seen.
    pub async fn until(
        &mut self,
        what: &str,
        done: impl Fn(&BTreeMap<String, Vec<u8>>) -> bool,
    ) -> Vec<Update> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        while !done(&self.held) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            assert!(
                !left.is_zero(),
                "{what}: not reached within {WAIT:?}; holding {:?}, status {:?}",
                self.keys(),
                self.status()
            );
            seen.push(self.next_within(left).await);
        }
        seen
    }

    /// Asserts that the watch handed out nothing by the time it has failed `failures` times
    /// in all: each failed attempt is an event that proves it tried again, and an update
    /// handed out before an attempt is forwarded before that attempt starts.
    pub async fn assert_nothing_after_failures(&mut self, failures: u64) {
        self.status_until("the failed attempts", |s| s.failures >= failures)
            .await;
        if let Ok(update) = self.rx.try_recv() {
            panic!("expected no update, got {update:?}");
        }
    }

    /// Puts the marker key `/gray/~marker` through `etcd` and asserts that it is the next
    /// update: nothing came before it (a change handed out twice, a late reset).
    pub async fn assert_next_is_marker(&mut self, etcd: &gray_test_support::etcd::Etcd) {
        etcd.put("/gray/~marker", "marker").await;
        let update = self.next().await;
        assert_eq!(describe(&update), "put /gray/~marker");
    }

    /// Waits until the status satisfies `ok`, within `within`.
    pub async fn status_within(
        &self,
        within: Duration,
        what: &str,
        ok: impl Fn(&Status) -> bool,
    ) -> Status {
        wait_status(&self.status, within, what, ok).await
    }

    /// Waits until the watch has noticed that its member is gone.
    pub async fn lost(&self) -> Status {
        self.status_until("the failure", |s| !s.connected && s.failures > 0)
            .await
    }

    /// Waits until the status satisfies `ok`, within [`WAIT`].
    pub async fn status_until(&self, what: &str, ok: impl Fn(&Status) -> bool) -> Status {
        self.status_within(WAIT, what, ok).await
    }

    pub fn keys(&self) -> Vec<&str> {
        self.held.keys().map(String::as_str).collect()
    }
}

/// Waits until `status` satisfies `ok`, within `within`.
pub async fn wait_status(
    status: &StatusHandle,
    within: Duration,
    what: &str,
    ok: impl Fn(&Status) -> bool,
) -> Status {
    let mut rx = status.subscribe();
    match tokio::time::timeout(within, rx.wait_for(|s| ok(s))).await {
        Ok(Ok(s)) => s.clone(),
        _ => panic!("{what}: not within {within:?}; status {:?}", status.get()),
    }
}

/// The keys of an update, for messages.
pub fn describe(update: &Update) -> String {
    match update {
        Update::Reset(s) => format!(
            "reset [{}]",
            s.entries
                .iter()
                .map(|e| e.key.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Update::Put(e) => format!("put {}", e.key),
        Update::Delete { key, .. } => format!("delete {key}"),
        other => format!("{other:?}"),
    }
}
