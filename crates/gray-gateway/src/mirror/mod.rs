//! Mirroring: copies of the requests baseline serves, sent to another lane's instances
//! (`[services.<name>.mirror]`), their answers compared with the answers users got and
//! thrown away.
//!
//! A request is copied when its stain is baseline, its method is listed (`GET` and `HEAD`
//! by default), it is not an upgrade, the `percent` draw takes it and fewer than
//! `max_in_flight` copies are in flight. Then:
//!
//! - **The user's request never waits for its copy.** The copy is held until the user's
//!   answer has a head, then handed over, with that answer when its body came with it
//!   ([`primary`]), and sent by a task of its own ([`copy`]), on a thread of its own at a
//!   lower priority ([`runtime`]), through a balancer of its own over the same instances
//!   (its own connections, passive health and in-flight counts) with the service's
//!   policy and no fallback: a copy never reaches baseline, and with no instance of its
//!   lane it is dropped (`no_instance`).
//! - **A body is teed while it streams to baseline** ([`tee`]), kept by reference up to
//!   `max_body_bytes`; past that the copy is dropped (`dropped_body`) and the body goes on
//!   untouched. A body whose length says it is over the cap is not teed at all (the tee
//!   is gray-tower's, which its `MirrorLayer` uses too).
//! - **The copy carries the lane's stain** on every configured carrier and
//!   `x-gray-mirror: 1`, so that the services behind a shadow instance route its
//!   outbound calls to their own instances of that lane. The gateway strips
//!   `x-gray-mirror` from untrusted clients: no client can make its request look like a
//!   copy.
//! - **Copies count nowhere else**: not in `gray_gateway_requests_total`, not in any
//!   rollout's evidence, not in the retries. They have
//!   `gray_gateway_mirror_requests_total{service,lane,outcome}` and
//!   `gray_gateway_mirror_duration_seconds{service,lane}` ([`metrics`](crate::metrics)).
//! - **The answers are compared** ([`compare`]): the status class, the headers not known
//!   to vary (and not in `ignore_headers`), and the body up to `max_compare_bytes`, byte
//!   for byte, or field by field when both are JSON (but `ignore_fields`). A copy whose
//!   user answer did not finish, or was the gateway's own (502, 503, 504), is `unjudged`.

mod compare;
mod copy;
mod primary;
mod runtime;
mod shed;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::StreamExt;
use gray_balance::{Balance, BalanceLayer};
use gray_core::CarrierConfig;
use gray_discovery::{
    InstanceId, ServiceInstances,
    http::{Connector, HttpEndpoint, HttpEndpoints},
};
use gray_policy::{Fallback, OnUnready};
use http::Request;
use http_body::Body;
use http_body_util::Full;
use tower::discover::Change;

use self::compare::{Difference, Ignore};
pub(crate) use self::{
    primary::{AnswerTee, Primary},
    runtime::CopyThread,
};
use crate::{
    config::{MirrorConfig, ServiceConfig},
    metrics::{Metrics, MirrorSeries},
};
use gray_rollout::shadow::{Comparison, Judge, JudgeSummary, Judged};
pub(crate) use gray_tower::mirror::{Catch, Teed, X_GRAY_MIRROR};
use gray_tower::mirror::{Copier, Copy, Declined, Tee};

/// How many of the latest mismatches a mirror keeps for the admin API.
const RECENT: usize = 16;

/// The endpoints copies go to.
pub(crate) type MirrorEndpoints = HttpEndpoints<Connector, Full<Bytes>>;

type Endpoint = HttpEndpoint<Connector, Full<Bytes>>;

/// One service's mirror; shared by the proxy and the copies' tasks.
pub(crate) struct Mirror {
    service: Arc<str>,
    config: MirrorConfig,
    /// Which requests are copied, and the copies' places.
    copier: Copier,
    balancer: Balance<InstanceId, Endpoint>,
    ignore: Ignore,
    series: MirrorSeries,
    recent: Mutex<std::collections::VecDeque<Mismatch>>,
    /// The draw a copy of a safe method must fall under, out of 2^32, for a control.
    control_threshold: u64,
    /// The judge, and when it last looked (copies' tasks only: never the request path).
    judge: Mutex<Judging>,
    /// Where the copies run.
    copies: Arc<CopyThread>,
    /// Whether it copies now: off outside a rollout's shadow phase, for a rollout with one.
    enabled: AtomicBool,
}

/// A mirror's judge and its clock.
#[derive(Debug)]
struct Judging {
    judge: Judge,
    /// The judge's origin.
    epoch: Instant,
    last_look: Instant,
}

/// How often the judge ends a batch.
const LOOK_EVERY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("service", &self.service)
            .field("lane", &self.config.lane)
            .finish_non_exhaustive()
    }
}

/// A mismatch, as the admin API shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Mismatch {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) primary_status: u16,
    pub(crate) copy_status: u16,
    /// The user's answer's time to its head, and the copy's.
    pub(crate) primary_ms: f64,
    pub(crate) copy_ms: f64,
    pub(crate) differences: Vec<String>,
}

/// What [`Mirror::offer`] gives the proxy for a copied request.
#[derive(Debug)]
pub(crate) struct Offered {
    /// To tee the request's body with (none when it has none).
    pub(crate) tee: Option<Tee>,
    /// The copy, held until the user's answer is known.
    pub(crate) primary: Box<Primary>,
}

impl Mirror {
    /// The mirror of `config`'s service over `instances`, its copies sent through
    /// `endpoints`; spawns its balancer's task.
    pub(crate) fn new(
        config: &ServiceConfig,
        mirror: &MirrorConfig,
        instances: &ServiceInstances,
        endpoints: &MirrorEndpoints,
        carriers: &[CarrierConfig],
        metrics: &Metrics,
        copies: &Arc<CopyThread>,
    ) -> Result<Arc<Mirror>, gray_rollout::sequential::InvalidTest> {
        let service: Arc<str> = config.name.as_str().into();
        let transport = &config.transport;
        let endpoints = endpoints
            .clone()
            .with_protocol(transport.protocol)
            .with_tls(match &transport.tls {
                Some(tls) => tls.clone(),
                None => crate::config::system_tls(),
            });
        let discover = instances.discover().map(move |change| {
            change.map(|change| match change {
                Change::Insert(id, instance) => {
                    let endpoint = endpoints.endpoint(instance);
                    Change::Insert(id, endpoint)
                }
                Change::Remove(id) => Change::Remove(id),
            })
        });
        // The service's policy, but no fallback: a copy goes to its lane or nowhere.
        let policy = config
            .policy
            .clone()
            .with_fallback(Fallback::None)
            .with_on_unready(OnUnready::Fail);
        let balancer = BalanceLayer::new(&config.name, policy)
            .with_pick(config.pick)
            .with_probe(config.probe.clone())
            .with_ejection(config.ejection)
            .build(discover);
        let copier = Copier::new(mirror.lane.clone())
            .with_percent(mirror.percent)
            .with_methods(mirror.methods.iter().cloned())
            .with_max_body_bytes(mirror.max_body_bytes)
            .with_max_in_flight(mirror.max_in_flight)
            .with_carriers(CarrierConfig::carriers(carriers))
            .with_shed(copies.shed.clone());
        // `alpha` is checked with the configuration (in (0, 1)): this does not fail.
        let judge = Judge::new(mirror.alpha)?.with_noise_min(mirror.noise_min);
        let now = Instant::now();
        Ok(Arc::new(Mirror {
            control_threshold: (mirror.control_percent / 100.0 * f64::from(u32::MAX)) as u64,
            judge: Mutex::new(Judging {
                judge,
                epoch: now,
                last_look: now,
            }),
            series: metrics.mirror(&service, &mirror.lane),
            copies: copies.clone(),
            enabled: AtomicBool::new(true),
            service,
            config: mirror.clone(),
            copier,
            balancer,
            ignore: Ignore::new(&mirror.ignore_headers, &mirror.ignore_fields),
            recent: Mutex::default(),
        }))
    }

    /// Copies `req` when it is to be copied (see the [module docs](self)): the copy, which
    /// goes to the copies' thread once the user's answer has a head ([`Primary`]). `req`
    /// is as it goes to baseline (its path rewritten, its stain in its extensions).
    pub(crate) fn offer<B: Body>(self: &Arc<Self>, req: &mut Request<B>) -> Option<Offered> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let mut copy = match self.copier.offer(req) {
            Ok(copy) => copy,
            Err(declined) => {
                match declined {
                    Declined::Busy => self.series.count("dropped_busy"),
                    Declined::Body => self.series.count("dropped_body"),
                    _ => {}
                }
                return None;
            }
        };
        let tee = copy.take_tee();
        // A control only for a method safe to send twice to baseline.
        let control = copy.method().is_safe()
            && self.control_threshold > 0
            && (gray_core::rand::random_u64() >> 32) < self.control_threshold;
        Some(Offered {
            tee,
            primary: Primary::new(self.clone(), copy, control),
        })
    }

    /// The latest mismatches, newest last.
    pub(crate) fn recent(&self) -> Vec<Mismatch> {
        self.recent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The copies in flight now.
    pub(crate) fn in_flight(&self) -> usize {
        self.copier.in_flight()
    }

    /// The mirror's lane.
    pub(crate) fn lane(&self) -> &gray_core::Lane {
        &self.config.lane
    }

    /// Gives a `copy`'s comparison, with its `control`'s when it has one, to the judge:
    /// their differences outside the noise (a pair is counted by the test, a lone copy
    /// only judged). Ends the judge's batch when it is due ([`look_if_due`](Self::look_if_due)).
    fn judge(&self, copy: &Comparison, control: Option<&Comparison>) -> (Judged, Option<Judged>) {
        let mut judging = self.judge.lock().unwrap_or_else(|p| p.into_inner());
        let judged = match control {
            Some(control) => {
                let [copy, control] = judging.judge.observe_pair(copy, control);
                (copy, Some(control))
            }
            None => (judging.judge.observe(copy), None),
        };
        self.look_if_due(&mut judging);
        judged
    }

    /// Ends the judge's batch when a second has passed since the last; logs the alarm
    /// once. Called with each comparison, and with each report the rollout reads (so that
    /// the last pairs before the copies stop, or those of a gateway with little traffic,
    /// are counted too).
    fn look_if_due(&self, judging: &mut Judging) {
        let now = Instant::now();
        if now.duration_since(judging.last_look) < LOOK_EVERY {
            return;
        }
        judging.last_look = now;
        let before = judging.judge.alarm();
        let at = now.duration_since(judging.epoch);
        if let (None, Some(stream)) = (before, judging.judge.look(at)) {
            let summary = judging.judge.summary();
            self.series.alarm.set(1);
            tracing::warn!(
                service = %self.service,
                lane = %self.config.lane,
                stream,
                mismatch_log_m = summary.mismatch_log_m,
                slow_log_m = summary.slow_log_m,
                alarm_at = summary.alarm_at,
                copies = summary.copies,
                controls = summary.controls,
                "the mirror's judge alarmed: the lane answers differently from baseline beyond the noise"
            );
        }
    }

    /// Copies on or off (a rollout's shadow phase).
    pub(crate) fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// What the judge counted of the comparisons it fed its test, for the rollout's
    /// reports.
    pub(crate) fn counts(&self) -> gray_rollout::shadow::ShadowCounts {
        let mut judging = self.judge.lock().unwrap_or_else(|p| p.into_inner());
        self.look_if_due(&mut judging);
        judging.judge.counts()
    }

    /// What the judge has seen.
    pub(crate) fn judgement(&self) -> JudgeSummary {
        self.judge
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .judge
            .summary()
    }

    fn remember(&self, mismatch: Mismatch) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(mismatch);
    }
}

/// The differences as the judge and the admin API name them.
fn describe(differences: &[Difference]) -> Vec<String> {
    differences.iter().map(ToString::to_string).collect()
}
