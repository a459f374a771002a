//! What the proxy records for each request of a service: its lane's counters and
//! latencies ([`LaneStats`], exported as `gray_gateway_request_duration_seconds`), and,
//! while a rollout runs on the service, an [`Observation`] for the rollout's population.

use std::{sync::Arc, time::Instant};

use arc_swap::ArcSwapOption;
use gray_core::Lane;
use gray_rollout::{
    Arm, Observation, Outcome, Recorder,
    lanes::{LaneStats, Slot},
};
use gray_rules::{RequestView, StickyArm};
use gray_tower::edge::{DecidedBy, EdgeDecision, LiveRules};
use http::Request;

/// The evidence of one service; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct ServiceEvidence {
    /// Every request, by lane.
    pub(crate) lanes: LaneStats,
    /// Set while a rollout runs on the service.
    population: ArcSwapOption<Population>,
}

/// Who counts as evidence of a running rollout, and where it is recorded.
#[derive(Debug)]
pub(crate) struct Population {
    pub(crate) recorder: Arc<Recorder>,
    pub(crate) rule: Box<str>,
    pub(crate) rules: LiveRules,
}

/// A request of a rollout's population, to be recorded when it is answered.
#[derive(Debug)]
pub(crate) struct Sample {
    recorder: Arc<Recorder>,
    arm: Arm,
    user: u64,
}

/// Everything a request's answer is recorded with: taken when the proxy routes it.
#[derive(Debug)]
pub(crate) struct Timing {
    evidence: Arc<ServiceEvidence>,
    slot: Slot,
    sample: Option<Sample>,
    start: Instant,
}

// === impl ServiceEvidence ===

impl ServiceEvidence {
    /// No evidence yet; at most `max_lanes` lanes get series of their own.
    pub(crate) fn new(max_lanes: usize) -> Self {
        ServiceEvidence {
            lanes: LaneStats::new(max_lanes),
            population: ArcSwapOption::empty(),
        }
    }

    /// Sets (or, with `None`, removes) what the running rollout records.
    pub(crate) fn set_population(&self, population: Option<Arc<Population>>) {
        self.population.store(population);
    }

    /// Starts timing `req` (of `lane`, as the edge decided), before the proxy rewrites its
    /// path: with a rollout running, finds whether it belongs to the rollout's population.
    pub(crate) fn start<B>(self: &Arc<Self>, req: &Request<B>, lane: Option<&Lane>) -> Timing {
        let sample = match &*self.population.load() {
            Some(population) => population.sample(req),
            None => None,
        };
        Timing {
            evidence: self.clone(),
            slot: self.lanes.slot(lane),
            sample,
            start: Instant::now(),
        }
    }
}

// === impl Population ===

impl Population {
    /// The arm and user of `req`, when it is of the rollout's population: the rollout's
    /// rule decided it (the percentage put the user in gray), or nothing decided it (no
    /// rule fired, no trusted inbound stain) and the percentage kept the user in baseline.
    /// Requests stained by another rule (testers by header, cookie or IP) or by a trusted
    /// client's own stain are not: they are no random sample.
    fn sample<B>(&self, req: &Request<B>) -> Option<Sample> {
        let decision = req.extensions().get::<EdgeDecision>()?;
        let rules = self.rules.load();
        // Decided by another version of the rules: whatever it was, not this one's arm.
        if rules.generation() != decision.generation {
            return None;
        }
        let sticky = rules.rules().sticky_rule(&self.rule).ok()?;
        let expect_gray = match decision.decided_by {
            DecidedBy::Rule if decision.rule_index == Some(sticky.rule().index()) => true,
            DecidedBy::Default => false,
            // another rule, or a trusted client's own stain
            _ => return None,
        };
        let view = RequestView::from_request(req).with_client_ip(decision.client_ip);
        let (arm, user) = match sticky.arm(&view) {
            StickyArm::Gray(user) if expect_gray => (Arm::Gray, user),
            StickyArm::Baseline(user) if !expect_gray => (Arm::Baseline, user),
            _ => return None,
        };
        Some(Sample {
            recorder: self.recorder.clone(),
            arm,
            user,
        })
    }
}

// === impl Timing ===

impl Timing {
    /// Records the answer the client got, with `status`, now.
    pub(crate) fn done(&self, status: u16) {
        self.served(status, false);
    }

    /// Records the answer the client got, with `status`, now; `fell_back`: it was served
    /// from a fallback subset. For the rollout, a request the percentage sent to gray that
    /// gray could not take (refused, reset, no ready instance, and then served by
    /// baseline) is a bad outcome of gray, whatever the client got: a gray that is down
    /// must not look healthy behind `fallback = "baseline"`. The lane's own series keep
    /// the status the client got.
    pub(crate) fn served(&self, status: u16, fell_back: bool) {
        let outcome = Outcome::of_status(status);
        let latency = self.start.elapsed();
        self.evidence.lanes.at(self.slot).record(outcome, latency);
        if let Some(s) = &self.sample {
            let outcome = if fell_back && s.arm == Arm::Gray {
                Outcome::Error
            } else {
                outcome
            };
            s.recorder
                .record(&Observation::new(s.arm, s.user, outcome, latency));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, net::SocketAddr};

    use gray_rules::{CidrList, Format, RuleSet};
    use gray_tower::edge::{EdgeLayer, PeerAddr};
    use tower::{Layer, ServiceExt, service_fn};

    use super::*;

    const RULES: &str = r#"{"rules": [
        {"name": "testers", "when": {"header": {"name": "x-tester", "present": true}}, "lane": "gray"},
        {"name": "canary", "lane": "gray",
         "when": {"path": {"prefix": "/svc/"}, "sticky": {"by": {"header": "x-user"}, "percent": 30}}}
    ]}"#;

    /// The arm the population gives a request with `headers` on `path`, from `peer`, after the
    /// real edge decided it.
    async fn arm(
        edge: &EdgeLayer,
        population: &Arc<Population>,
        path: &str,
        headers: &[(&str, &str)],
        peer: [u8; 4],
    ) -> Option<Arm> {
        let mut req = Request::get(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut req = req.body(()).unwrap();
        req.extensions_mut()
            .insert(PeerAddr(SocketAddr::from((peer, 1000))));
        let population = population.clone();
        let svc = edge.layer(service_fn(move |req: Request<()>| {
            let sample = population.sample(&req).map(|s| s.arm);
            async move { Ok::<_, Infallible>(http::Response::new(sample)) }
        }));
        svc.oneshot(req)
            .await
            .unwrap()
            .into_body()
            .into_inner()
            .flatten()
    }

    #[tokio::test]
    async fn only_the_users_the_percentage_decided_are_evidence() {
        let rules = LiveRules::new(RuleSet::parse(RULES, Format::Json, "rules.json").unwrap());
        let edge = EdgeLayer::new(rules.clone())
            .with_trusted_clients(CidrList::parse(["10.0.0.0/8"]).unwrap())
            .with_task_local(false);
        let population = Arc::new(Population {
            recorder: Arc::new(Recorder::new(1)),
            rule: "canary".into(),
            rules,
        });
        let outside = [192, 0, 2, 1];
        let (mut gray, mut baseline) = (0, 0);
        for i in 0..200 {
            let user = format!("user-{i}");
            let plain = arm(&edge, &population, "/svc/x", &[("x-user", &user)], outside).await;
            match plain {
                Some(Arm::Gray) => gray += 1,
                Some(Arm::Baseline) => baseline += 1,
                other => panic!("{user} is of the population: {other:?}"),
            }
            // a tester (stained by the header rule) is no evidence, whatever its bucket
            let tester = [("x-user", user.as_str()), ("x-tester", "1")];
            assert_eq!(
                arm(&edge, &population, "/svc/x", &tester, outside).await,
                None
            );
            // a trusted client's own stain is no evidence either; the rules go first, so a
            // trusted client the percentage put in gray was decided by it, and counts
            let stained = [("x-user", user.as_str()), ("x-gray-lane", "gray")];
            let expected = (plain == Some(Arm::Gray)).then_some(Arm::Gray);
            assert_eq!(
                arm(&edge, &population, "/svc/x", &stained, [10, 1, 2, 3]).await,
                expected
            );
        }
        assert!((30..90).contains(&gray), "about 30 % of 200: {gray}");
        assert_eq!(gray + baseline, 200);
        // another path, or no key: the percentage decided nothing
        assert_eq!(
            arm(&edge, &population, "/other/x", &[("x-user", "u")], outside).await,
            None
        );
        assert_eq!(arm(&edge, &population, "/svc/x", &[], outside).await, None);
    }
}
