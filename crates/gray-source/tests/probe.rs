use std::time::{Duration, Instant};
use etcd_client::{Client, ConnectOptions, WatchOptions};
use gray_test_support::etcd::{Etcd, Cluster};

fn hdr(h: Option<&etcd_client::ResponseHeader>) -> String {
    h.map(|h| format!("cluster={:x} member={:x} rev={} term={}", h.cluster_id(), h.member_id(), h.revision(), h.raft_term())).unwrap_or_default()
}

#[tokio::test]
async fn probe_reset() {
    let mut etcd = Etcd::start().await;
    for i in 0..5 { etcd.put(&format!("/p/{i}"), "x").await; }
    let mut c = etcd.client().await;
    let r = c.get("/p/", None).await.unwrap();
    println!("before: {}", hdr(r.header()));
    let mut w = c.watch("/p/", Some(WatchOptions::new().with_prefix().with_start_revision(7))).await.unwrap();
    let m = w.message().await.unwrap().unwrap();
    println!("created: {} created={} id={}", hdr(m.header()), m.created(), m.watch_id());
    w.request_progress().await.unwrap();
    let m = w.message().await.unwrap().unwrap();
    println!("progress: {} created={} id={} events={}", hdr(m.header()), m.created(), m.watch_id(), m.events().len());
    etcd.restart().await;
    let mut c = etcd.client().await;
    let r = c.get("/p/", None).await.unwrap();
    println!("after restart: {}", hdr(r.header()));
    etcd.restart_empty().await;
    let mut c = etcd.client().await;
    let r = c.get("/p/", None).await.unwrap();
    println!("after empty: {}", hdr(r.header()));
    let mut w = c.watch("/p/", Some(WatchOptions::new().with_prefix().with_start_revision(7))).await.unwrap();
    let m = w.message().await.unwrap().unwrap();
    println!("created on empty from 7: {} created={} id={} canceled={} compact={}", hdr(m.header()), m.created(), m.watch_id(), m.canceled(), m.compact_revision());
    for i in 0..8 { etcd.put(&format!("/p/n{i}"), "y").await; }
    for _ in 0..3 {
        match tokio::time::timeout(Duration::from_secs(1), w.message()).await {
            Ok(Ok(Some(m))) => println!("msg: {} events={:?}", hdr(m.header()), m.events().iter().map(|e| { let kv = e.kv().unwrap(); (kv.key_str().unwrap().to_owned(), kv.mod_revision(), kv.version()) }).collect::<Vec<_>>()),
            other => { println!("other: {:?}", other.map(|r| r.map(|_|()))); break }
        }
    }
    // down endpoint
    etcd.kill().await;
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1)).with_timeout(Duration::from_secs(3));
    let t = Instant::now();
    let c = Client::connect([etcd.endpoint()], Some(opts.clone())).await;
    println!("connect to dead: {:?} after {:?}", c.as_ref().err(), t.elapsed());
    if let Ok(mut c) = c {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), c.get("/p/", None)).await;
        println!("get on dead: {:?} after {:?}", r.map(|r| r.err()), t.elapsed());
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), c.watch("/p/", None)).await;
        println!("watch on dead: {:?} after {:?}", r.map(|r| r.err()), t.elapsed());
    }
}

#[tokio::test]
async fn probe_frozen() {
    let cluster = Cluster::start(3).await;
    let eps = cluster.endpoints();
    println!("eps {eps:?}");
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(1)).with_timeout(Duration::from_secs(3));
    let mut c = Client::connect([&eps[0]], Some(opts.clone())).await.unwrap();
    let r = c.get("/p/", None).await.unwrap();
    println!("m0: {}", hdr(r.header()));
    let mut w = c.watch("/p/", Some(WatchOptions::new().with_prefix())).await.unwrap();
    let _ = w.message().await;
    let frozen = cluster.freeze(0);
    let t = Instant::now();
    w.request_progress().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(3), w.message()).await;
    println!("progress on frozen: {:?} after {:?}", r.is_ok(), t.elapsed());
    let t = Instant::now();
    let c2 = Client::connect([&eps[0]], Some(opts.clone())).await;
    println!("connect to frozen: {:?} after {:?}", c2.as_ref().err(), t.elapsed());
    if let Ok(mut c2) = c2 {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), c2.get("/p/", None)).await;
        println!("get on frozen: {:?} after {:?}", r.map(|r| r.err()), t.elapsed());
    }
    let t = Instant::now();
    cluster.member(1).put("/p/a", "1").await;
    println!("put via m1 after {:?}", t.elapsed());
    drop(frozen);
}
