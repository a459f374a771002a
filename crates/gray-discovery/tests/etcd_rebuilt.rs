//! The issue's etcd blind spot, through a registry: while the registry is away, etcd loses
//! its data and is rebuilt with the same cluster ID, and the new store is written past the
//! revision the registry had seen, without the instances it holds. They leave routing at
//! the reconnection, not when one of their keys happens to be written again.

mod support;

use std::time::Duration;

use etcd_client::Client;
use gray_core::backoff::Backoff;
use gray_discovery::{
    Registry,
    source::etcd::{EtcdConfig, EtcdSource},
};
use support::{
    WAIT,
    etcd::{Etcd, Proxy},
    next, take, until_instances,
};

async fn put(client: &mut Client, id: &str, port: u16) -> i64 {
    client
        .put(
            format!("/gray/orders/{id}"),
            format!(r#"{{"address": "127.0.0.1:{port}"}}"#),
            None,
        )
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_lost_by_a_rebuilt_store_leave_at_the_reconnection() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    let mut client = etcd.client().await;
    put(&mut client, "a", 1).await;
    put(&mut client, "b", 2).await;
    let config = EtcdConfig::new([proxy.endpoint()])
        .with_backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(300),
        ))
        .with_request_timeout(Duration::from_secs(2));
    let registry = Registry::start(EtcdSource::prefix(config, "/gray/"))
        .await
        .expect("the registry starts");
    let orders = registry.service("orders").unwrap();
    let mut stream = orders.discover();
    assert_eq!(
        take(&mut stream, 2).await,
        ["+a 127.0.0.1:1 {}", "+b 127.0.0.1:2 {}"]
    );
    // Watching, not just listed: a change arrives by the watch.
    let seen = put(&mut client, "w", 23).await;
    assert_eq!(next(&mut stream).await, "+w 127.0.0.1:23 {}");
    let cluster = registry.status().cluster_id.expect("a cluster ID");

    proxy.cut();
    let deadline = tokio::time::Instant::now() + WAIT;
    while registry.status().connected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cut went unnoticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Same name, URLs and cluster token: the same cluster ID, revisions from 1 again.
    etcd.restart_empty().await;
    let mut client = etcd.client().await;
    let mut written = Vec::new();
    for port in 30.. {
        let id = format!("n{port}");
        let revision = put(&mut client, &id, port).await;
        written.push(format!("+{id} 127.0.0.1:{port} {{}}"));
        if revision > seen + 1 {
            break;
        }
    }
    proxy.restore();

    // The first changes after the reconnection remove what the store lost.
    let mut expected = vec!["-a".to_owned(), "-b".to_owned(), "-w".to_owned()];
    expected.extend(written.iter().cloned());
    assert_eq!(take(&mut stream, expected.len()).await, expected);
    let now: Vec<String> = written
        .iter()
        .map(|w| w.trim_start_matches('+').to_owned())
        .collect();
    until_instances(&orders, &now.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let status = registry.status();
    assert_eq!(status.cluster_id, Some(cluster), "the same cluster ID");
    assert_eq!(status.resets, 1, "{status:?}");
}
