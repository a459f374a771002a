//! Freshness without traffic, end to end: instances registered, relabelled and removed in
//! a real etcd or a real file reach the registry *and the balancer built on it* while no
//! request flows at all: only the registry's task and the balancer's driver move. What is
//! checked is what `/explain`, metrics and readiness read: `ServiceInstances::instances`,
//! `Balance::len`, `Balance::ready_len` and `Balance::explain` for a gray and an unstained
//! request.
//!
//! Each step is waited for with a generous bound ([`WAIT`]) that a loaded CI machine never
//! reaches: how *fast* a change shows (the "within a second" of `docs/discovery.md`) is measured by
//! `cargo bench -p gray-tests --bench freshness`, not asserted here.

use std::{net::SocketAddr, path::Path};

use bytes::Bytes;
use gray_balance::{Balance, BalanceLayer};
use gray_core::{Labels, Lane, Stain};
use gray_discovery::{
    Instance, InstanceId, Registry, ServiceInstances,
    etcd::Registrar,
    http::HttpEndpoints,
    source::{
        etcd::{EtcdConfig, EtcdSource},
        file::FileSource,
    },
};
use gray_policy::Policy;
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use gray_tests::{until, write_instances};
use http_body_util::Empty;

/// The instances of `stock` at one step: id, port, and whether it is gray.
type State = &'static [(&'static str, u16, bool)];

fn ids(state: State, gray: bool) -> Vec<String> {
    let ids = state.iter().filter(|(_, _, g)| *g == gray);
    ids.map(|(id, _, _)| id.to_string()).collect()
}

/// The ids `explain` would route a request to, sorted; `None` when it is unroutable.
fn explained<S>(balance: &Balance<InstanceId, S>, stain: Option<&Stain>) -> Option<Vec<String>> {
    let decision = balance.explain(stain);
    let mut ids: Vec<String> = decision
        .candidates()?
        .iter()
        .map(|id| id.to_string())
        .collect();
    ids.sort();
    Some(ids)
}

/// `true` when the registry and the balancer both hold exactly `state`, and `explain`
/// sends a gray request to its gray instances and an unstained one to the others.
fn holds<S>(stock: &ServiceInstances, balance: &Balance<InstanceId, S>, state: State) -> bool {
    let registered: Vec<String> = stock
        .instances()
        .iter()
        .map(|i| i.id().to_string())
        .collect();
    let mut all: Vec<String> = state.iter().map(|(id, _, _)| id.to_string()).collect();
    all.sort();
    let expect = |ids: Vec<String>| (!ids.is_empty()).then_some(ids);
    let gray = Stain::in_lane(Lane::new("gray").expect("a lane"));
    registered == all
        && balance.len() == state.len()
        && balance.ready_len() == state.len()
        && explained(balance, Some(&gray)) == expect(ids(state, true))
        && explained(balance, None) == expect(ids(state, false))
}

/// Waits, sending nothing, until `state` holds; fails the test after [`WAIT`].
async fn fresh<S>(stock: &ServiceInstances, balance: &Balance<InstanceId, S>, state: State) {
    let what = format!("the registry and the balancer show {state:?}");
    let took = until(WAIT, &what, || holds(stock, balance, state)).await;
    eprintln!("{took:>10.1?}  {state:?}");
}

fn record(port: u16, gray: bool) -> String {
    let labels = if gray {
        r#", "labels": {"gray": "true"}"#
    } else {
        ""
    };
    format!(r#"{{"address": "127.0.0.1:{port}"{labels}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_follows_etcd_with_no_traffic_at_all() {
    let etcd = Etcd::start().await;
    let config = EtcdConfig::new([etcd.endpoint()]);
    let registry = Registry::start(EtcdSource::prefix(config.clone(), "/gray/"))
        .await
        .expect("the registry starts");
    let stock = registry.service("stock").expect("a name");
    // The instances themselves: a reqwest client routes to their origin.
    let balance = BalanceLayer::new("stock", Policy::new()).build(stock.discover());
    assert!(holds(&stock, &balance, &[]));

    // A process registers itself under a lease.
    let me = Instance::new(
        "s-1".parse().unwrap(),
        "127.0.0.1:7001".parse().unwrap(),
        Labels::new(),
    );
    let registration = Registrar::new(config, "/gray")
        .register("stock", &me)
        .await
        .expect("registered");
    let fresh = |state| fresh(&stock, &balance, state);
    fresh(&[("s-1", 7001, false)]).await;
    // An operator adds a gray instance by hand,
    etcd.put("/gray/stock/s-2", record(7002, true)).await;
    fresh(&[("s-1", 7001, false), ("s-2", 7002, true)]).await;
    // relabels it (gray requests have nowhere to go now),
    etcd.put("/gray/stock/s-2", record(7002, false)).await;
    fresh(&[("s-1", 7001, false), ("s-2", 7002, false)]).await;
    // and back.
    etcd.put("/gray/stock/s-2", record(7002, true)).await;
    fresh(&[("s-1", 7001, false), ("s-2", 7002, true)]).await;
    // The process deregisters (its lease is revoked, which deletes its key).
    registration.deregister().await.expect("deregistered");
    fresh(&[("s-2", 7002, true)]).await;
    // The operator deletes the last one.
    etcd.delete("/gray/stock/s-2").await;
    fresh(&[]).await;
}

/// Writes `state` as the instance file.
fn write(path: &Path, state: State) {
    let instances: Vec<_> = state
        .iter()
        .map(|&(id, port, gray)| (id, SocketAddr::from(([127, 0, 0, 1], port)), gray))
        .collect();
    write_instances(path, "stock", &instances);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancer_follows_a_file_with_no_traffic_at_all() {
    let dir = TempDir::new("freshness");
    let path = dir.path().join("instances.toml");
    write(&path, &[("s-1", 7001, false)]);
    // The default polling interval (250 ms), as a gateway runs it.
    let registry = Registry::start(FileSource::new(&path))
        .await
        .expect("the registry starts");
    let stock = registry.service("stock").expect("a name");
    // HTTP/1 endpoints, as a tower client or a gateway balances them.
    let endpoints = stock.endpoints(HttpEndpoints::<_, Empty<Bytes>>::new());
    let balance = BalanceLayer::new("stock", Policy::new()).build(endpoints);
    // What the file held at start is in the balancer when it is built.
    assert!(holds(&stock, &balance, &[("s-1", 7001, false)]));

    let steps: [State; 6] = [
        &[("s-1", 7001, false), ("s-2", 7002, true)],
        &[("s-1", 7001, false), ("s-2", 7002, false)],
        &[
            ("s-1", 7001, false),
            ("s-2", 7002, true),
            ("s-3", 7003, true),
        ],
        &[("s-1", 7001, false), ("s-3", 7003, true)],
        &[("s-3", 7003, true)],
        &[],
    ];
    for state in steps {
        write(&path, state);
        fresh(&stock, &balance, state).await;
    }
}
