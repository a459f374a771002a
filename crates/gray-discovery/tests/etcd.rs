//! A registry and self-registration against a real etcd server (started by
//! `gray_test_support::etcd`; needs the `etcd` binary, Debian package `etcd-server`).

mod support;

use std::time::Duration;

use etcd_client::{Client, CompactionOptions};
use gray_core::backoff::Backoff;
use gray_discovery::{
    InstanceDiscover, Registry,
    etcd::Registrar,
    source::etcd::{EtcdConfig, EtcdSource},
};
use support::{
    WAIT,
    etcd::{Etcd, Proxy},
    instance, instances, next, take, until_instances,
};

const PREFIX: &str = "/gray";
const GRAY: &[(&str, &str)] = &[("gray", "true")];

/// The cluster at `endpoint`, with short timeouts and a quick backoff.
fn config(endpoint: &str) -> EtcdConfig {
    EtcdConfig::new([endpoint])
        .with_backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(300),
        ))
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
}

async fn registry(endpoint: &str) -> Registry {
    Registry::start(EtcdSource::prefix(config(endpoint), format!("{PREFIX}/")))
        .await
        .expect("the registry starts")
}

async fn orders(endpoint: &str) -> (Registry, InstanceDiscover) {
    let registry = registry(endpoint).await;
    let stream = registry.service("orders").unwrap().discover();
    (registry, stream)
}

async fn put(client: &mut Client, id: &str, value: &str) -> i64 {
    client
        .put(format!("{PREFIX}/orders/{id}"), value, None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision()
}

async fn del(client: &mut Client, id: &str) -> i64 {
    client
        .delete(format!("{PREFIX}/orders/{id}"), None)
        .await
        .expect("delete")
        .header()
        .expect("header")
        .revision()
}

fn record(port: u16, labels: &str) -> String {
    format!(r#"{{"address": "127.0.0.1:{port}", "labels": {{{labels}}}}}"#)
}

async fn put_abc(client: &mut Client) {
    put(client, "a", &record(1, "")).await;
    put(client, "b", &record(2, r#""version": "1.0""#)).await;
    put(client, "c", &record(3, r#""gray": "true""#)).await;
}

/// Puts `w` and waits for it on the stream: from then on the registry is watching, not just
/// serving its first list.
async fn until_watching(client: &mut Client, stream: &mut InstanceDiscover) {
    put(client, "w", &record(23, "")).await;
    assert_eq!(next(stream).await, "+w 127.0.0.1:23 {}");
}

/// Puts a, b and c through `client`, starts a registry on `endpoint` and waits until its
/// `orders` stream has yielded them and is watching.
async fn watching_abc(client: &mut Client, endpoint: &str) -> (Registry, InstanceDiscover) {
    put_abc(client).await;
    let (registry, mut orders) = orders(endpoint).await;
    assert_eq!(take(&mut orders, 3).await, ABC);
    until_watching(client, &mut orders).await;
    (registry, orders)
}

/// Waits until `registry`'s source has noticed that etcd is out of reach (a failure, not
/// connected): from then on, what it does is what it does during an outage.
async fn until_lost(registry: &Registry) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let status = registry.status();
        if !status.connected && status.failures > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outage not noticed within {WAIT:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The changes of the disconnection tests: d put, a made gray, b deleted, e put and
/// deleted. Returns the revision of the last one.
async fn change_while_cut(writer: &mut Client) -> i64 {
    put(writer, "d", &record(4, "")).await;
    put(writer, "a", &record(1, r#""gray": "true""#)).await;
    del(writer, "b").await;
    put(writer, "e", &record(5, "")).await;
    del(writer, "e").await
}

const ABC: [&str; 3] = [
    "+a 127.0.0.1:1 {}",
    "+b 127.0.0.1:2 {version=1.0}",
    "+c 127.0.0.1:3 {gray=true}",
];

#[tokio::test]
async fn three_registered_instances_appear() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;

    // Two before the registry starts (the list), one after (the watch).
    put(&mut client, "a", &record(1, "")).await;
    put(&mut client, "b", &record(2, r#""version": "1.0""#)).await;
    // Another service under the same prefix is not part of this stream.
    client
        .put(format!("{PREFIX}/payments/p"), record(9, ""), None)
        .await
        .unwrap();
    let (registry, mut orders) = orders(&etcd.endpoint()).await;
    assert_eq!(registry.services(), ["orders", "payments"]);
    assert_eq!(take(&mut orders, 2).await, ABC[..2]);
    put(&mut client, "c", &record(3, r#""gray": "true""#)).await;
    assert_eq!(next(&mut orders).await, ABC[2]);

    let mut payments = registry.service("payments").unwrap().discover();
    assert_eq!(next(&mut payments).await, "+p 127.0.0.1:9 {}");
}

#[tokio::test]
async fn label_change_is_one_insert_that_replaces() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    let (_registry, mut orders) = watching_abc(&mut client, &etcd.endpoint()).await;

    put(
        &mut client,
        "b",
        &record(2, r#""version": "2.0", "gray": "true""#),
    )
    .await;
    // Same id, no Remove first: the balancer replaces the instance in place.
    assert_eq!(
        next(&mut orders).await,
        "+b 127.0.0.1:2 {gray=true,version=2.0}"
    );
    // A put that changes nothing yields nothing; the next change is the sentinel.
    put(
        &mut client,
        "b",
        &record(2, r#""gray": "true", "version": "2.0""#),
    )
    .await;
    put(&mut client, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn delete_is_a_remove() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    let (_registry, mut orders) = watching_abc(&mut client, &etcd.endpoint()).await;

    del(&mut client, "b").await;
    assert_eq!(next(&mut orders).await, "-b");
    del(&mut client, "nothing-here").await;
    put(&mut client, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn malformed_values_are_skipped() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    put(&mut client, "a", &record(1, "")).await;
    put(&mut client, "bad-json", "not json").await;
    put(
        &mut client,
        "bad-address",
        r#"{"address": "127.0.0.1:port"}"#,
    )
    .await;
    put(&mut client, "bad-field", r#"{"adress": "127.0.0.1:5"}"#).await;
    put(&mut client, "d", &record(4, "")).await;
    client
        .put(format!("{PREFIX}/orders/nested/key"), record(7, ""), None)
        .await
        .unwrap();
    let (_registry, mut orders) = orders(&etcd.endpoint()).await;
    assert_eq!(
        take(&mut orders, 2).await,
        ["+a 127.0.0.1:1 {}", "+d 127.0.0.1:4 {}"]
    );

    // While watching: a malformed put of a new key is skipped; one over a valid instance
    // removes it (a list would not include it either); the others are unaffected.
    put(&mut client, "e", "{").await;
    put(&mut client, "a", r#"{"address": ""}"#).await;
    assert_eq!(next(&mut orders).await, "-a");
    put(&mut client, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn etcd_killed_mid_watch_and_restarted() {
    let mut etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    let (registry, mut orders) = watching_abc(&mut client, &etcd.endpoint()).await;

    etcd.kill().await;
    // While etcd is down, the stream yields nothing: no error, no Remove (the changes after
    // the restart are its next items). The balancer keeps serving a, b and c.
    until_lost(&registry).await;
    assert_eq!(instances(&registry.service("orders").unwrap()).len(), 4);

    etcd.restart().await;
    let mut writer = etcd.client().await;
    put(&mut writer, "d", &record(4, "")).await;
    del(&mut writer, "a").await;
    put(&mut writer, "b", &record(2, r#""version": "2.0""#)).await;
    // In the order made, once each: a resumed watch, not a re-list (which would yield
    // "-a" first) and not a replay of a, b and c.
    assert_eq!(
        take(&mut orders, 3).await,
        ["+d 127.0.0.1:4 {}", "-a", "+b 127.0.0.1:2 {version=2.0}"]
    );
    put(&mut writer, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn changes_made_while_disconnected_arrive_in_order() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    let mut writer = etcd.client().await;
    let (registry, mut orders) = watching_abc(&mut writer, &proxy.endpoint()).await;

    // The source's connection is closed; these writes cannot reach it by a live watch.
    proxy.cut();
    until_lost(&registry).await;
    change_while_cut(&mut writer).await;

    proxy.restore();
    // In the order made. `e` came and went while the stream was not polled: it holds one
    // pending change per instance, and says nothing of an instance it never inserted.
    assert_eq!(
        take(&mut orders, 3).await,
        ["+d 127.0.0.1:4 {}", "+a 127.0.0.1:1 {gray=true}", "-b",]
    );
    put(&mut writer, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn compacted_revision_forces_a_relist_with_the_difference() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    let mut writer = etcd.client().await;
    let (_registry, mut orders) = watching_abc(&mut writer, &proxy.endpoint()).await;

    proxy.cut();
    let revision = change_while_cut(&mut writer).await;
    writer
        .compact(revision, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");

    proxy.restore();
    // The history is gone: the source lists again and yields the difference, removals
    // first, then inserts, each sorted by id. `e` came and went: nothing for it.
    assert_eq!(
        take(&mut orders, 3).await,
        ["-b", "+a 127.0.0.1:1 {gray=true}", "+d 127.0.0.1:4 {}",]
    );
    // And then it watches from the listed revision.
    put(&mut writer, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn instances_follow_etcd_with_no_traffic_at_all() {
    let etcd = Etcd::start().await;
    let mut client = etcd.client().await;
    put(&mut client, "a", &record(1, "")).await;
    // Nothing reads a stream: only the registry's own task follows etcd.
    let registry = registry(&etcd.endpoint()).await;
    let orders = registry.service("orders").unwrap();
    assert_eq!(instances(&orders), ["a 127.0.0.1:1 {}"]);

    // Registered by hand, as operators do with etcdctl.
    let revision = put(&mut client, "b", &record(2, r#""gray": "true""#)).await;
    until_instances(&orders, &["a 127.0.0.1:1 {}", "b 127.0.0.1:2 {gray=true}"]).await;
    assert!(registry.status().revision >= Some(revision));
    // Relabelled.
    put(&mut client, "a", &record(1, r#""version": "2.0""#)).await;
    until_instances(
        &orders,
        &["a 127.0.0.1:1 {version=2.0}", "b 127.0.0.1:2 {gray=true}"],
    )
    .await;
    // Deleted.
    let revision = del(&mut client, "a").await;
    until_instances(&orders, &["b 127.0.0.1:2 {gray=true}"]).await;
    // Registered under a lease by a process, which then stops: the key expires.
    let registration = Registrar::new(config(&etcd.endpoint()), PREFIX)
        .with_ttl(Duration::from_secs(1))
        .register("orders", &instance("r", "127.0.0.1:7", &[]))
        .await
        .expect("register");
    until_instances(&orders, &["b 127.0.0.1:2 {gray=true}", "r 127.0.0.1:7 {}"]).await;
    drop(registration);
    until_instances(&orders, &["b 127.0.0.1:2 {gray=true}"]).await;

    let status = registry.status();
    assert!(status.connected, "{status:?}");
    assert!(status.revision > Some(revision), "{status:?}");
    // A followed watch hears from etcd at least once per progress deadline (it asks for
    // progress while idle); a generous bound, not a latency figure.
    let deadline = config(&etcd.endpoint())
        .progress_deadline()
        .expect("on by default");
    assert!(
        status.since_last_contact().expect("a contact") < deadline,
        "{status:?}"
    );
}

#[tokio::test]
async fn registration_writes_the_canonical_record() {
    let etcd = Etcd::start().await;
    let registrar = Registrar::new(config(&etcd.endpoint()), "/gray/");
    assert_eq!(registrar.prefix(), "/gray");
    // Given as a URL, written as `host:port`: the form discovery documents.
    let registration = registrar
        .register("orders", &instance("r", "http://127.0.0.1:7", GRAY))
        .await
        .expect("register");
    assert_eq!(registration.key(), "/gray/orders/r");
    let mut client = etcd.client().await;
    let mut value = async || {
        let response = client.get("/gray/orders/r", None).await.unwrap();
        response
            .kvs()
            .first()
            .map(|kv| kv.value_str().unwrap().to_owned())
    };
    assert_eq!(
        value().await.as_deref(),
        Some(r#"{"address":"127.0.0.1:7","labels":{"gray":"true"}}"#)
    );
    registration.deregister().await.expect("deregister");
    assert_eq!(value().await, None);
}

#[tokio::test]
async fn registration_disappears_when_its_keep_alive_stops_and_comes_back() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    let (_watcher, mut orders) = orders(&etcd.endpoint()).await;

    let registrar =
        Registrar::new(config(&proxy.endpoint()), PREFIX).with_ttl(Duration::from_secs(2));
    let registration = registrar
        .register("orders", &instance("r", "http://127.0.0.1:7", GRAY))
        .await
        .expect("register");
    assert_eq!(registration.key(), "/gray/orders/r");
    assert_eq!(next(&mut orders).await, "+r 127.0.0.1:7 {gray=true}");

    // The registering process is cut off from etcd: its keep-alives stop, the lease
    // expires, and etcd deletes the key.
    proxy.cut();
    assert_eq!(next(&mut orders).await, "-r");

    // Once etcd is reachable again, the lost lease is replaced and the key written again.
    proxy.restore();
    assert_eq!(next(&mut orders).await, "+r 127.0.0.1:7 {gray=true}");

    registration.deregister().await.expect("deregister");
    assert_eq!(next(&mut orders).await, "-r");
}

#[tokio::test]
async fn a_kept_alive_registration_outlives_its_ttl_until_dropped() {
    let etcd = Etcd::start().await;
    let (_watcher, mut orders) = orders(&etcd.endpoint()).await;
    let registrar =
        Registrar::new(config(&etcd.endpoint()), PREFIX).with_ttl(Duration::from_secs(2));

    let registration = registrar
        .register("orders", &instance("s", "127.0.0.1:8", &[]))
        .await
        .expect("register");
    assert_eq!(next(&mut orders).await, "+s 127.0.0.1:8 {}");
    // Three TTLs pass (the time is the condition under test): the keep-alive must have
    // renewed the lease, so the registration is still there, and the next change of the
    // stream is a new key put afterwards, not its removal.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut client = etcd.client().await;
    put(&mut client, "t", &record(9, "")).await;
    assert_eq!(next(&mut orders).await, "+t 127.0.0.1:9 {}");

    drop(registration);
    assert_eq!(next(&mut orders).await, "-s");
}

#[tokio::test]
async fn invalid_service_names_are_rejected() {
    let etcd = Etcd::start().await;
    let registry = registry(&etcd.endpoint()).await;
    let err = registry.service("a/b").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid service name `a/b`: it contains `/`"
    );
    let err = Registrar::new(config(&etcd.endpoint()), PREFIX)
        .register("", &instance("x", "127.0.0.1:1", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "invalid service name ``: it is empty");
}

/// The address the registry follows now leads to another cluster (a new cluster ID), one
/// further along in revisions than the old one, so only its ID tells: the registry lists
/// it again, the instances it does not have leave, and a WARN names both cluster IDs.
#[tokio::test(flavor = "current_thread")]
async fn a_replaced_cluster_is_listed_again_and_its_absent_instances_leave() {
    let (logs, _guard) = support::capture();
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    let mut writer = etcd.client().await;
    let (registry, mut orders) = watching_abc(&mut writer, &proxy.endpoint()).await;
    let before = registry.status();
    let old_id = before.cluster_id.expect("the old cluster's ID");
    let old_revision = before.revision.expect("a revision");
    assert_eq!(before.resets, 0, "{before:?}");

    // While the registry is cut off, the cluster is replaced and filled: b as it was, c
    // relabelled, d new, and other keys, past the revision the registry holds.
    proxy.cut();
    etcd.replace().await;
    let mut writer = etcd.client().await;
    put(&mut writer, "b", &record(2, r#""version": "1.0""#)).await;
    put(&mut writer, "c", &record(3, r#""version": "2.0""#)).await;
    put(&mut writer, "d", &record(4, "")).await;
    let mut revision = 0;
    for other in ["p1", "p2", "p3"] {
        revision = writer
            .put(format!("{PREFIX}/payments/{other}"), record(9, ""), None)
            .await
            .expect("put")
            .header()
            .expect("header")
            .revision();
    }
    assert!(revision > old_revision, "{revision} ≤ {old_revision}");
    proxy.restore();

    // The difference, removals first, each sorted by id: a and w (from `watching_abc`)
    // were only in the old cluster.
    assert_eq!(
        take(&mut orders, 4).await,
        [
            "-a",
            "-w",
            "+c 127.0.0.1:3 {version=2.0}",
            "+d 127.0.0.1:4 {}"
        ]
    );
    let status = registry.status();
    let new_id = status.cluster_id.expect("the new cluster's ID");
    assert_ne!(new_id, old_id, "{status:?}");
    assert_eq!(status.resets, 1, "{status:?}");
    assert_eq!(status.revision, Some(revision), "{status:?}");
    let warn = logs.line("etcd cluster changed").await;
    assert!(warn.contains("WARN"), "{warn}");
    let (old_hex, new_hex) = (format!("{old_id:x}"), format!("{new_id:x}"));
    assert!(
        warn.contains(&format!(r#"old_cluster_id=Some("{old_hex}")"#))
            && warn.contains(&format!(r#"new_cluster_id=Some("{new_hex}")"#)),
        "{warn}"
    );
    assert!(
        warn.contains(&format!(
            "the cluster ID changed from {old_hex} to {new_hex}"
        )),
        "{warn}"
    );

    // And it follows the new cluster from there.
    put(&mut writer, "z", &record(26, "")).await;
    assert_eq!(next(&mut orders).await, "+z 127.0.0.1:26 {}");
}
