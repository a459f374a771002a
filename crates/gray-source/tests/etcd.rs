//! etcd prefix sources against real etcd servers (the `etcd` binary, Debian package
//! `etcd-server`), started by the tests on free loopback ports: every fault of the
//! `gray_source::etcd` table, and the one that heals by itself.

mod support;

use std::time::Duration;

use gray_core::backoff::Backoff;
use gray_source::{
    Revision, Source, SourceError, Update,
    etcd::{EtcdConfig, EtcdSource},
};
use gray_test_support::{
    WAIT,
    etcd::{Cluster, Etcd, Proxy},
    net::closed_port,
};
use support::{Follow, describe, fast as config, reset_keys as keys};

const PREFIX: &str = "/gray/";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_is_listed_then_every_change_arrives_once_in_order() {
    let etcd = Etcd::start().await;
    etcd.put("/gray/a", "1").await;
    etcd.put("/gray/b", "2").await;
    let listed_at = etcd.put("/other", "not under the prefix").await;

    // The first endpoint has nothing listening: load and watch go on to the next one.
    let closed = closed_port();
    let dead = format!("http://{}", closed.addr());
    let source = EtcdSource::prefix(config([dead, etcd.endpoint()]), PREFIX);
    let snapshot = source
        .load()
        .await
        .expect("load through the second endpoint");
    assert_eq!(
        snapshot
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_slice()))
            .collect::<Vec<_>>(),
        [("/gray/a", &b"1"[..]), ("/gray/b", b"2")]
    );
    assert_eq!(
        snapshot.revision,
        Revision::Etcd {
            mod_revision: listed_at
        }
    );

    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a", "/gray/b"]);
    let status = follow.status();
    assert!(status.connected);
    assert_eq!(status.revision, Some(listed_at));
    assert_eq!(status.endpoint.as_deref(), Some(etcd.endpoint().as_str()));
    assert!(status.cluster_id.is_some());
    assert!(status.last_contact.is_some());
    assert_eq!(
        status.failures, 0,
        "the watch starts on the endpoint that answered the load"
    );

    // Bytes are handed out as they are: what they mean is the consumer's concern.
    let put = etcd.put("/gray/c", vec![0xff, 0x00, b'{']).await;
    let deleted = etcd.delete("/gray/a").await;
    match follow.next().await {
        Update::Put(entry) => {
            assert_eq!(entry.key, "/gray/c");
            assert_eq!(entry.value, [0xff, 0x00, b'{']);
            assert_eq!(entry.revision, Revision::Etcd { mod_revision: put });
        }
        other => panic!("expected the put, got {other:?}"),
    }
    assert_eq!(
        follow.next().await,
        Update::Delete {
            key: "/gray/a".into(),
            revision: Revision::Etcd {
                mod_revision: deleted
            }
        }
    );
    assert_eq!(follow.status().revision, Some(deleted));
    assert_eq!(follow.keys(), ["/gray/b", "/gray/c"]);
    // Once each: the next update is a new change.
    follow.assert_next_is_marker(&etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_where_it_left_without_a_reset() {
    let mut etcd = Etcd::start().await;
    etcd.put("/gray/a", "1").await;
    let source = EtcdSource::prefix(config([etcd.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);

    etcd.kill().await;
    follow.lost().await;
    etcd.restart().await;
    // Written while the watch may still be reconnecting: it resumes from its revision.
    etcd.put("/gray/b", "2").await;
    etcd.delete("/gray/a").await;
    let b = follow.next().await;
    let a = follow.next().await;
    assert_eq!(
        (describe(&b), describe(&a)),
        ("put /gray/b".into(), "delete /gray/a".into())
    );
    assert_eq!(follow.keys(), ["/gray/b"]);
    let status = follow.status();
    assert!(status.connected);
    assert_eq!(status.resets, 0);
    follow.assert_next_is_marker(&etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_compacted_while_away_are_listed_again() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    etcd.put("/gray/a", "1").await;
    let source = EtcdSource::prefix(config([proxy.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);

    proxy.cut();
    follow.lost().await;
    etcd.put("/gray/b", "2").await;
    etcd.delete("/gray/a").await;
    let last = etcd.put("/gray/c", "3").await;
    etcd.compact(last).await;
    proxy.restore();

    // The changes are gone from etcd's history: the whole prefix, again.
    let update = follow.next().await;
    assert_eq!(keys(&update), ["/gray/b", "/gray/c"]);
    assert_eq!(follow.status().revision, Some(last));
    assert_eq!(
        follow.status().resets,
        0,
        "a compaction is not a reset cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restarted_without_its_data_converges_to_the_new_keys() {
    let mut etcd = Etcd::start().await;
    for key in ["a", "b", "c"] {
        etcd.put(&format!("/gray/{key}"), "old").await;
    }
    let source = EtcdSource::prefix(config([etcd.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(
        keys(&follow.next().await),
        ["/gray/a", "/gray/b", "/gray/c"]
    );

    // Same name, same URLs, same cluster ID; revisions start again from 1. Without the
    // checks, the watch would resume from revision 5 and see nothing before it.
    etcd.restart_empty().await;
    etcd.put("/gray/x", "new").await;
    etcd.put("/gray/y", "new").await;
    let seen = follow
        .until("exactly the new keys", |held| {
            held.keys().eq(["/gray/x", "/gray/y"].iter())
        })
        .await;
    let reset = seen
        .iter()
        .position(|u| matches!(u, Update::Reset(_)))
        .unwrap_or_else(|| {
            panic!(
                "no reset in {:?}",
                seen.iter().map(describe).collect::<Vec<_>>()
            )
        });
    for update in &seen[reset..] {
        let text = describe(update);
        assert!(
            !["/gray/a", "/gray/b", "/gray/c"]
                .iter()
                .any(|old| text.contains(old)),
            "a deleted key came back: {text}"
        );
    }
    assert!(follow.status().resets >= 1, "{:?}", follow.status());

    // And it goes on from there.
    etcd.put("/gray/z", "new").await;
    assert_eq!(describe(&follow.next().await), "put /gray/z");
    assert_eq!(follow.keys(), ["/gray/x", "/gray/y", "/gray/z"]);
    follow.assert_next_is_marker(&etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_cluster_past_the_old_revision_is_caught_by_its_history() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    etcd.put("/gray/a", "old").await;
    etcd.put("/gray/b", "old").await;
    let source = EtcdSource::prefix(config([proxy.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a", "/gray/b"]);

    // While the watch is away, the cluster restarts empty and gets more revisions than
    // were handed out (same cluster ID, same raft term): its revision tells nothing. The
    // instance `a` registers again, last: a creation of a key held.
    proxy.cut();
    follow.lost().await;
    etcd.restart_empty().await;
    for key in ["n1", "n2", "n3", "a"] {
        etcd.put(&format!("/gray/{key}"), "new").await;
    }
    proxy.restore();

    let seen = follow
        .until("exactly the new keys", |held| {
            held.keys()
                .eq(["/gray/a", "/gray/n1", "/gray/n2", "/gray/n3"].iter())
        })
        .await;
    assert!(
        seen.iter().any(|u| matches!(u, Update::Reset(_))),
        "{:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(follow.held["/gray/a"], b"new");
    assert!(follow.status().resets >= 1);
}

/// A member that stops answering without closing its connection (SIGSTOP), watched with
/// the config `make` builds for the cluster's endpoints: changes written through another
/// member arrive all the same.
async fn a_frozen_member_is_left_for_another(make: impl FnOnce(Vec<String>) -> EtcdConfig) {
    let cluster = Cluster::start(3).await;
    cluster.member(1).put("/gray/a", "1").await;
    let source = EtcdSource::prefix(make(cluster.endpoints()), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);
    let frozen_endpoint = cluster.member(0).endpoint();
    assert_eq!(
        follow.status().endpoint.as_deref(),
        Some(frozen_endpoint.as_str())
    );

    let _frozen = cluster.freeze(0); // continued when dropped, also on failure
    cluster.member(1).put("/gray/b", "2").await;
    assert_eq!(describe(&follow.next().await), "put /gray/b");
    let status = follow.status();
    assert_ne!(status.endpoint.as_deref(), Some(frozen_endpoint.as_str()));
    assert!(status.failures >= 1 && status.connected, "{status:?}");
    assert_eq!(status.resets, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_is_left_at_the_progress_deadline() {
    // No HTTP/2 keep-alive: the progress deadline alone notices the silence.
    let cluster_config = |endpoints: Vec<String>| {
        config(endpoints)
            .with_keep_alive(None)
            .with_progress_deadline(Some(Duration::from_secs(3)))
    };
    a_frozen_member_is_left_for_another(cluster_config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_is_left_by_keep_alive() {
    // No progress deadline: the unanswered HTTP/2 pings drop the connection.
    let cluster_config = |endpoints: Vec<String>| {
        config(endpoints)
            .with_keep_alive(Some((Duration::from_secs(1), Duration::from_secs(1))))
            .with_progress_deadline(None)
    };
    a_frozen_member_is_left_for_another(cluster_config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_change_after_an_outage_arrives_without_a_backoff_sleep() {
    // Every failed attempt waits the cap, 10 s. A stream that slept its backoff once more
    // after reconnecting would deliver the change after the restart about 10 s after it
    // was written; it is waited for 8 s. Not a latency figure: the two outcomes are 10 s
    // apart, and a change arrives within milliseconds (the freshness bench measures it).
    const CAP: Duration = Duration::from_secs(10);
    const PROMPTLY: Duration = Duration::from_secs(8);
    let mut etcd = Etcd::start().await;
    etcd.put("/gray/a", "1").await;
    let config =
        EtcdConfig::new([etcd.endpoint()]).with_backoff(Backoff::new(CAP, CAP).without_jitter());
    let source = EtcdSource::prefix(config, PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);

    etcd.kill().await;
    follow.lost().await;
    etcd.restart().await;
    // The next attempt, one backoff sleep after the failure, reconnects.
    follow
        .status_within(CAP * 3, "the reconnection", |s| s.connected)
        .await;
    etcd.put("/gray/b", "2").await;
    assert_eq!(describe(&follow.next_within(PROMPTLY).await), "put /gray/b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_log_in_and_wrong_ones_say_so() {
    let etcd = Etcd::start_auth("gray", "secret").await;
    etcd.put("/gray/a", "1").await;

    let good = EtcdSource::prefix(
        config([etcd.endpoint()]).with_user("gray", "secret"),
        PREFIX,
    );
    assert_eq!(good.load().await.expect("logged in").entries.len(), 1);
    let mut follow = Follow::start(&good);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);
    etcd.put("/gray/b", "2").await;
    assert_eq!(describe(&follow.next().await), "put /gray/b");

    for (config, expected) in [
        (
            config([etcd.endpoint()]).with_user("gray", "wrong"),
            "authentication failed",
        ),
        (config([etcd.endpoint()]), "user name is empty"),
    ] {
        let source = EtcdSource::prefix(config, PREFIX);
        let error = tokio::time::timeout(WAIT, source.load())
            .await
            .expect("a clear error, not a hang")
            .expect_err("refused");
        assert!(matches!(error, SourceError::Etcd { .. }), "{error:?}");
        let text = error.to_string();
        assert!(text.contains(expected), "{text}");
        assert!(text.contains("(check the user and password)"), "{text}");

        // A watch says so in its status, and hands out nothing.
        let mut follow = Follow::start(&source);
        let status = follow.status_until("the refusal", |s| s.failures > 0).await;
        assert!(!status.connected);
        assert!(
            status
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains(expected)),
            "{status:?}"
        );
        // It tries again, and still hands out nothing.
        follow
            .assert_nothing_after_failures(status.failures + 1)
            .await;
    }
}

#[tokio::test]
async fn load_without_endpoints_is_a_configuration_error() {
    let error = EtcdSource::key(EtcdConfig::new(Vec::<String>::new()), "/k")
        .load()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::Config {
                field: "endpoints",
                ..
            }
        ),
        "{error:?}"
    );
}
