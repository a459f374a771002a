//! HTTP/2 abuse from a raw-frame client (issue 22), against the gateway binary on loopback,
//! each attack while well-behaved HTTP/1.1 and HTTP/2 clients are served: what the attack
//! costs the gateway is measured at the upstream (connections accepted, requests
//! forwarded) and in /proc (memory, descriptors). The figures print with `--nocapture`;
//! docs/performance.md records them beside nginx's.

mod abuse;

use std::sync::atomic::Ordering;

use abuse::{Gateway, Probe, attack, upstream};

/// Streams opened and reset at once, paced, from 10 connections: each reset stream's
/// request may reach the upstream, but a cancelled request costs no connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_open_and_reset_streams_cost_no_upstream_connection_each() {
    let (upstream, counts) = upstream().await;
    // No GOAWAY for cancelling (the next test's): the attack goes on to its end.
    let gateway = Gateway::start(upstream, "max_cancelled_streams_percent = 0\n", None).await;
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
    seen.assert_served(true);
    assert!(
        accepted <= 2 * forwarded + 16,
        "{accepted} upstream connections for {forwarded} forwarded requests"
    );
}

/// A connection whose client cancels most of its streams gets GOAWAY (`NO_ERROR`, after
/// the first window of 100 streams), while a client on another connection is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_cancels_most_of_its_streams_gets_goaway() {
    let (upstream, _) = upstream().await;
    let gateway = Gateway::start(upstream, "", None).await;
    let probe = Probe::start(gateway.addr);
    let summary = attack(
        "reset",
        gateway.addr,
        "/svc/x",
        &["--connections", "1", "--rate", "100", "--seconds", "20"],
    )
    .await;
    let seen = probe.stop().await;
    println!(
        "cancelling connection: {summary}; probes' p99 {:?}",
        seen.p99
    );
    // The GOAWAY frame itself may be lost to the client: the gateway closes the
    // connection once its streams are done, and resets it when the client writes on.
    assert_eq!(summary["ended_by_server"], 1, "{summary}");
    let codes = summary["goaway_codes"].as_array().unwrap();
    assert!(
        codes.iter().all(|c| c == 0),
        "a graceful GOAWAY (NO_ERROR): {summary}"
    );
    let opened = summary["opened"].as_u64().unwrap();
    assert!(opened < 400, "GOAWAY came after {opened} streams");
    seen.assert_served(true);
}

/// 2,000 streams that send their bodies a byte a second, from 10 connections, under a
/// 1,024-descriptor limit: the client's cap answers what it cannot take at once (429), the
/// body timeout cuts the rest (408) long before the upstream timeout, their upstream
/// connections close, and another client is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_streams_are_cut_at_the_body_timeout_while_others_are_served() {
    let (upstream, counts) = upstream().await;
    let limits = "trusted_proxies = [\"127.0.0.1/32\"]\nupstream_timeout_ms = 20000\n\
                  request_body_timeout_ms = 2000\nmax_in_flight_per_client = 200\n\
                  http2_max_concurrent_streams = 200\n";
    let gateway = Gateway::start(upstream, limits, Some(1024)).await;
    let fds_before = gateway.fds();
    let probe = Probe::start(gateway.addr);
    let summary = attack(
        "slow",
        gateway.addr,
        "/svc/upload",
        &[
            "--connections",
            "10",
            "--streams",
            "2000",
            "--seconds",
            "30",
            "--forwarded-for",
            abuse::ATTACKER,
        ],
    )
    .await;
    let seen = probe.stop().await;
    println!(
        "slow streams: {summary}; gateway descriptors {fds_before} before, {} after; \
         probes' p99 {:?} over {} requests",
        gateway.fds(),
        seen.p99,
        seen.statuses.len()
    );
    assert_eq!(summary["opened"], 2000, "{summary}");
    assert_eq!(
        summary["closed"], 2000,
        "every stream was answered or reset: {summary}"
    );
    // 200 in flight (the client's cap), cut at the body timeout; the rest refused at once.
    assert_eq!(summary["statuses"]["408"], 200, "{summary}");
    assert_eq!(summary["statuses"]["429"], 1800, "{summary}");
    let last = summary["last_closed"].as_f64().unwrap();
    assert!(
        last < 15.0,
        "the last slow stream was cut after {last} s, not at the body timeout"
    );
    seen.assert_served(true);
    // The upstream connections of the cut streams close.
    counts.until_open_at_most(16).await;
}

/// 200 streams (2 connections at the 100-stream cap) read the first MiB of a 4 MiB response
/// each, then never reopen their window: the gateway's memory grows by at most the
/// per-stream bound for each: the 64 KiB send buffer, and the upstream connection's 64 KiB
/// read buffer with the chunk taken from it. (With hyper's defaults, the limits before 0.3,
/// a stream held 747 KiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_readers_hold_a_bounded_amount_each() {
    let (upstream, _) = upstream().await;
    let limits = "http2_max_send_buf_size = 65536\nupstream_buffer_bytes = 65536\n";
    let gateway = Gateway::start(upstream, limits, None).await;
    let probe = Probe::start(gateway.addr);
    let before = gateway.rss();
    let mut child = abuse::python(
        "stall",
        gateway.addr,
        "/svc/big",
        &[
            "--connections",
            "2",
            "--streams",
            "200",
            "--window",
            "1048576",
            "--seconds",
            "60",
        ],
    )
    .spawn()
    .expect("python3 runs");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let ready = tokio::time::timeout(std::time::Duration::from_secs(90), lines.next_line())
        .await
        .expect("the streams stall in time")
        .unwrap()
        .expect("the attack printed its state");
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    let during = gateway.rss();
    drop(child.stdin.take());
    let _ = child.wait().await;
    let seen = probe.stop().await;
    let per_stream = during.saturating_sub(before) / 200;
    println!(
        "stalled readers: {ready}; gateway RSS {} MiB before, {} MiB with 200 stalled \
         streams ({} KiB a stream), {} MiB after they left; probes' p99 {:?}",
        before >> 20,
        during >> 20,
        per_stream >> 10,
        gateway.rss() >> 20,
        seen.p99
    );
    assert_eq!(ready["streams"], 200, "{ready}");
    assert_eq!(ready["statuses"]["200"], 200, "{ready}");
    seen.assert_served(false);
    assert!(
        // The bound (64 KiB + 2 × 64 KiB), with room for the allocator's slack.
        per_stream <= 320 * 1024,
        "{} KiB a stalled stream (RSS {before} → {during})",
        per_stream >> 10
    );
}

/// Streams that never open their receive window (1,000 over 10 connections): their
/// responses cannot move, so `send_timeout_ms` closes the connections, and the upstream
/// connections they held are released; another client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_open_their_window_are_closed_at_the_send_timeout() {
    let (upstream, counts) = upstream().await;
    let gateway = Gateway::start(upstream, "send_timeout_ms = 2000\n", None).await;
    let probe = Probe::start(gateway.addr);
    let mut child = abuse::python(
        "stall",
        gateway.addr,
        "/svc/big",
        &[
            "--connections",
            "10",
            "--streams",
            "1000",
            "--window",
            "0",
            "--seconds",
            "60",
        ],
    )
    .spawn()
    .expect("python3 runs");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(child.stdout.take().unwrap()));
    let mut next = async || {
        let line = tokio::time::timeout(std::time::Duration::from_secs(90), lines.next_line())
            .await
            .expect("the attack reports in time")
            .unwrap()
            .expect("the attack printed its state");
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let ready = next().await;
    let upstream_open = counts.open.load(Ordering::SeqCst);
    // The gateway closes every connection: the attack ends by itself.
    let closed = next().await;
    let seen = probe.stop().await;
    println!(
        "zero windows: {ready}; then {closed}; upstream connections open while they \
         stalled {upstream_open}; probes' p99 {:?}",
        seen.p99
    );
    assert_eq!(ready["streams"], 1000, "{ready}");
    assert_eq!(closed["closed_by_server"], 10, "{closed}");
    seen.assert_served(true);
    counts.until_open_at_most(16).await;
}
