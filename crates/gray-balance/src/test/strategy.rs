//! Strategies of one's own: asked when a subset has two or more ready endpoints, shown
//! their load and labels, and still subject to the policy, probing and passive health.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use gray_core::rand::Rng;

use super::*;
use crate::strategy::{Candidates, Strategy};

/// The candidate with the lowest `rank` label (unranked last, ties: the first); counts
/// how often it was asked.
#[derive(Debug, Default)]
struct LowestRank {
    no_probes: bool,
    asked: Arc<AtomicUsize>,
}

impl Strategy for LowestRank {
    fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
        self.asked.fetch_add(1, Relaxed);
        let rank = |i| {
            let load = candidates.get(i)?;
            load.labels().get("rank")?.parse::<u32>().ok()
        };
        (0..candidates.len())
            .min_by_key(|&i| rank(i).unwrap_or(u32::MAX))
            .unwrap_or(0)
    }

    fn probes(&self) -> bool {
        !self.no_probes
    }
}

/// The candidate with the fewest requests in flight (ties: the first).
#[derive(Debug)]
struct FewestInFlight;

impl Strategy for FewestInFlight {
    fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
        let loads: Vec<_> = candidates.iter().map(|l| l.in_flight()).collect();
        (0..loads.len()).min_by_key(|&i| loads[i]).unwrap_or(0)
    }

    fn probes(&self) -> bool {
        false
    }
}

fn ranked(h: &Harness, ranks: &[(&'static str, &'static str)]) -> Vec<Handle> {
    ranks
        .iter()
        .map(|(key, rank)| h.add(key, &[("rank", rank)]))
        .collect()
}

fn picked(h: &Harness) -> &'static str {
    let picked = h.balance.pick(None).expect("routable");
    let key: &&'static str = picked.key();
    key
}

#[tokio::test(start_paused = true)]
async fn a_custom_strategy_decides_among_the_ready_endpoints() {
    let strategy = LowestRank {
        no_probes: true,
        ..LowestRank::default()
    };
    let asked = strategy.asked.clone();
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()).with_strategy(strategy));
    let _handles = ranked(&h, &[("a", "3"), ("b", "1"), ("c", "2")]);
    settle(|| h.balance.len() == 3).await;
    assert!(format!("{:?}", h.balance).contains("LowestRank"));

    for _ in 0..20 {
        assert_eq!(picked(&h), "b");
    }
    assert_eq!(asked.load(Relaxed), 20);

    // The subset changes: the strategy chooses among what is left.
    h.remove("b");
    settle(|| h.balance.len() == 2).await;
    assert_eq!(picked(&h), "c");
    // One endpoint left: taken without asking.
    h.remove("c");
    settle(|| h.balance.len() == 1).await;
    let before = asked.load(Relaxed);
    assert_eq!(picked(&h), "a");
    assert_eq!(asked.load(Relaxed), before);
}

#[tokio::test(start_paused = true)]
async fn a_strategy_sees_the_requests_in_flight() {
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()).with_strategy(FewestInFlight));
    let _handles = ranked(&h, &[("a", "1"), ("b", "1"), ("c", "1")]);
    settle(|| h.balance.len() == 3).await;
    let first = h.balance.pick(None).unwrap();
    let second = h.balance.pick(None).unwrap();
    let third = h.balance.pick(None).unwrap();
    assert_eq!([*first.key(), *second.key(), *third.key()], ["a", "b", "c"]);
    second.succeeded();
    assert_eq!(picked(&h), "b", "b has nothing in flight now");
    drop((first, third));
}

#[tokio::test(start_paused = true)]
async fn a_custom_strategy_is_still_subject_to_ejection() {
    let strategy = LowestRank {
        no_probes: true,
        ..LowestRank::default()
    };
    let layer = BalanceLayer::new("svc-b", Policy::new())
        .with_strategy(strategy)
        .with_ejection(ejection(2, 1, 10));
    let h = Harness::new(layer);
    let _handles = ranked(&h, &[("a", "3"), ("b", "1"), ("c", "2")]);
    settle(|| h.balance.len() == 3).await;

    // Two connection errors in a row: b reaches the threshold.
    for _ in 0..2 {
        let picked = h.balance.pick(None).unwrap();
        assert_eq!(*picked.key(), "b");
        picked.connection_failed();
    }
    // Before the background task has ejected it, the strategy still chooses b: the
    // balancer takes another endpoint instead.
    assert_ne!(picked(&h), "b");
    // Ejected: the strategy chooses among the others.
    settle(|| h.balance.ready_len() == 2).await;
    assert_eq!(picked(&h), "c");
    // Readmitted after the backoff (1 s): chosen again.
    tokio::time::sleep(Duration::from_millis(1001)).await;
    settle(|| h.balance.ready_len() == 3).await;
    assert_eq!(picked(&h), "b");
}

#[tokio::test(start_paused = true)]
async fn new_endpoints_get_their_probes_before_the_strategy_is_asked() {
    let strategy = LowestRank::default();
    let asked = strategy.asked.clone();
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()).with_strategy(strategy));
    let _a = ranked(&h, &[("a", "1"), ("b", "2")]);
    settle(|| h.balance.len() == 2).await;
    // Both are new: each gets its probes (one at a time) before the strategy decides.
    for _ in 0..3 {
        let (first, second) = (h.balance.pick(None).unwrap(), h.balance.pick(None).unwrap());
        assert_eq!([*first.key(), *second.key()], ["a", "b"], "probes");
        assert_eq!(
            picked(&h),
            "a",
            "both probes in flight: the strategy decides"
        );
        first.succeeded();
        second.succeeded();
    }
    assert_eq!(asked.load(Relaxed), 3);
    // Measured: no more probes, the strategy decides every pick.
    assert_eq!(picked(&h), "a");
    assert_eq!(picked(&h), "a");
    assert_eq!(asked.load(Relaxed), 5);

    // A newcomer the strategy would never choose gets its probe first.
    let _z = ranked(&h, &[("z", "9")]);
    settle(|| h.balance.len() == 3).await;
    let probe = h.balance.pick(None).unwrap();
    assert_eq!(*probe.key(), "z");
    assert_eq!(picked(&h), "a", "one probe at a time");
    probe.succeeded();

    // Without probes, the strategy alone decides: a newcomer may get nothing at all.
    let strategy = LowestRank {
        no_probes: true,
        ..LowestRank::default()
    };
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()).with_strategy(strategy));
    let _handles = ranked(&h, &[("z", "9"), ("a", "1")]);
    settle(|| h.balance.len() == 2).await;
    for _ in 0..5 {
        assert_eq!(picked(&h), "a");
    }
}

#[tokio::test(start_paused = true)]
async fn the_policy_walks_before_the_strategy() {
    // The strategy prefers the gray endpoint; a baseline request never sees it.
    let strategy = LowestRank {
        no_probes: true,
        ..LowestRank::default()
    };
    let h = Harness::new(BalanceLayer::new("svc-b", Policy::seed_000()).with_strategy(strategy));
    let _g = h.add("g1", &[("gray", "true"), ("rank", "0")]);
    let _b = ranked(&h, &[("b1", "5"), ("b2", "4")]);
    settle(|| h.balance.len() == 3).await;
    let gray = Stain::in_lane(Lane::new("gray").unwrap());
    assert_eq!(
        *h.balance.pick(Some(&Stain::baseline())).unwrap().key(),
        "b2"
    );
    assert_eq!(*h.balance.pick(Some(&gray)).unwrap().key(), "g1");
}

#[test]
fn pick_names_the_built_in_strategies() {
    use crate::strategy::{PeakEwma, PendingRequests, RoundRobin};

    let debug = |pick: Pick| format!("{:?}", pick.strategy());
    assert_eq!(debug(Pick::default()), format!("{:?}", PeakEwma::new()));
    assert_eq!(debug(Pick::PendingRequests), format!("{PendingRequests:?}"));
    assert_eq!(debug(Pick::RoundRobin), format!("{RoundRobin:?}"));
    assert_eq!(
        Pick::default().strategy().rtt_decay(),
        Some(Duration::from_secs(10))
    );
    assert!(!Pick::RoundRobin.strategy().probes());
    assert!(Pick::PendingRequests.strategy().probes());
    assert_eq!(Pick::PendingRequests.strategy().rtt_decay(), None);
}

#[tokio::test(start_paused = true)]
async fn a_built_in_strategy_given_as_a_strategy_works_as_its_pick() {
    use crate::strategy::RoundRobin;

    let h = Harness::new(BalanceLayer::new("svc-b", Policy::new()).with_strategy(RoundRobin));
    let _handles = ranked(&h, &[("a", "1"), ("b", "1"), ("c", "1")]);
    settle(|| h.balance.len() == 3).await;
    assert!(format!("{:?}", h.balance).contains("RoundRobin"));
    // No probes: new endpoints take their turn from the first request on.
    let served: Vec<_> = (0..6).map(|_| picked(&h)).collect();
    let first = served.iter().position(|&k| k == "a").unwrap();
    let cycle: Vec<_> = served[first..first + 3].to_vec();
    assert_eq!(cycle, ["a", "b", "c"], "{served:?}");
    assert_eq!(served[..3], served[3..], "{served:?}");
}
