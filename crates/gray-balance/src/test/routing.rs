//! Routing: stains, subsets, fallbacks, readiness, the task-local stain, `pick` and
//! recorded routes.

use super::*;

#[tokio::test(start_paused = true)]
async fn no_instance_fails_at_once_naming_service_lane_and_policy() {
    let h: Harness = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let mut balance = h.balance.clone();
    assert!(
        std::future::poll_fn(|cx| Service::<Req>::poll_ready(&mut balance, cx))
            .await
            .is_ok(),
        "always ready"
    );
    // The future fails on its first poll: nothing waits for an instance.
    let mut fut = std::pin::pin!(balance.call(gray_req()));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let Poll::Ready(Err(err)) = fut.as_mut().poll(&mut cx) else {
        panic!("an unroutable request fails at once");
    };
    let err = unroutable(err);
    assert_eq!(err.reason(), &UnroutableReason::NoMatch);
    assert_eq!(
        (err.service(), err.policy(), err.lane().map(Lane::as_str)),
        ("svc-b", "seed-000", Some("gray"))
    );
    assert_eq!(
        err.to_string(),
        "no instance of `svc-b` fits lane `gray` (policy `seed-000`, fallback `baseline`)"
    );
}

#[tokio::test(start_paused = true)]
async fn gray_goes_to_gray_and_baseline_never_does() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let mut base = h.add("b1", &[("gray", "false")]);
    let mut gray = h.add("g1", &[("gray", "TRUE")]);
    base.allow(10);
    gray.allow(10);
    settle(|| h.balance.len() == 2).await;

    let fut = h.call(gray_req());
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
    let (answer, ()) = tokio::join!(h.call(base_req()), async {
        next(&mut base).await.send_response("b1");
    });
    assert_eq!(answer.unwrap(), "b1");

    // No baseline instance left: seed 000 refuses to send baseline traffic to gray.
    h.remove("b1");
    settle(|| h.balance.len() == 1).await;
    let err = unroutable(h.call(base_req()).await.unwrap_err());
    assert_eq!(err.reason(), &UnroutableReason::NoMatch);
    assert_eq!(err.service(), "svc-b");
    assert_eq!(err.policy(), "seed-000");
    assert_eq!(err.lane(), None);
}

#[tokio::test(start_paused = true)]
async fn discovery_is_applied_without_requests() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()));
    let gray_stain = Stain::in_lane(Lane::new("gray").unwrap());
    let _g = h.add("g1", &[("gray", "true")]);
    settle(|| h.balance.explain(Some(&gray_stain)).candidates() == Some(&["g1"][..])).await;
    assert_eq!((h.balance.len(), h.balance.ready_len()), (1, 1));
    h.remove("g1");
    settle(|| h.balance.is_empty()).await;
    assert!(h.balance.explain(Some(&gray_stain)).error().is_some());
}

#[tokio::test(start_paused = true)]
async fn the_endpoints_readiness_is_awaited_in_the_response_future() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()));
    let mut base = h.add("b1", &[]);
    settle(|| h.balance.len() == 1).await;
    let balance = h.balance.clone();
    let call = tokio::spawn(send(balance, base_req()));
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!call.is_finished(), "the endpoint grants no readiness");
    assert!(base.poll_request().is_pending(), "nothing was sent");
    base.allow(1);
    next(&mut base).await.send_response("b1");
    assert_eq!(call.await.unwrap().unwrap(), "b1");
}

#[tokio::test(start_paused = true)]
async fn an_unready_endpoint_fails_fast_or_falls_back_then_returns() {
    for on_unready in [OnUnready::Fail, OnUnready::Fallback] {
        let policy = Policy::seed_000().with_on_unready(on_unready);
        let layer = BalanceLayer::new("svc-b", policy).with_ejection(ejection(5, 2, 2));
        let h = Harness::new(layer);
        let mut base = h.add("b1", &[]);
        let mut gray = h.add("g1", &[("gray", "true")]);
        base.allow(10);
        settle(|| h.balance.len() == 2).await;

        // Its readiness check fails: the request gets the error, the endpoint is unready.
        gray.send_error("overloaded");
        let err = h.call(gray_req()).await.unwrap_err();
        assert_eq!(err.to_string(), "overloaded");
        settle(|| h.balance.ready_len() == 1).await;
        assert_eq!(h.balance.len(), 2, "unready, still present");

        let fut = h.call(gray_req());
        match on_unready {
            OnUnready::Fail => {
                let err = unroutable(fut.await.unwrap_err());
                assert!(
                    matches!(err.reason(), UnroutableReason::Unready { present: 1, .. }),
                    "{err}"
                );
                assert!(base.poll_request().is_pending(), "nothing was sent");
            }
            OnUnready::Fallback => {
                let (answer, ()) = tokio::join!(fut, async {
                    next(&mut base).await.send_response("b1");
                });
                assert_eq!(answer.unwrap(), "b1");
            }
            _ => unreachable!("only the two settings above are tried"),
        }
        // After the backoff it is back.
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle(|| h.balance.ready_len() == 2).await;
        gray.allow(1);
        let (answer, ()) = tokio::join!(h.call(gray_req()), async {
            next(&mut gray).await.send_response("g1");
        });
        assert_eq!(answer.unwrap(), "g1");
    }
}

#[tokio::test(start_paused = true)]
async fn task_local_then_own_lane() {
    let policy = Policy::seed_000().with_own_lane(Some(Lane::new("gray").unwrap()));
    let h = Harness::new(BalanceLayer::new("svc-b", policy));
    let mut base = h.add("b1", &[]);
    let mut gray = h.add("g1", &[("gray", "true")]);
    base.allow(10);
    gray.allow(10);
    settle(|| h.balance.len() == 2).await;

    // No extension, no task-local: the calling instance's own lane (gray).
    let (answer, ()) = tokio::join!(h.call(http::Request::new("hi".to_owned())), async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");

    // A task-local baseline stain wins over the own lane: the pick runs in this task.
    let fut = gray_core::task::scope(
        Stain::baseline(),
        h.call(http::Request::new("hi".to_owned())),
    );
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut base).await.send_response("b1");
    });
    assert_eq!(answer.unwrap(), "b1");

    // The extension wins over the task-local.
    let fut = gray_core::task::scope(Stain::baseline(), h.call(gray_req()));
    let (answer, ()) = tokio::join!(fut, async {
        next(&mut gray).await.send_response("g1");
    });
    assert_eq!(answer.unwrap(), "g1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_route_by_their_own_task_local_stain() {
    let endpoints = futures_util::stream::iter((0..8).map(|i| {
        let labels: &[(&str, &str)] = if i % 2 == 0 { &[("gray", "true")] } else { &[] };
        let name = ["g0", "b1", "g2", "b3", "g4", "b5", "g6", "b7"][i];
        Ok::<_, Infallible>(slow(name, labels, 0))
    }));
    let balance = BalanceLayer::new("svc-b", Policy::seed_000()).build(endpoints);
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let balance = balance.clone();
            tokio::spawn(async move {
                let stain = if i % 2 == 0 {
                    Stain::in_lane(Lane::new("gray").unwrap())
                } else {
                    Stain::baseline()
                };
                let mut served = Vec::new();
                for _ in 0..50 {
                    let call = send(balance.clone(), http::Request::new("hi".to_owned()));
                    served.push(gray_core::task::scope(stain.clone(), call).await.unwrap());
                }
                (i, served)
            })
        })
        .collect();
    let mut counts = HashMap::new();
    for task in tasks {
        let (i, served) = task.await.unwrap();
        let lane = if i % 2 == 0 { 'g' } else { 'b' };
        for name in served {
            assert!(name.starts_with(lane), "caller {i} got {name}");
            *counts.entry(name).or_insert(0) += 1;
        }
    }
    assert_eq!(counts.len(), 8, "every endpoint served: {counts:?}");
}

#[tokio::test(start_paused = true)]
async fn pick_reports_to_load_and_health() {
    let layer = BalanceLayer::new("svc-b", Policy::seed_000()).with_ejection(ejection(2, 1, 1));
    let h = Harness::new(layer);
    let _g = h.add("g1", &[("gray", "true")]);
    let _b = h.add("b1", &[]);
    settle(|| h.balance.len() == 2).await;
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    let picked = h.balance.pick(Some(&gray)).unwrap();
    assert_eq!(*picked.key(), "g1");
    assert_eq!(picked.labels().get("gray"), Some("true"));
    assert_eq!(
        picked.routed().subset(),
        &OwnedSubset::Lane(Lane::new("gray").unwrap())
    );
    assert!(!picked.routed().fallback());
    picked.connection_failed();
    h.balance.pick(Some(&gray)).unwrap().connection_failed();
    settle(|| h.balance.ready_len() == 1).await;
    // The gray instance is ejected: a gray pick falls back to baseline (seed 000).
    let picked = h.balance.pick(Some(&gray)).unwrap();
    assert_eq!(*picked.key(), "b1");
    assert!(picked.routed().fallback());
    picked.succeeded();
    // No stain given: the task-local one.
    let picked = gray_core::task::sync_scope(Stain::baseline(), || h.balance.pick(None));
    assert_eq!(*picked.unwrap().key(), "b1");
    let err = h
        .balance
        .pick(Some(&Stain::in_lane(Lane::new("blue").unwrap())));
    assert!(err.is_ok(), "seed 000 falls back for any lane");
    let strict = Harness::<Endpoint>::new(BalanceLayer::new("svc-c", Policy::new()));
    let err = strict.balance.pick(None).unwrap_err();
    assert_eq!(err.service(), "svc-c");
}

#[tokio::test]
async fn routed_is_recorded_only_when_asked() {
    /// Answers with the `Routed` its request carried.
    #[derive(Clone)]
    struct Echo(Arc<Labels>);
    impl Labelled for Echo {
        fn labels(&self) -> &Labels {
            &self.0
        }
    }
    impl Service<Req> for Echo {
        type Response = Option<Routed>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Option<Routed>, Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Req) -> Self::Future {
            std::future::ready(Ok(req.extensions().get::<Routed>().cloned()))
        }
    }
    let endpoints = || {
        futures_util::stream::iter([Ok::<_, Infallible>(Change::Insert(1, Echo(Arc::default())))])
    };
    let policy = Policy::seed_000();
    let plain = BalanceLayer::new("svc", policy.clone()).build(endpoints());
    assert_eq!(plain.oneshot(gray_req()).await.unwrap(), None);

    for record in [RecordRouted::Always, RecordRouted::Fallbacks] {
        let recording = BalanceLayer::new("svc", policy.clone())
            .with_routed(record)
            .build(endpoints());
        let routed = recording.clone().oneshot(gray_req()).await.unwrap();
        let routed = routed.expect("recorded");
        assert_eq!(routed.subset(), &OwnedSubset::Baseline);
        assert!(
            routed.fallback(),
            "a gray request served by baseline is a fallback"
        );
        // A baseline request served by baseline took no fallback.
        let routed = recording.oneshot(base_req()).await.unwrap();
        match record {
            RecordRouted::Always => {
                let routed = routed.expect("recorded");
                assert_eq!(routed.subset(), &OwnedSubset::Baseline);
                assert!(!routed.fallback());
            }
            _ => assert_eq!(routed, None, "only fallbacks are recorded"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_at_its_limit_is_passed_over_and_a_saturated_subset_fails_at_once() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()).with_max_pending(1));
    let mut b1 = h.add("b1", &[]);
    let mut b2 = h.add("b2", &[]);
    let mut g1 = h.add("g1", &[("gray", "true")]);
    for handle in [&mut b1, &mut b2, &mut g1] {
        handle.allow(10);
    }
    settle(|| h.balance.len() == 3).await;
    // Two baseline requests in flight: one on each baseline endpoint, whichever the pick
    // chose first (the second pick passes over it).
    let first = tokio::spawn(send(h.balance.clone(), base_req()));
    let second = tokio::spawn(send(h.balance.clone(), base_req()));
    let on_b1 = next(&mut b1).await;
    let on_b2 = next(&mut b2).await;
    // A third: both are at their limit, and the subset does not fall back to gray.
    let err = unroutable(h.call(base_req()).await.unwrap_err());
    assert!(
        matches!(err.reason(), UnroutableReason::Saturated { limit: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("at its limit of 1 requests in flight"),
        "{err}"
    );
    // Gray is another subset, with its own place.
    let gray = tokio::spawn(send(h.balance.clone(), gray_req()));
    next(&mut g1).await.send_response("g1");
    assert_eq!(gray.await.unwrap().unwrap(), "g1");
    // An answer frees its endpoint's place: the next request takes it.
    on_b1.send_response("b1");
    settle(|| first.is_finished() || second.is_finished()).await;
    let third = tokio::spawn(send(h.balance.clone(), base_req()));
    next(&mut b1).await.send_response("b1");
    assert_eq!(third.await.unwrap().unwrap(), "b1");
    on_b2.send_response("b2");
    let mut answers = [
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    ];
    answers.sort_unstable();
    assert_eq!(answers, ["b1", "b2"]);
}
