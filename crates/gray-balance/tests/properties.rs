//! Properties over random instance sets, labels, readiness, policies and contexts.

use std::{
    collections::HashMap,
    convert::Infallible,
    future::{Future, Ready, ready},
    pin::pin,
    task::{Context, Poll, Waker},
};

use gray_balance::{Balance, BalanceLayer, Pick, error::Unroutable};
use gray_core::{
    Labelled, Labels, Lane, Pins, Policy, Stain, Version,
    matching::{Availability, Candidate, Decision, Fallback, OnUnready, Unlabelled},
};
use proptest::prelude::*;
use tower::{Service, discover::Change};

type Req = http::Request<()>;

/// An endpoint that answers with its own id; ready or never ready.
#[derive(Debug, Clone)]
struct Inst {
    id: usize,
    labels: Labels,
    ready: bool,
}

impl Labelled for Inst {
    fn labels(&self) -> &Labels {
        &self.labels
    }
}

impl Service<Req> for Inst {
    type Response = usize;
    type Error = Infallible;
    type Future = Ready<Result<usize, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.ready {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: Req) -> Self::Future {
        ready(Ok(self.id))
    }
}

const LANES: [&str; 2] = ["gray", "blue"];
const VERSIONS: [&str; 3] = ["1", "2", "3"];

fn inst() -> impl Strategy<Value = (u8, u8, bool)> {
    // lane: 0 none, 1 gray (flag), 2 blue (lane label); versions: a bit set; readiness.
    (0u8..3, 0u8..8, prop::bool::weighted(0.7))
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

/// A context: `None` (no context at all), or a lane (or none) and a pin (or none).
fn context() -> impl Strategy<Value = Option<(Option<usize>, Option<usize>)>> {
    prop::option::weighted(
        0.9,
        (prop::option::of(0usize..2), prop::option::of(0usize..4)),
    )
}

fn build_context(spec: (Option<usize>, Option<usize>)) -> Stain {
    let (lane, pin) = spec;
    let mut ctx = Stain::baseline();
    if let Some(l) = lane {
        ctx = ctx.with_lane(Some(Lane::new(LANES[l]).unwrap()));
    }
    if let Some(p) = pin {
        // "4" is a version no instance serves.
        let v = ["1", "2", "3", "4"][p];
        ctx = ctx.with_pins(Pins::new(None, [("svc-b", Version::new(v).unwrap())]).unwrap());
    }
    ctx
}

fn discover(
    insts: Vec<Inst>,
) -> impl futures_util::Stream<Item = Result<Change<usize, Inst>, Infallible>> + Unpin {
    futures_util::stream::iter(insts.into_iter().map(|i| Ok(Change::Insert(i.id, i))))
}

type Bal = Balance<
    Box<dyn futures_util::Stream<Item = Result<Change<usize, Inst>, Infallible>> + Unpin>,
    Req,
>;

fn balancer(policy: Policy, pick: Pick, insts: Vec<Inst>) -> Bal {
    let stream: Box<dyn futures_util::Stream<Item = _> + Unpin> = Box::new(discover(insts));
    BalanceLayer::new("svc-b", policy)
        .with_pick(pick)
        .build(stream)
}

type Outcome = Result<usize, Unroutable>;

/// poll_ready, explain, then call, synchronously (every endpoint answers at once).
fn route(bal: &mut Bal, ctx: Option<&Stain>) -> Option<(Outcome, Decision<usize>)> {
    let mut cx = Context::from_waker(Waker::noop());
    if bal.poll_ready(&mut cx).is_pending() {
        return None;
    }
    let explained = bal.explain(ctx);
    let mut req = http::Request::new(());
    if let Some(ctx) = ctx {
        req.extensions_mut().insert(ctx.clone());
    }
    let fut = pin!(bal.call(req));
    let outcome = match fut.poll(&mut cx) {
        Poll::Ready(Ok(id)) => Ok(id),
        Poll::Ready(Err(e)) => match e.downcast::<Unroutable>() {
            Ok(e) => Err(*e),
            Err(e) => panic!("unexpected error {e}"),
        },
        Poll::Pending => panic!("ready endpoints answer at once"),
    };
    Some((outcome, explained))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn routing_honours_the_policy(
        specs in prop::collection::vec(inst(), 1..12),
        policy in policy(),
        ctx in context(),
        requests in 1usize..4,
    ) {
        let insts: Vec<Inst> = specs
            .iter()
            .enumerate()
            .map(|(id, &(lane, versions, ready))| Inst { id, labels: labels(lane, versions), ready })
            .collect();
        let ctx = ctx.map(build_context);
        let wildcard = policy.unlabelled() == Unlabelled::Wildcard;
        let mut bal = balancer(policy.clone(), Pick::PendingRequests, insts.clone());
        for _ in 0..requests {
            let Some((outcome, explained)) = route(&mut bal, ctx.as_ref()) else {
                prop_assert!(insts.iter().all(|i| !i.ready), "pending although one is ready");
                break;
            };
            // The balancer agrees with the pure decision over the same instances.
            let decision = policy.decide(
                "svc-b",
                ctx.as_ref(),
                insts.iter().map(|i| Candidate::new(
                    i.id,
                    &i.labels,
                    if i.ready { Availability::Ready } else { Availability::Unready },
                )),
            );
            match (&outcome, decision.candidates()) {
                (Ok(id), Some(cands)) => prop_assert!(cands.contains(id), "{id} not in {cands:?}"),
                (Err(e), None) => prop_assert_eq!(Some(e), decision.error()),
                (o, c) => prop_assert!(false, "balancer {o:?} vs decision {c:?}"),
            }
            // The balancer's own explanation, taken just before the call, too.
            prop_assert_eq!(&explained, &decision);

            let lane = ctx.as_ref().and_then(|c| c.lane()).map(|l| l.as_str());
            let pin = ctx.as_ref().and_then(|c| c.version_for("svc-b")).map(|v| v.as_str());
            let class = |id: usize| policy.classify(&insts[id].labels);
            let ready = |f: &dyn Fn(usize) -> bool| insts.iter().any(|i| i.ready && f(i.id));

            // A baseline request never reaches a gray instance under `none` and `baseline`.
            if ctx.is_some() && lane.is_none() && pin.is_none() && policy.fallback() != Fallback::Any {
                if let Ok(id) = outcome {
                    prop_assert!(class(id).lane().is_none(), "baseline reached gray {id}");
                }
            }
            // A lane request reaches its lane whenever a ready instance of it exists.
            if let (Some(l), None) = (lane, pin) {
                let in_lane = |id: usize| class(id).lane().is_some_and(|x| x == l);
                if ready(&in_lane) {
                    let id = outcome.clone().unwrap();
                    prop_assert!(in_lane(id) || (wildcard && class(id).lane().is_none()));
                }
            }
            // A pinned version is honoured whenever a ready instance serves it.
            if let Some(v) = pin {
                let serves = |id: usize| class(id).versions().iter().any(|x| x == v);
                if ready(&serves) {
                    let id = outcome.clone().unwrap();
                    prop_assert!(serves(id) || (wildcard && class(id).versions().is_empty()));
                }
            }
        }
    }

    #[test]
    fn distribution_within_a_subset_is_even(
        gray in 2usize..7,
        base in 0usize..5,
        round_robin in any::<bool>(),
    ) {
        let mut insts = Vec::new();
        for id in 0..gray + base {
            let lane = if id < gray { 1 } else { 0 };
            insts.push(Inst { id, labels: labels(lane, 0), ready: true });
        }
        let pick = if round_robin { Pick::RoundRobin } else { Pick::PendingRequests };
        let mut bal = balancer(Policy::seed_000(), pick, insts);
        let ctx = Stain::in_lane(Lane::new("gray").unwrap());
        let per = 300;
        let mut counts: HashMap<usize, usize> = HashMap::new();
        for _ in 0..gray * per {
            let id = route(&mut bal, Some(&ctx)).unwrap().0.unwrap();
            *counts.entry(id).or_default() += 1;
        }
        prop_assert_eq!(counts.len(), gray, "every gray instance, and only those");
        for (id, n) in counts {
            prop_assert!(id < gray);
            // Expected 300 each; binomial sd ≈ 17: [150, 450] is about ±9 sd.
            prop_assert!((per / 2..=per * 3 / 2).contains(&n), "instance {id}: {n} of {per}");
        }
    }
}
