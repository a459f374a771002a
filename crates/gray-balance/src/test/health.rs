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
    let reset = || io::Error::from(io::ErrorKind::ConnectionReset);
    let gray_ctx = Stain::in_lane(Lane::new("gray").unwrap());

    // Two connection errors in a row eject g1.
    for _ in 0..2 {
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_error(reset());
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
            next(&mut gray).await.send_error(reset());
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

/// Which of `g1` and `g2` got the next request; it answers `error` if given, else its
/// name.
async fn answer_either(
    g1: &mut Handle,
    g2: &mut Handle,
    error: Option<io::ErrorKind>,
) -> &'static str {
    let (name, send) = tokio::select! {
        send = next(g1) => ("g1", send),
        send = next(g2) => ("g2", send),
    };
    match error {
        Some(kind) => send.send_error(io::Error::from(kind)),
        None => send.send_response(name),
    }
    name
}

#[tokio::test(start_paused = true)]
async fn one_refusal_takes_an_endpoint_out_of_the_next_pick() {
    for (kind, excluded) in [
        (io::ErrorKind::ConnectionRefused, true),
        // Another connection error counts towards the threshold (5) only.
        (io::ErrorKind::ConnectionReset, false),
    ] {
        let layer = BalanceLayer::new("svc-b", Policy::seed_000())
            .with_ejection(ejection(5, 60, 60))
            .with_pick(Pick::RoundRobin);
        let h = Harness::new(layer);
        let mut g1 = h.add("g1", &[("gray", "true")]);
        let mut g2 = h.add("g2", &[("gray", "true")]);
        g1.allow(100);
        g2.allow(100);
        settle(|| h.balance.len() == 2).await;
        let (answer, failed) = tokio::join!(
            h.call(gray_req()),
            answer_either(&mut g1, &mut g2, Some(kind))
        );
        assert!(answer.is_err());
        // Round-robin sends every other request to each; after a refusal, none goes to
        // the refused one.
        let mut served = Vec::new();
        for _ in 0..6 {
            let (answer, name) =
                tokio::join!(h.call(gray_req()), answer_either(&mut g1, &mut g2, None));
            assert_eq!(answer.unwrap(), name);
            served.push(name);
        }
        let reached = served.contains(&failed);
        assert_eq!(
            reached, !excluded,
            "{kind:?}: {failed} failed, then {served:?}"
        );
        if excluded {
            settle(|| h.balance.ready_len() == 1).await;
            let gray = Stain::in_lane(Lane::new("gray").unwrap());
            let explained = h.balance.explain(Some(&gray));
            assert_eq!(
                explained.steps[0].present, 1,
                "the refused one counts as absent"
            );
        }
    }
}
