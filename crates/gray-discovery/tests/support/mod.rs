//! Test helpers: temporary directories and change streams as text; `etcd`: a real etcd server
//! and a TCP proxy that can cut connections.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use gray_discovery::{Instance, InstanceId};
use tower::discover::Change;

#[cfg(feature = "etcd")]
pub use gray_test_support::etcd;

pub use gray_test_support::{TempDir, WAIT};

/// A change as text: `+id address {k=v,..}` or `-id`.
pub fn describe(change: &Change<InstanceId, Instance>) -> String {
    match change {
        Change::Insert(id, instance) => {
            let labels: Vec<String> = instance
                .labels()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("+{id} {} {{{}}}", instance.address(), labels.join(","))
        }
        Change::Remove(id) => format!("-{id}"),
    }
}

/// The next change of `stream`, as text; fails the test after [`WAIT`].
pub async fn next<S, E>(stream: &mut S) -> String
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(change))) => describe(&change),
        Ok(Some(Err(e))) => panic!("the stream yielded an error: {e}"),
        Ok(None) => panic!("the stream ended"),
        Err(_) => panic!("no change within {WAIT:?}"),
    }
}

/// The next `n` changes.
pub async fn take<S, E>(stream: &mut S, n: usize) -> Vec<String>
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        changes.push(next(stream).await);
    }
    changes
}

/// Asserts that `stream` yields nothing (no change, no error, no end) for `quiet`.
pub async fn assert_quiet<S, E>(stream: &mut S, quiet: Duration)
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    if let Ok(item) = tokio::time::timeout(quiet, stream.next()).await {
        let item = item.map(|r| r.map(|c| describe(&c)).map_err(|e| e.to_string()));
        panic!("expected nothing, the stream yielded {item:?}");
    }
}
