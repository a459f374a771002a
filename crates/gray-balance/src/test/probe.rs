//! Probing new endpoints: one request at a time until one answers.

use super::*;

/// Sends `n` requests one per second; returns who served them, in order.
async fn one_per_second(h: &Harness<Slow>, n: usize, gray: bool) -> Vec<&'static str> {
    let mut served = Vec::new();
    for _ in 0..n {
        let req = if gray { gray_req() } else { base_req() };
        served.push(h.balance.clone().oneshot(req).await.unwrap());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    served
}

#[tokio::test(start_paused = true)]
async fn a_new_endpoint_gets_traffic_at_one_request_per_second() {
    // The picks draw on this thread's generator: seeded, the outcome is fixed.
    gray_core::rand::seed_thread(17);
    for gray in [false, true] {
        let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
        let labels: &[(&str, &str)] = if gray { &[("gray", "true")] } else { &[] };
        h.send(slow("old", labels, 2));
        settle(|| h.balance.len() == 1).await;
        // The old endpoint is warm: measured, out of probing.
        assert!(
            one_per_second(&h, 5, gray)
                .await
                .iter()
                .all(|&n| n == "old")
        );

        // A new endpoint, as fast: it gets the very next request (N = 1), then its probes.
        h.send(slow("new", labels, 2));
        settle(|| h.balance.len() == 2).await;
        let served = one_per_second(&h, 203, gray).await;
        assert_eq!(served[..3], ["new"; 3], "gray={gray}: {served:?}");
        // Then both share the traffic: 200 requests between two endpoints as fast as each
        // other, 100 each, within 4 standard deviations of a fair coin's count (± 28). An
        // endpoint starved or favoured 2:1 (67 of 200) is far outside.
        let new = served[3..].iter().filter(|&&n| n == "new").count();
        assert!(
            new.abs_diff(100) <= 28,
            "gray={gray}: {new} of 200 to the new one"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_new_endpoint_gets_one_probe_at_a_time() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    h.send(slow("fast", &[], 1));
    settle(|| h.balance.len() == 1).await;
    one_per_second(&h, 3, false).await;
    h.send(slow("slow", &[], 500));
    settle(|| h.balance.len() == 2).await;
    // 20 concurrent requests: one probes the slow endpoint, the others go by load.
    let served =
        futures_util::future::join_all((0..20).map(|_| h.balance.clone().oneshot(base_req())))
            .await;
    let slow = served
        .iter()
        .filter(|r| *r.as_ref().unwrap() == "slow")
        .count();
    assert_eq!(slow, 1, "{served:?}");
}
