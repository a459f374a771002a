//! Properties over random instance sets, labels, ejections, policies and stains: the
//! balancer agrees with `Policy::decide` over the same instances, and honours lanes, pins
//! and the baseline rule.

use std::{
    collections::{HashMap, HashSet},
    future::{Future, Ready, ready},
    io,
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use gray_balance::{Balance, BalanceLayer, Driver, Pick, error::Unroutable, health::Ejection};
use gray_core::{Labelled, Labels, Lane, Pins, Stain, Version, backoff::Backoff};
use gray_policy::{Availability, Candidate, Decision, Fallback, OnUnready, Policy, Unlabelled};
use proptest::prelude::*;
use tower::{Service, discover::Change};

type Req = http::Request<()>;

/// An endpoint that answers with its own id, or, when broken, refuses the connection.
#[derive(Debug, Clone)]
struct Inst {
    id: usize,
    labels: Arc<Labels>,
    broken: bool,
}

impl Labelled for Inst {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl Service<Req> for Inst {
    type Response = usize;
    type Error = io::Error;
    type Future = Ready<Result<usize, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(if self.broken {
            Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                self.id.to_string(),
            ))
        } else {
            Ok(self.id)
        })
    }
}

const LANES: [&str; 2] = ["gray", "blue"];
const VERSIONS: [&str; 3] = ["1", "2", "3"];

fn inst() -> impl Strategy<Value = (u8, u8, bool)> {
    // lane: 0 none, 1 gray (flag), 2 blue (lane label); versions: a bit set; broken.
    (0u8..3, 0u8..8, prop::bool::weighted(0.25))
}

fn labels(lane: u8, versions: u8) -> Labels {
    let mut labels = Labels::new();
    match lane {
        1 => {
            labels.insert("gray", "true");
        }
        2 => {
            labels.insert("lane", "blue");
        }
        _ => {}
    }
    let list: Vec<&str> = (0..3)
        .filter(|b| versions & (1 << b) != 0)
        .map(|b| VERSIONS[b])
        .collect();
    if !list.is_empty() {
        labels.insert("versions", list.join(","));
    }
    labels
}

fn policy() -> impl Strategy<Value = Policy> {
    (0u8..3, any::<bool>(), any::<bool>()).prop_map(|(fallback, wildcard, fall_on_unready)| {
        Policy::new()
            .with_fallback([Fallback::None, Fallback::Baseline, Fallback::Any][fallback as usize])
            .with_unlabelled(if wildcard {
                Unlabelled::Wildcard
            } else {
                Unlabelled::Baseline
            })
            .with_on_unready(if fall_on_unready {
                OnUnready::Fallback
            } else {
                OnUnready::Fail
            })
    })
}

/// A stain: `None` (no stain at all), or a lane (or none) and a pin (or none).
fn context() -> impl Strategy<Value = Option<(Option<usize>, Option<usize>)>> {
    prop::option::weighted(
        0.9,
        (prop::option::of(0usize..2), prop::option::of(0usize..4)),
    )
}

fn build_context(spec: (Option<usize>, Option<usize>)) -> Stain {
    let (lane, pin) = spec;
    let mut stain = Stain::baseline();
    if let Some(l) = lane {
        stain = stain.with_lane(Some(Lane::new(LANES[l]).unwrap()));
    }
    if let Some(p) = pin {
        // "4" is a version no instance serves.
        let v = ["1", "2", "3", "4"][p];
        stain = stain.with_pins(Pins::new(None, [("svc-b", Version::new(v).unwrap())]).unwrap());
    }
    stain
}

type Stream =
    futures_util::stream::Iter<std::vec::IntoIter<Result<Change<usize, Inst>, io::Error>>>;

type Bal = Balance<usize, Inst>;

/// A balancer whose driver the test polls by hand, so that every ejection is applied
/// before the next request. One connection error ejects, for longer than a test runs.
fn balancer(policy: Policy, pick: Pick, insts: Vec<Inst>) -> (Bal, Driver<Stream>) {
    let changes: Vec<_> = insts
        .into_iter()
        .map(|i| Ok(Change::Insert(i.id, i)))
        .collect();
    let backoff = Backoff::new(Duration::from_secs(3600), Duration::from_secs(3600));
    BalanceLayer::new("svc-b", policy)
        .with_pick(pick)
        .with_ejection(Ejection::new().with_consecutive(1).with_backoff(backoff))
        .pair(futures_util::stream::iter(changes))
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Served(usize),
    /// A broken instance was picked (and is ejected now).
    Refused(usize),
    Unroutable(Unroutable),
}

/// Lets the driver apply what is pending, explains, then routes one request, all
/// synchronously (every endpoint answers at once).
fn route(
    bal: &mut Bal,
    driver: &mut Driver<Stream>,
    stain: Option<&Stain>,
) -> (Outcome, Decision<usize>) {
    let mut cx = Context::from_waker(Waker::noop());
    assert!(pin!(&mut *driver).poll(&mut cx).is_pending());
    let explained = bal.explain(stain);
    let mut req = http::Request::new(());
    if let Some(stain) = stain {
        req.extensions_mut().insert(stain.clone());
    }
    assert!(bal.poll_ready(&mut cx).is_ready());
    let fut = pin!(bal.call(req));
    let outcome = match fut.poll(&mut cx) {
        Poll::Ready(Ok(id)) => Outcome::Served(id),
        Poll::Ready(Err(e)) => match e.downcast::<Unroutable>() {
            Ok(e) => Outcome::Unroutable(*e),
            Err(e) => Outcome::Refused(e.to_string().parse().expect("an instance id")),
        },
        Poll::Pending => panic!("endpoints answer at once"),
    };
    assert!(pin!(&mut *driver).poll(&mut cx).is_pending());
    (outcome, explained)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn routing_honours_the_policy(
        specs in prop::collection::vec(inst(), 1..12),
        policy in policy(),
        stain in context(),
        requests in 1usize..6,
    ) {
        let insts: Vec<Inst> = specs
            .iter()
            .enumerate()
            .map(|(id, &(lane, versions, broken))| Inst { id, labels: Arc::new(labels(lane, versions)), broken })
            .collect();
        let stain = stain.map(build_context);
        let wildcard = policy.unlabelled() == Unlabelled::Wildcard;
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _guard = rt.enter();
        let (mut bal, mut driver) = balancer(policy.clone(), Pick::PendingRequests, insts.clone());
        let mut ejected = HashSet::new();
        for _ in 0..requests {
            let (outcome, explained) = route(&mut bal, &mut driver, stain.as_ref());
            // The balancer agrees with the pure decision over the same instances.
            let decision = policy.decide(
                "svc-b",
                stain.as_ref(),
                insts.iter().map(|i| Candidate::new(
                    i.id,
                    &i.labels,
                    if ejected.contains(&i.id) { Availability::Ejected } else { Availability::Ready },
                )),
            );
            match (&outcome, decision.candidates()) {
                (Outcome::Served(id), Some(cands)) => {
                    prop_assert!(cands.contains(id), "{id} not in {cands:?}");
                    prop_assert!(!insts[*id].broken);
                }
                (Outcome::Refused(id), Some(cands)) => {
                    prop_assert!(cands.contains(id), "{id} not in {cands:?}");
                    prop_assert!(insts[*id].broken);
                }
                (Outcome::Unroutable(e), None) => prop_assert_eq!(Some(e), decision.error()),
                (o, c) => prop_assert!(false, "balancer {o:?} vs decision {c:?}"),
            }
            // The balancer's own explanation, taken just before the call, too.
            prop_assert_eq!(&explained, &decision);

            let lane = stain.as_ref().and_then(|c| c.lane()).map(|l| l.as_str());
            let pin = stain.as_ref().and_then(|c| c.version_for("svc-b")).map(|v| v.as_str());
            let class = |id: usize| policy.classify(&insts[id].labels);
            let present = |f: &dyn Fn(usize) -> bool| insts.iter().any(|i| !ejected.contains(&i.id) && f(i.id));
            let picked = match outcome {
                Outcome::Served(id) | Outcome::Refused(id) => Some(id),
                Outcome::Unroutable(_) => None,
            };

            // A baseline request never reaches a gray instance under `none` and `baseline`.
            if stain.is_some() && lane.is_none() && pin.is_none() && policy.fallback() != Fallback::Any
                && let Some(id) = picked {
                    prop_assert!(class(id).lane().is_none(), "baseline reached gray {id}");
                }
            // A lane request reaches its lane whenever an instance of it is present.
            if let (Some(l), None) = (lane, pin) {
                let in_lane = |id: usize| class(id).lane().is_some_and(|x| x == l);
                if present(&in_lane) {
                    let id = picked.unwrap();
                    prop_assert!(in_lane(id) || (wildcard && class(id).lane().is_none()));
                }
            }
            // A pinned version is honoured whenever an instance serving it is present.
            if let Some(v) = pin {
                let serves = |id: usize| class(id).versions().iter().any(|x| x == v);
                if present(&serves) {
                    let id = picked.unwrap();
                    prop_assert!(serves(id) || (wildcard && class(id).versions().is_empty()));
                }
            }
            if let Outcome::Refused(id) = outcome {
                ejected.insert(id);
            }
        }
    }
}

/// Every instance of a subset gets its share, for every subset size and pick, with the
/// balancer's random draws seeded (the choices are made on this thread). Round-robin gives
/// each exactly its share; power of two choices among instances that answer at once picks
/// one uniformly, so each count is binomial and stays within 4 standard deviations
/// (`sqrt(PER (1 - 1/n))`: ± 89 for 2 instances, ± 115 for 6). A 2:1 skew is far outside.
#[test]
fn distribution_within_a_subset_is_even() {
    const PER: usize = 1_000;
    for gray in 2usize..=6 {
        for base in [0usize, 4] {
            for pick in [Pick::RoundRobin, Pick::PendingRequests] {
                gray_core::rand::seed_thread(0x6772_6179 + gray as u64);
                let mut insts = Vec::new();
                for id in 0..gray + base {
                    let lane = if id < gray { 1 } else { 0 };
                    insts.push(Inst {
                        id,
                        labels: Arc::new(labels(lane, 0)),
                        broken: false,
                    });
                }
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .unwrap();
                let _guard = rt.enter();
                let (mut bal, mut driver) = balancer(Policy::seed_000(), pick, insts);
                let stain = Stain::in_lane(Lane::new("gray").unwrap());
                let mut counts: HashMap<usize, usize> = HashMap::new();
                for _ in 0..gray * PER {
                    let Outcome::Served(id) = route(&mut bal, &mut driver, Some(&stain)).0 else {
                        panic!("a ready gray instance exists");
                    };
                    *counts.entry(id).or_default() += 1;
                }
                let case = format!("{gray} gray, {base} baseline, {pick:?}: {counts:?}");
                assert_eq!(
                    counts.len(),
                    gray,
                    "every gray instance, and only those: {case}"
                );
                let sd = (PER as f64 * (1.0 - 1.0 / gray as f64)).sqrt();
                for (&id, &n) in &counts {
                    assert!(id < gray, "{case}");
                    if pick == Pick::RoundRobin {
                        assert!(n.abs_diff(PER) <= 1, "instance {id}: {case}");
                    } else {
                        assert!(
                            (n as f64 - PER as f64).abs() <= 4.0 * sd,
                            "instance {id}: {n}, expected {PER} ± {:.0}; {case}",
                            4.0 * sd
                        );
                    }
                }
            }
        }
    }
}
