//! Test helpers: temporary directories, change streams as text, bounded waits on a
//! registry; `etcd`: a real etcd server and a TCP proxy that can cut connections.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use futures_util::{Stream, StreamExt};
use gray_core::Labels;
use gray_discovery::{Instance, InstanceId, ServiceInstances};
use tower::discover::Change;

#[cfg(feature = "etcd")]
pub use gray_test_support::etcd;

pub use gray_test_support::{TempDir, WAIT};

/// The instance `id` at `address` (`host:port` or a URL) with `labels`.
pub fn instance(id: &str, address: impl std::fmt::Display, labels: &[(&str, &str)]) -> Instance {
    Instance::new(
        id.parse().expect("a valid id"),
        address.to_string().parse().expect("a valid address"),
        Labels::from_iter(labels.iter().copied()),
    )
}

/// A change as text: `+id address {k=v,..}` or `-id`.
pub fn describe(change: &Change<InstanceId, Instance>) -> String {
    match change {
        Change::Insert(_, instance) => format!("+{}", show(instance)),
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

/// Asserts that `stream` has nothing ready now (no change, no error, no end): for a
/// stream whose every change is ready at once (a static list), nothing more will come.
/// Streams fed by a live source are checked by the next change instead: it must be the
/// very next item, which proves nothing came before it.
pub fn assert_nothing_ready<S, E>(stream: &mut S)
where
    S: Stream<Item = Result<Change<InstanceId, Instance>, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures_util::FutureExt;
    if let Some(item) = stream.next().now_or_never() {
        let item = item.map(|r| r.map(|c| describe(&c)).map_err(|e| e.to_string()));
        panic!("expected nothing, the stream yielded {item:?}");
    }
}

/// An instance as text: `id address {k=v,..}`.
pub fn show(instance: &Instance) -> String {
    let labels: Vec<String> = instance
        .labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!(
        "{} {} {{{}}}",
        instance.id(),
        instance.address(),
        labels.join(",")
    )
}

/// The instances of `service` now, as text, sorted by id.
pub fn instances(service: &ServiceInstances) -> Vec<String> {
    service.instances().iter().map(show).collect()
}

/// Polls `service` (no request, no stream: only the registry's own task moves it) until its
/// instances are `expected`; fails the test after [`WAIT`], a bound no loaded machine
/// reaches. How fast a change shows is measured, not asserted: `cargo bench -p gray-tests
/// --bench freshness` (the table in `docs/performance.md`).
pub async fn until_instances(service: &ServiceInstances, expected: &[&str]) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = instances(service);
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: expected {expected:?} within {WAIT:?}, still {now:?}",
            service.name()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub use gray_test_support::logs::capture;
