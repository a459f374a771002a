//! Passive health: which errors eject an endpoint, for how long, and what happens when
//! every endpoint is ejected.

use super::*;

#[tokio::test(start_paused = true)]
async fn connection_errors_eject_with_growing_backoff() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(2, 1, 10));
    let h = Harness::new(layer);
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(100);
    gray.allow(100);
    settle(|| h.balance.len() == 2).await;
    let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
    let gray_ctx = Stain::in_lane(Lane::new("gray").unwrap());

    // Two connection errors in a row eject g1.
    for _ in 0..2 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_error(refused());
        });
        assert!(answer.is_err());
    }
    settle(|| h.balance.ready_len() == 1).await;
    let explained = h.balance.explain(Some(&gray_ctx));
    assert!(
        explained.fallback_taken(),
        "the ejected instance counts as absent"
    );
    assert_eq!(explained.candidates().unwrap(), ["b1"]);
    let serve_base = async {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut base).await.send_response("b1");
        });
        assert_eq!(answer.unwrap(), "b1");
    };
    serve_base.await;

    // After the first backoff (1 s), g1 is back; two more errors eject it for 2 s.
    tokio::time::sleep(Duration::from_millis(1001)).await;
    settle(|| h.balance.ready_len() == 2).await;
    for _ in 0..2 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_error(refused());
        });
        assert!(answer.is_err());
    }
    settle(|| h.balance.ready_len() == 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.balance.ready_len(), 1, "still out after 1.5 s");
    tokio::time::sleep(Duration::from_millis(600)).await;
    settle(|| h.balance.ready_len() == 2).await;
    let (answer, ()) = tokio::join!(h.call(gray_req()), async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
}

#[tokio::test(start_paused = true)]
async fn other_errors_do_not_eject() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(1, 1, 1));
    let h = Harness::new(layer);
    let mut gray = h.add("g1", &[("gray", "true")]);
    gray.allow(100);
    settle(|| h.balance.len() == 1).await;
    for _ in 0..3 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            let send = next(&mut gray).await;
            send.send_error(io::Error::from(io::ErrorKind::InvalidData));
        });
        assert!(answer.is_err());
        tokio::task::yield_now().await;
        assert_eq!(h.balance.ready_len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn all_ejected_is_unroutable_until_readmitted() {
    let layer = BalanceLayer::new("svc-b", Policy::new())
        .with_ejection(ejection(1, 5, 5))
        .with_pick(Pick::RoundRobin);
    let h = Harness::new(layer);
    let mut only = h.add("b1", &[]);
    only.allow(100);
    settle(|| h.balance.len() == 1).await;
    let (answer, ()) = tokio::join!(h.call(base_req()), async {
        let send = next(&mut only).await;
        send.send_error(io::Error::from(io::ErrorKind::ConnectionReset));
    });
    assert!(answer.is_err());
    settle(|| h.balance.ready_len() == 0).await;
    let err = unroutable(h.call(base_req()).await.unwrap_err());
    assert_eq!(
        err.reason(),
        &UnroutableReason::NoMatch,
        "ejected counts as absent"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle(|| h.balance.ready_len() == 1).await;
}
