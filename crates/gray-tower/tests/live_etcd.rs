//! Live rules from one etcd key, against real etcd servers (the `etcd` binary, Debian
//! package `etcd-server`) started by the tests on free loopback ports: the faults of
//! `gray_source::etcd`, seen through `LiveRules`.

use std::time::Duration;

use gray_core::backoff::Backoff;
use gray_rules::Format;
use gray_test_support::{
    WAIT,
    etcd::{Cluster, Etcd},
};
use gray_tower::edge::{
    EtcdConfig, EtcdSource, LiveRules, Revision, RuleSourceError, RulesStatus, WatchHandle,
};
use tokio::sync::watch;

const KEY: &str = "/gray/rules";

fn rules(name: &str) -> String {
    format!(r#"{{"rules":[{{"name":"{name}","lane":"gray"}}]}}"#)
}

fn config(endpoints: impl IntoIterator<Item = String>) -> EtcdConfig {
    EtcdConfig::new(endpoints)
        .with_backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
        .with_request_timeout(Duration::from_secs(2))
}

fn name(live: &LiveRules) -> Option<String> {
    live.load().rules().rules()[0].name().map(str::to_owned)
}

/// Waits (bounded by `within`) until the rules' status satisfies `ok`.
async fn wait_for(
    rx: &mut watch::Receiver<RulesStatus>,
    within: Duration,
    what: &str,
    ok: impl Fn(&RulesStatus) -> bool,
) -> RulesStatus {
    let waited = match tokio::time::timeout(within, rx.wait_for(|s| ok(s))).await {
        Ok(Ok(status)) => Some(status.clone()),
        _ => None,
    };
    waited.unwrap_or_else(|| panic!("timed out waiting for {what}: {:?}", *rx.borrow()))
}

/// Waits (bounded by `within`) until the source's status satisfies `ok`.
async fn source_status(
    watch: &WatchHandle,
    within: Duration,
    what: &str,
    ok: impl Fn(&gray_source::Status) -> bool,
) -> gray_source::Status {
    let mut rx = watch.status_handle().subscribe();
    let waited = match tokio::time::timeout(within, rx.wait_for(|s| ok(s))).await {
        Ok(Ok(status)) => Some(status.clone()),
        _ => None,
    };
    waited.unwrap_or_else(|| panic!("timed out waiting for {what}: {:?}", watch.status()))
}

/// Rules read from `source` and followed, once the watch runs: what a gateway does.
async fn follow(source: &EtcdSource) -> (LiveRules, watch::Receiver<RulesStatus>, WatchHandle) {
    let live = LiveRules::from_source(source, Format::Json)
        .await
        .expect("first load");
    let rx = live.subscribe();
    let watch = live.follow(source, Format::Json);
    source_status(&watch, WAIT, "watching", |s| s.connected).await;
    (live, rx, watch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_key_reloads_rejects_and_survives_a_restart() {
    let mut etcd = Etcd::start().await;
    let source = EtcdSource::key(config([etcd.endpoint()]), KEY);

    // No key yet: the first load says so.
    let err = LiveRules::from_source(&source, Format::Json)
        .await
        .unwrap_err();
    assert!(matches!(err, RuleSourceError::Missing(_)), "{err:?}");
    assert!(err.to_string().contains("/gray/rules"), "{err}");
    // No format and no extension: the first load says so too.
    etcd.put(KEY, rules("one")).await;
    let err = LiveRules::from_source(&source, None).await.unwrap_err();
    assert!(matches!(err, RuleSourceError::UnknownFormat(_)), "{err:?}");

    let rev1 = etcd.put(KEY, rules("one")).await;
    let live = LiveRules::from_source(&source, Format::Json)
        .await
        .expect("first load");
    assert_eq!(
        live.status().revision,
        Revision::Etcd { mod_revision: rev1 }
    );
    let mut rx = live.subscribe();
    let watch = live.follow(&source, Format::Json);

    // A put is picked up.
    let rev2 = etcd.put(KEY, rules("two")).await;
    let s = wait_for(&mut rx, WAIT, "version two", |s| s.generation == 2).await;
    assert_eq!(s.revision, Revision::Etcd { mod_revision: rev2 });
    assert_eq!(name(&live).as_deref(), Some("two"));
    assert_eq!(watch.status().revision, Some(rev2));

    // An invalid put is rejected; two stays.
    etcd.put(
        KEY,
        r#"{"rules":[{"name":"bad","lane":"no spaces allowed"}]}"#,
    )
    .await;
    let s = wait_for(&mut rx, WAIT, "the rejection", |s| s.rejected == 1).await;
    assert_eq!(s.generation, 2);
    let err = s.last_error.expect("error");
    assert!(
        err.starts_with("etcd key /gray/rules:1:50: rules[0] (\"bad\"), field `lane`"),
        "{err}"
    );
    assert_eq!(name(&live).as_deref(), Some("two"));

    // A delete changes nothing.
    etcd.delete(KEY).await;
    let s = wait_for(&mut rx, WAIT, "the delete warning", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("was deleted"))
    })
    .await;
    assert_eq!(s.generation, 2);

    // etcd goes away and comes back (same data, same ports): the watch resumes, picking up
    // a version written while it was reconnecting.
    etcd.kill().await;
    wait_for(&mut rx, WAIT, "the connection loss", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("etcd ") && e.contains(" failed"))
    })
    .await;
    etcd.restart().await;
    let rev3 = etcd.put(KEY, rules("three")).await;
    let s = wait_for(&mut rx, WAIT, "version three", |s| s.generation == 3).await;
    assert_eq!(s.revision, Revision::Etcd { mod_revision: rev3 });
    assert_eq!(name(&live).as_deref(), Some("three"));
    assert_eq!(s.rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_follow_a_cluster_restarted_without_its_data() {
    let mut etcd = Etcd::start().await;
    for n in 0..5 {
        etcd.put(&format!("/gray/other/{n}"), "x").await;
    }
    etcd.put(KEY, rules("old")).await;
    let source = EtcdSource::key(config([etcd.endpoint()]), KEY);
    let (live, mut rx, watch) = follow(&source).await;

    // The new cluster's revisions start again from 1: the new version's revision (2) is
    // below the old one's (7). Resuming from 8 would skip it forever.
    etcd.restart_empty().await;
    etcd.put(KEY, rules("fresh")).await;
    let s = wait_for(&mut rx, WAIT, "the fresh version", |s| s.generation == 2).await;
    assert_eq!(s.revision, Revision::Etcd { mod_revision: 2 });
    assert_eq!(name(&live).as_deref(), Some("fresh"));
    assert!(watch.status().resets >= 1, "{:?}", watch.status());

    // The old version never comes back; later ones arrive.
    etcd.put(KEY, rules("later")).await;
    let s = wait_for(&mut rx, WAIT, "a later version", |s| s.generation == 3).await;
    assert_eq!(name(&live).as_deref(), Some("later"));
    assert_eq!(s.rejected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_follow_through_a_frozen_member() {
    let cluster = Cluster::start(3).await;
    cluster.member(1).put(KEY, rules("one")).await;
    // The progress deadline, short for the test; no keep-alive, which would also notice.
    let config = config(cluster.endpoints())
        .with_keep_alive(None)
        .with_progress_deadline(Some(Duration::from_secs(3)));
    let source = EtcdSource::key(config, KEY);
    let (live, mut rx, watch) = follow(&source).await;
    let frozen = cluster.member(0).endpoint();
    assert_eq!(watch.status().endpoint.as_deref(), Some(frozen.as_str()));

    let _frozen = cluster.freeze(0); // continued when dropped, also on failure
    cluster.member(2).put(KEY, rules("two")).await;
    wait_for(&mut rx, WAIT, "version two", |s| s.generation == 2).await;
    assert_eq!(name(&live).as_deref(), Some("two"));
    let s = watch.status();
    assert_ne!(s.endpoint.as_deref(), Some(frozen.as_str()));
    assert!(s.failures >= 1, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_arrive_promptly_after_an_outage() {
    // Every failed attempt waits the cap, 10 s; a version after the reconnection that
    // waited a backoff once more would arrive about 10 s after it was written: it is
    // waited for 8 s (see gray-source's test of the same name).
    const CAP: Duration = Duration::from_secs(10);
    const PROMPTLY: Duration = Duration::from_secs(8);
    let mut etcd = Etcd::start().await;
    etcd.put(KEY, rules("one")).await;
    let config =
        EtcdConfig::new([etcd.endpoint()]).with_backoff(Backoff::new(CAP, CAP).without_jitter());
    let source = EtcdSource::key(config, KEY);
    let (live, mut rx, watch) = follow(&source).await;

    etcd.kill().await;
    source_status(&watch, WAIT, "the failure", |s| !s.connected).await;
    etcd.restart().await;
    source_status(&watch, CAP * 3, "the reconnection", |s| s.connected).await;
    etcd.put(KEY, rules("two")).await;
    wait_for(&mut rx, PROMPTLY, "version two", |s| s.generation == 2).await;
    assert_eq!(name(&live).as_deref(), Some("two"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_with_a_password_and_wrong_ones() {
    let etcd = Etcd::start_auth("gray", "secret").await;
    etcd.put(KEY, rules("one")).await;

    let good = EtcdSource::key(config([etcd.endpoint()]).with_user("gray", "secret"), KEY);
    let live = LiveRules::from_source(&good, Format::Json)
        .await
        .expect("logged in");
    let mut rx = live.subscribe();
    let _watch = live.follow(&good, Format::Json);
    etcd.put(KEY, rules("two")).await;
    wait_for(&mut rx, WAIT, "version two", |s| s.generation == 2).await;

    let wrong = EtcdSource::key(config([etcd.endpoint()]).with_user("gray", "wrong"), KEY);
    let err = tokio::time::timeout(WAIT, LiveRules::from_source(&wrong, Format::Json))
        .await
        .expect("a clear error, not a hang")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("authentication failed") && text.contains("check the user and password"),
        "{text}"
    );

    // Following with wrong credentials: the rules in force stay, the error shows.
    let watch = live.follow(&wrong, Format::Json);
    let s = wait_for(&mut rx, WAIT, "the refusal", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("authentication failed"))
    })
    .await;
    assert_eq!(s.generation, 2);
    assert!(!watch.status().connected);
}

#[cfg(feature = "etcd-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_over_tls_with_client_certificates() {
    use gray_test_support::etcd::Tls;
    use gray_tower::edge::EtcdTls;

    let etcd = Etcd::start_tls().await;
    let tls = etcd.tls().expect("a TLS member");
    etcd.put(KEY, rules("one")).await;
    let right = EtcdTls::ca_file(tls.ca_file())
        .with_identity_files(tls.client_cert_file(), tls.client_key_file());
    let source = EtcdSource::key(config([etcd.endpoint()]).with_tls(right), KEY);
    let live = LiveRules::from_source(&source, Format::Json)
        .await
        .expect("over TLS");
    let mut rx = live.subscribe();
    let _watch = live.follow(&source, Format::Json);
    etcd.put(KEY, rules("two")).await;
    wait_for(&mut rx, WAIT, "version two", |s| s.generation == 2).await;

    let other = Tls::generate();
    let wrong = EtcdTls::ca_pem(tls.ca_pem())
        .with_identity_pem(other.client_cert_pem(), other.client_key_pem());
    let source = EtcdSource::key(config([etcd.endpoint()]).with_tls(wrong), KEY);
    let err = tokio::time::timeout(WAIT, LiveRules::from_source(&source, Format::Json))
        .await
        .expect("a clear error, not a hang")
        .unwrap_err();
    assert!(err.to_string().contains("check the TLS settings"), "{err}");
}
