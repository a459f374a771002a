//! What an etcd watch does when it connects again, against real etcd servers: the keys at
//! the revision handed out are listed again (keys only) and compared, so a store that lost
//! its data and was written past that revision while the watch was away is caught; the
//! watch starts on the endpoint that answered the load; a plain-text endpoint on a TLS
//! member says so.

mod support;

use std::time::Duration;

use gray_source::{
    Source,
    etcd::{EtcdConfig, EtcdSource},
};
use gray_test_support::etcd::{Etcd, Proxy};
use support::{Follow, describe, fast as config, reset_keys as keys};

const PREFIX: &str = "/gray/";

/// The blind spot. While the watch is away, the store loses its data and comes back
/// with the same cluster ID (same name, URLs and cluster token), and is written past the
/// revision handed out, with keys the watch does not hold only: nothing in a response
/// header tells, and no event contradicts what is held. The keys listed again at the
/// revision handed out do: the first update after the reconnection is a reset with exactly
/// the new keys, so the deleted ones leave at once, not when one of them is written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_rebuilt_past_the_old_revision_while_away_loses_its_old_keys_at_reconnection() {
    let mut etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    etcd.put("/gray/a", "old").await;
    etcd.put("/gray/b", "old").await;
    let handed = etcd.put("/gray/a", "old, changed").await;
    let source = EtcdSource::prefix(config([proxy.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a", "/gray/b"]);
    let before = follow.status();
    assert_eq!(before.revision, Some(handed));
    let cluster = before.cluster_id.expect("a cluster ID");

    proxy.cut();
    follow.lost().await;
    etcd.restart_empty().await;
    let mut written = Vec::new();
    let mut revision = 0;
    for i in 0.. {
        let key = format!("/gray/n{i}");
        revision = etcd.put(&key, "new").await;
        written.push(key);
        if revision > handed + 1 {
            break;
        }
    }
    proxy.restore();

    let update = follow.next().await;
    assert_eq!(
        keys(&update),
        written,
        "the first update after the reconnection"
    );
    assert_eq!(follow.keys(), written);
    let status = follow.status();
    assert_eq!(status.cluster_id, Some(cluster), "the same cluster ID");
    assert_eq!(status.revision, Some(revision));
    assert_eq!(status.resets, 1, "{status:?}");

    // And it watches the new store from there.
    etcd.delete("/gray/n0").await;
    assert_eq!(describe(&follow.next().await), "delete /gray/n0");
    follow.assert_next_is_marker(&etcd).await;
}

/// The same check finds nothing wrong in a store that kept its data: the changes made
/// while the watch was away (a key held deleted, one changed, one created) arrive one by
/// one from the revision handed out + 1, with no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_while_away_arrive_one_by_one_without_a_reset() {
    let etcd = Etcd::start().await;
    let proxy = Proxy::start(etcd.addr()).await;
    for key in ["a", "b", "c"] {
        etcd.put(&format!("/gray/{key}"), "1").await;
    }
    let source = EtcdSource::prefix(config([proxy.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(
        keys(&follow.next().await),
        ["/gray/a", "/gray/b", "/gray/c"]
    );

    proxy.cut();
    follow.lost().await;
    etcd.delete("/gray/a").await;
    etcd.put("/gray/b", "2").await;
    etcd.put("/gray/d", "1").await;
    proxy.restore();

    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(&follow.next().await));
    }
    assert_eq!(seen, ["delete /gray/a", "put /gray/b", "put /gray/d"]);
    assert_eq!(follow.keys(), ["/gray/b", "/gray/c", "/gray/d"]);
    assert_eq!(follow.held["/gray/b"], b"2");
    let status = follow.status();
    assert!(status.connected && status.failures >= 1, "{status:?}");
    assert_eq!(status.resets, 0, "{status:?}");
    follow.assert_next_is_marker(&etcd).await;
}

/// The first endpoint accepts connections and never answers (a black hole: a bound
/// listener that nobody accepts on). The load waits for its request timeout, then lists
/// through the second endpoint; the watch started afterwards starts there, where the
/// old watch started on the first endpoint again and followed changes only after another
/// request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_starts_on_the_endpoint_that_answered_the_load() {
    // Longer than the bound below: a watch that tried the black hole first would miss it.
    const TIMEOUT: Duration = Duration::from_secs(6);
    const PROMPTLY: Duration = Duration::from_secs(5);
    let etcd = Etcd::start().await;
    etcd.put("/gray/a", "1").await;
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let silent = format!("http://{}", black_hole.local_addr().expect("its address"));
    let config = EtcdConfig::new([silent, etcd.endpoint()])
        .with_connect_timeout(TIMEOUT)
        .with_request_timeout(TIMEOUT);
    let source = EtcdSource::prefix(config, PREFIX);
    let loaded = source
        .load()
        .await
        .expect("loaded through the second endpoint");
    assert_eq!(loaded.entries.len(), 1);

    let started = tokio::time::Instant::now();
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next_within(PROMPTLY).await), ["/gray/a"]);
    etcd.put("/gray/b", "2").await;
    assert_eq!(describe(&follow.next_within(PROMPTLY).await), "put /gray/b");
    eprintln!(
        "a change made right after the watch started arrived {:?} after its start",
        started.elapsed()
    );
    let status = follow.status();
    assert_eq!(status.endpoint.as_deref(), Some(etcd.endpoint().as_str()));
    assert_eq!(
        status.failures, 0,
        "the black hole was not tried: {status:?}"
    );
    drop(black_hole);
}

/// An `http://` endpoint pointed at a member that serves TLS only: the member closes the
/// connection, and the error says that it may be a TLS member, in the load's error and in
/// the watch's status. A member killed under an established watch closes it too, but that
/// is no reason to suspect TLS: no hint then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_text_endpoint_on_a_tls_member_hints_at_tls() {
    const HINT: &str = "it may be a TLS member; use https:// with the TLS settings";
    let tls = Etcd::start_tls().await;
    let plain = tls.endpoint().replacen("https://", "http://", 1);
    let source = EtcdSource::key(config([plain.clone()]), "/gray/rules");
    let error = source.load().await.expect_err("plain text to a TLS member");
    let text = error.to_string();
    assert!(
        text.contains(&format!("at {plain} on a new plain-text connection failed")),
        "{text}"
    );
    assert!(text.contains(HINT), "{text}");

    let follow = Follow::start(&source);
    let status = follow.status_until("the failure", |s| s.failures > 0).await;
    let last = status.last_error.unwrap_or_default();
    assert!(last.contains(HINT), "{last}");
    drop(follow);

    let mut etcd = Etcd::start().await;
    etcd.put("/gray/a", "1").await;
    let source = EtcdSource::prefix(config([etcd.endpoint()]), PREFIX);
    let mut follow = Follow::start(&source);
    assert_eq!(keys(&follow.next().await), ["/gray/a"]);
    etcd.kill().await;
    let status = follow.lost().await;
    let last = status.last_error.unwrap_or_default();
    assert!(!last.contains("TLS"), "{last}");
}
