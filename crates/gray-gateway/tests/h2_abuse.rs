//! HTTP/2 abuse from a raw-frame client (issue 22), against the gateway binary on loopback,
//! each attack while well-behaved HTTP/1.1 and HTTP/2 clients are served: what the attack
//! costs the gateway is measured at the upstream (connections accepted, requests
//! forwarded) and in /proc (memory, descriptors). The figures print with `--nocapture`;
//! the README records them beside nginx's.

mod abuse;

use std::sync::atomic::Ordering;

use abuse::{Gateway, Probe, attack, upstream};

/// Streams opened and reset at once, paced, from 10 connections: each reset stream's
/// request may reach the upstream, but a cancelled request costs no connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_open_and_reset_streams_cost_no_upstream_connection_each() {
    let (upstream, counts) = upstream().await;
    let gateway = Gateway::start(upstream, "", None).await;
    let probe = Probe::start(gateway.addr);
    let summary = attack(
        "reset",
        gateway.addr,
        "/svc/x",
        &["--connections", "10", "--rate", "200", "--seconds", "5"],
    )
    .await;
    let seen = probe.stop().await;
    let accepted = counts.accepted.load(Ordering::SeqCst);
    let forwarded = counts.requests.load(Ordering::SeqCst);
    let probed = seen.statuses.len() + seen.errors.len();
    println!(
        "reset attack: {summary}; upstream connections {accepted}, requests forwarded \
         {forwarded} ({probed} of them the probes'); probes' p99 {:?}",
        seen.p99
    );
    assert!(seen.errors.is_empty(), "probes failed: {:?}", &seen.errors[..seen.errors.len().min(5)]);
    assert!(seen.statuses.iter().all(|s| *s == 200), "probes got non-200 answers");
    assert!(
        accepted <= 2 * forwarded + 16,
        "{accepted} upstream connections for {forwarded} forwarded requests"
    );
}
