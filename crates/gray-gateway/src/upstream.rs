//! One routed service: its instances (from the registry), and the label-aware balancer
//! over them, whose endpoints name the instance that answered (`x-gray-instance`) and hand
//! the proxy what it needs to count the answer once it knows it ([`Served`]).
//! Requests go through the balancer's `Retry`: one an instance could not take goes to
//! another, by the service's `retry` table.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use crate::limits::ClientBody;
use futures_util::StreamExt;
use gray_balance::{
    Balance, BalanceLayer, RecordRouted, Routed,
    retry::{Copies, ReplayBody, Retry, RetryFuture},
};
use gray_core::{Labelled, Labels, Lane, Origin};
use gray_discovery::{
    Instance, InstanceId, ServiceInstances,
    http::{Connector, HttpEndpoint, HttpEndpoints, RequestError, ResponseBody},
};
use gray_policy::Policy;
use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::{BoxError, Service, discover::Change};

use crate::{
    config::ServiceConfig,
    metrics::{EndpointMetrics, Metrics},
    rollout::ServiceEvidence,
};

/// What an endpoint knows about itself, shared by the requests it serves and by the clone
/// of the endpoint each request calls.
#[derive(Debug)]
struct Identity {
    service: Arc<str>,
    /// The instance's id, for logs.
    id: Arc<str>,
    /// The instance's labels (kept here, so that cloning the endpoint copies none).
    labels: Labels,
    /// The id as a header value, built once.
    header: Option<HeaderValue>,
    /// Its answers, by lane and status.
    counters: Arc<EndpointMetrics>,
    metrics: Arc<Metrics>,
}

/// An endpoint that marks each response with the instance that served it
/// (`x-gray-instance`) and counts it, by lane, instance, status and fallback.
#[derive(Debug, Clone)]
pub(crate) struct Tagged<S> {
    inner: S,
    me: Arc<Identity>,
}

impl<S: Origin> Labelled for Tagged<S> {
    fn labels(&self) -> &Labels {
        &self.me.labels
    }

    /// The instance's address, which the balancer probes before it lets an ejected
    /// instance back.
    fn origin(&self) -> Option<&dyn Origin> {
        Some(&self.inner)
    }
}

/// A response from an instance, and what counting it needs: the proxy counts it once it
/// knows what the client gets (the instance's status, or a 502 when the body failed
/// before its first byte).
#[derive(Debug)]
pub(crate) struct Served {
    pub(crate) response: Response<ResponseBody>,
    pub(crate) tally: Tally,
}

/// Who served a response, and whether from a fallback subset.
#[derive(Debug)]
pub(crate) struct Tally {
    me: Arc<Identity>,
    routed: Option<Routed>,
}

/// Who answered a response: its service and instance, for a log line about it (one
/// reference count, nothing copied).
#[derive(Debug, Clone)]
pub(crate) struct Answerer(Arc<Identity>);

impl Answerer {
    pub(crate) fn service(&self) -> &str {
        &self.0.service
    }

    pub(crate) fn instance(&self) -> &str {
        &self.0.id
    }
}

impl Tally {
    /// Who served, for the response body to carry.
    pub(crate) fn answerer(&self) -> Answerer {
        Answerer(self.me.clone())
    }

    /// The id of the instance that served.
    pub(crate) fn instance(&self) -> &str {
        &self.me.id
    }

    /// Whether the request was served from a fallback subset: its own lane could not
    /// take it (no ready instance, or the one tried failed and the retry went elsewhere).
    pub(crate) fn fell_back(&self) -> bool {
        self.routed.as_ref().is_some_and(Routed::fallback)
    }

    /// Counts the answer to a request of `lane`: `status`, under the instance, and the
    /// fallback it was served from.
    pub(crate) fn count(self, lane: Option<&Lane>, status: u16) {
        let me = self.me;
        me.counters.request(lane, status);
        if let Some(routed) = self.routed.filter(Routed::fallback) {
            me.metrics.fallback(&me.service, lane, routed.subset());
        }
    }
}

/// The request an endpoint sends: the client's, its body replayable.
pub(crate) type UpstreamRequest = Request<ReplayBody<ClientBody>>;

impl<S> Service<UpstreamRequest> for Tagged<S>
where
    S: Service<UpstreamRequest, Response = Response<ResponseBody>, Error = BoxError>,
{
    type Response = Served;
    type Error = BoxError;
    type Future = TaggedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: UpstreamRequest) -> Self::Future {
        let routed = req.extensions_mut().remove::<Routed>();
        TaggedFuture {
            inner: self.inner.call(req),
            done: Some((self.me.clone(), routed)),
        }
    }
}

pin_project! {
    /// The response future of [`Tagged`].
    pub(crate) struct TaggedFuture<F> {
        #[pin]
        inner: F,
        done: Option<(Arc<Identity>, Option<Routed>)>,
    }
}

impl<F> Future for TaggedFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody>, BoxError>>,
{
    type Output = Result<Served, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // An error is counted by the proxy, which turns it into a 502.
        let mut response = match std::task::ready!(this.inner.poll(cx)) {
            Ok(response) => response,
            Err(e) => {
                if let Some((me, _)) = this.done.as_ref() {
                    log_tls_failure(me, &*e);
                }
                return Poll::Ready(Err(e));
            }
        };
        let Some((me, routed)) = this.done.take() else {
            return Poll::Ready(Err("response future polled after completion".into()));
        };
        if let Some(header) = &me.header {
            response
                .headers_mut()
                .insert(X_GRAY_INSTANCE, header.clone());
        }
        Poll::Ready(Ok(Served {
            response,
            tally: Tally { me, routed },
        }))
    }
}

/// Logs a failed TLS handshake with the instance `me`: a configuration to fix (a CA, a
/// name, a certificate), named with the instance and the reason. The request may still be
/// served by another instance (it was not sent), and the failure counts towards the
/// instance's ejection.
fn log_tls_failure(me: &Identity, error: &(dyn std::error::Error + 'static)) {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(failed) = e.downcast_ref::<RequestError>() {
            if failed.is_tls() {
                tracing::warn!(service = %me.service, instance = %me.id, error = %failed, "TLS handshake with the instance failed");
            }
            return;
        }
        cause = e.source();
    }
}

/// The response header naming the instance that served it.
pub const X_GRAY_INSTANCE: HeaderName = HeaderName::from_static("x-gray-instance");

type Endpoint = Tagged<HttpEndpoint<Connector, ReplayBody<ClientBody>>>;

/// The balancer the proxy sends through, retrying where that is safe: one handle (cloned
/// per request) shared by every connection; it picks in the connection's task, without a
/// lock.
pub(crate) type Balancer = Retry<InstanceId, Endpoint>;

/// The future of a request sent through [`Balancer`].
pub(crate) type BalancerCall = RetryFuture<InstanceId, Endpoint, ClientBody>;

/// One routed service.
pub(crate) struct Upstream {
    /// Its name.
    pub(crate) name: Arc<str>,
    /// Its routing policy (the balancer holds a copy).
    pub(crate) policy: Policy,
    /// The balancer, shared by every connection.
    pub(crate) balancer: Balancer,
    /// Whether the service's name is taken off the path (`strip_prefix`).
    pub(crate) strip_prefix: bool,
    /// Its instances are spoken to in HTTP/2 only (`protocol = "http2"`): no upgrade.
    pub(crate) http2_only: bool,
    /// What its requests show, by lane and for a running rollout.
    pub(crate) evidence: Arc<ServiceEvidence>,
    /// Its mirror, if it has one (`[services.x.mirror]`).
    pub(crate) mirror: Option<Arc<crate::mirror::Mirror>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("policy", &self.policy.name())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// Builds the balancer for `config` over `instances`, with connections from `pool` and at
    /// most `max_in_flight_per_instance` requests in flight per instance (0: no cap),
    /// and spawns its background task (it follows the registry whether or not requests
    /// flow).
    pub(crate) fn new(
        config: &ServiceConfig,
        instances: ServiceInstances,
        pool: &HttpEndpoints<Connector, ReplayBody<ClientBody>>,
        metrics: &Arc<Metrics>,
        max_in_flight_per_instance: u32,
    ) -> Upstream {
        let service: Arc<str> = config.name.as_str().into();
        let evidence = Arc::new(ServiceEvidence::new(metrics.max_lanes()));
        let metrics = metrics.clone();
        let transport = &config.transport;
        let pool = pool
            .clone()
            .with_protocol(transport.protocol)
            .with_tls(match &transport.tls {
                Some(tls) => tls.clone(),
                None => crate::config::system_tls(),
            });
        if transport.insecure {
            tracing::warn!(
                service = %service,
                "services.{service}.tls.insecure_skip_verify = true: the instances' certificates are NOT checked; anyone on the path can impersonate them"
            );
        }
        let endpoints = instances.discover().map(move |change| {
            change.map(|change| match change {
                Change::Insert(id, instance) => {
                    // The endpoint gets the address only: the labels live in `Identity`,
                    // so the clone each request calls copies no label map.
                    let bare = Instance::new(id.clone(), instance.address().clone(), Labels::new());
                    let me = Arc::new(Identity {
                        service: service.clone(),
                        id: Arc::from(id.as_str()),
                        labels: instance.labels().clone(),
                        header: HeaderValue::from_str(id.as_str()).ok(),
                        counters: metrics.endpoint(&service, id.as_str()),
                        metrics: metrics.clone(),
                    });
                    let inner = pool.endpoint(bare);
                    Change::Insert(id, Tagged { inner, me })
                }
                Change::Remove(id) => {
                    // Its series go with it: the label sets stay bounded by the registry.
                    metrics.remove_endpoint(&service, id.as_str());
                    Change::Remove(id)
                }
            })
        });
        // Over HTTP/2 an instance may refuse a stream it was sent (REFUSED_STREAM, a
        // graceful GOAWAY): never processed, it may go elsewhere whatever its method, which
        // takes a copy of every request (up to `max_replay_bytes`), not only idempotent ones.
        let retry = match config.transport.protocol {
            gray_discovery::http::Protocol::Http1 => config.retry.clone(),
            _ => config.retry.clone().with_copies(Copies::All),
        };
        let balancer = BalanceLayer::new(&config.name, config.policy.clone())
            .with_pick(config.pick)
            .with_routed(RecordRouted::Fallbacks)
            .with_retry(retry)
            .with_probe(config.probe.clone())
            .with_ejection(config.ejection)
            .with_max_pending(max_in_flight_per_instance)
            .build(endpoints);
        Upstream {
            name: config.name.as_str().into(),
            policy: config.policy.clone(),
            balancer: Retry::new(balancer),
            strip_prefix: config.strip_prefix,
            http2_only: config.transport.protocol == gray_discovery::http::Protocol::Http2,
            evidence,
            mirror: None,
        }
    }

    /// The balancer under the retries.
    pub(crate) fn balance(&self) -> &Balance<InstanceId, Endpoint> {
        self.balancer.get_ref()
    }
}
