//! The proxy: `/{service}/rest` goes to an instance of `service` as `/rest` (or as it came,
//! with the service's `strip_prefix = false`: gRPC's `/{package.Service}/{Method}`).
//!
//! It runs behind the edge layer, which has done everything else a request needs before it
//! is routed (hop-by-hop headers, the stain, the path and its 400s, `X-Forwarded-For`): the
//! proxy only routes, forwards, holds the response head until the body's first frame
//! ([`hold`](crate::hold)), strips the response's hop-by-hop headers and maps failures to
//! a status ([`gray_balance::error::status_of`]).

use std::{
    collections::BTreeMap,
    future::Future,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use gray_balance::error::status_of;
use gray_core::{Lane, Stain, aborted::ClientAborted};
use gray_discovery::http::ResponseBody;
use gray_policy::Unroutable;
use http::{
    HeaderValue, Request, Response, StatusCode, Uri, header,
    uri::{InvalidUri, PathAndQuery},
};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tower::Service;

use gray_tower::edge::{ClientIpResolver, hop};

use crate::{
    config::Limits,
    hold::{First, HeldBody, Hold, poll_first},
    limits::{Flight, InFlight, Paced, Refused, SlowBody},
    metrics::Metrics,
    mirror::{Primary, Teed},
    rollout::Timing,
    upgrade::{Offer, Ticket, Tunnels},
    upstream::{BalancerCall, Served, Tally, Upstream},
};

/// The body of every gateway response: streamed from the upstream, or made here.
pub(crate) type Body = Either<HeldBody, Full<Bytes>>;

/// The routing table and what every request needs.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The upstream of each service, by name (a few string comparisons to find one, no
    /// hashing of a name that comes from the request path).
    pub(crate) services: BTreeMap<Box<str>, Upstream>,
    /// The time allowed until an upstream's response headers (the endpoints enforce it;
    /// here it is reported in the 504's body).
    pub(crate) timeout: Duration,
    /// How long a response head waits for its body's first frame ([`hold`](crate::hold)).
    pub(crate) head_hold: Duration,
    /// The counters.
    pub(crate) metrics: Arc<Metrics>,
    /// What a client may cost ([`limits`](crate::limits)).
    pub(crate) limits: Limits,
    /// The requests in flight, and their caps.
    pub(crate) in_flight: Arc<InFlight>,
    /// Who the client is, for its cap.
    pub(crate) clients: ClientIpResolver,
    /// The upgraded connections (WebSocket), and their cap.
    pub(crate) tunnels: Arc<Tunnels>,
}

/// The proxy service (behind the edge layer). Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    routes: Arc<Routes>,
    /// The connection's peer.
    peer: Option<IpAddr>,
}

impl Proxy {
    pub(crate) fn new(routes: Arc<Routes>) -> Self {
        Proxy { routes, peer: None }
    }

    /// The proxy of a connection from `peer`.
    pub(crate) fn with_peer(mut self, peer: SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }
}

pub(crate) fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::from(value.to_string()))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// The gateway's own answer: JSON, or a gRPC status to a gRPC request (its `error` as
/// the message).
fn reply(grpc: bool, status: StatusCode, value: serde_json::Value) -> Response<Body> {
    if grpc {
        let message = value["error"].as_str().unwrap_or_default();
        return crate::grpc::status(status, message);
    }
    json(status, value)
}

/// Splits `/service/rest?q` into `service` and `/rest?q` (`/service?q` into `service`
/// and `/?q`).
fn split(uri: &Uri) -> Option<(&str, Result<PathAndQuery, InvalidUri>)> {
    let path = uri.path().strip_prefix('/')?;
    let (service, rest) = match path.find('/') {
        // The rest of the path and the query are one slice of the original.
        Some(i) => {
            let whole = uri.path_and_query().map_or("", PathAndQuery::as_str);
            (&path[..i], PathAndQuery::try_from(&whole[i + 1..]))
        }
        None => (
            path,
            match uri.query() {
                Some(q) => PathAndQuery::try_from(format!("/?{q}")),
                None => Ok(PathAndQuery::from_static("/")),
            },
        ),
    };
    if service.is_empty() {
        return None;
    }
    Some((service, rest))
}

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = ProxyFuture;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// Routes the request and sends it to the service's balancer; answers here when the
    /// path names no known service.
    fn call(&mut self, mut req: Request<Incoming>) -> ProxyFuture {
        let routes = &*self.routes;
        let grpc = crate::grpc::is_grpc(req.headers());
        if let Some(res) = crate::target::refuse_target(&mut req) {
            return ProxyFuture::ready(res);
        }
        let Some((service, rest)) = split(req.uri()) else {
            return ProxyFuture::ready(reply(
                grpc,
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "no service in the path; expected /{service}/…"}),
            ));
        };
        let Some(upstream) = routes.services.get(service) else {
            return ProxyFuture::ready(reply(
                grpc,
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "unknown service", "service": service}),
            ));
        };
        let lane = req
            .extensions()
            .get::<Stain>()
            .and_then(|c| c.lane().cloned());
        // Timed from here; a running rollout reads the path before it is rewritten.
        let timing = upstream.evidence.start(&req, lane.as_ref());
        match rest {
            // `strip_prefix = false` (gRPC's `/package.Service/Method`): the path as it came.
            _ if !upstream.strip_prefix => {}
            Ok(rest) => *req.uri_mut() = Uri::from(rest),
            Err(_) => {
                timing.done(StatusCode::BAD_REQUEST.as_u16());
                return ProxyFuture::ready(reply(
                    grpc,
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": "invalid path"}),
                ));
            }
        }
        // The edge layer in front removed the client's hop-by-hop headers before it wrote
        // the stain, and appended the peer to `X-Forwarded-For`; removing hop-by-hop
        // headers here would let `Connection` name the stain's headers.
        // `Expect: 100-continue` is the gateway's to answer (hyper sends `100 Continue` when
        // the body is first read, by the upstream connection): the upstream never sees it.
        if req.headers().contains_key(header::EXPECT) {
            req.headers_mut().remove(header::EXPECT);
        }
        // `TE` is hop-by-hop, so the edge removed the client's; gRPC servers expect
        // `te: trailers` (the one value HTTP/2 allows), which says trailers are read.
        if grpc {
            req.headers_mut()
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
        // An upgrade (WebSocket): its headers back on, one of the `max_upgraded` places held
        // until its tunnel ends (`crate::upgrade`).
        let upgrading = match req.extensions_mut().remove::<Offer>() {
            None => None,
            Some(offer) => match upgrade(routes, upstream, lane.as_ref(), &mut req, offer) {
                Ok(upgrading) => Some(upgrading),
                Err(res) => {
                    timing.done(res.status().as_u16());
                    return ProxyFuture::ready(*res);
                }
            },
        };
        let client = routes
            .in_flight
            .per_client()
            .then(|| routes.clients.resolve(self.peer, req.headers()))
            .flatten();
        let flight = match routes.in_flight.enter(client) {
            Ok(flight) => flight,
            Err(refused) => {
                let (status, res) = refuse(routes, upstream, lane, grpc, refused, client);
                timing.done(status.as_u16());
                return ProxyFuture::ready(res);
            }
        };
        // A copy for the service's mirror, of a request baseline serves (never of an
        // upgrade): its body teed as it streams to baseline (`crate::mirror`).
        let (tee, primary) = match (&upstream.mirror, &upgrading) {
            (Some(mirror), None) => match mirror.offer(&mut req) {
                Some(offered) => (offered.tee, Some(Box::new(offered.primary))),
                None => (None, None),
            },
            _ => (None, None),
        };
        // The endpoint's response timeout bounds the wait for the response head. A service
        // with no instance that fits fails at once (503).
        ProxyFuture {
            state: State::Upstream {
                call: upstream.balancer.clone().call(req.map(|body| {
                    let limits = &routes.limits;
                    let paced = Paced::new(
                        body,
                        limits.request_body_timeout,
                        limits.request_body_min_rate,
                    );
                    Teed::new(paced, tee)
                })),
                hold: None,
                routes: self.routes.clone(),
                service: upstream.name.clone(),
                lane,
                grpc,
                timing,
                flight,
                yielded: false,
                upgrading,
                primary,
            },
        }
    }
}

/// An upgrade request on its way: what its tunnel needs once the instance switched.
#[derive(Debug)]
pub(crate) struct Upgrading {
    offer: Offer,
    ticket: Ticket,
}

/// Readies an upgrade request for its instance: its `Connection` and `Upgrade` headers
/// back (the edge took them off as hop-by-hop), and a place under `max_upgraded`; or the
/// gateway's answer when it cannot go.
fn upgrade(
    routes: &Routes,
    upstream: &Upstream,
    lane: Option<&Lane>,
    req: &mut Request<Incoming>,
    offer: Offer,
) -> Result<Box<Upgrading>, Box<Response<Body>>> {
    if upstream.http2_only {
        routes
            .metrics
            .answered(&upstream.name, lane, StatusCode::BAD_GATEWAY.as_u16());
        return Err(Box::new(json(
            StatusCode::BAD_GATEWAY,
            serde_json::json!({
                "error": "an upgrade (WebSocket) needs HTTP/1.1 to the instances; this service's protocol is http2",
                "service": &*upstream.name,
            }),
        )));
    }
    let Some(ticket) = routes.tunnels.admit() else {
        crate::limits::warn(crate::limits::Warning::Upgraded, |suppressed| {
            tracing::warn!(service = %upstream.name, cap = routes.tunnels.max(), suppressed, "upgrade refused: max_upgraded reached");
        });
        let status = StatusCode::SERVICE_UNAVAILABLE;
        routes
            .metrics
            .answered(&upstream.name, lane, status.as_u16());
        return Err(Box::new(json(
            status,
            serde_json::json!({"error": "max_upgraded reached", "limit": routes.tunnels.max(), "service": &*upstream.name}),
        )));
    };
    let headers = req.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, offer.protocol.clone());
    Ok(Box::new(Upgrading { offer, ticket }))
}

/// The instance's answer to an upgrade request: a `101` becomes the client's `101`, its
/// tunnel handed to the client's connection; any other answer goes on as it is.
fn switched(
    service: &Arc<str>,
    lane: Option<&Lane>,
    timing: &Timing,
    mut response: Response<ResponseBody>,
    tally: Tally,
    upgrading: Upgrading,
) -> Response<Body> {
    let protocol = response.headers().get(header::UPGRADE).cloned();
    let upstream = gray_discovery::http::upgraded(&mut response);
    let (Some(protocol), Some(upstream)) = (protocol, upstream) else {
        tally.count(lane, StatusCode::BAD_GATEWAY.as_u16());
        timing.done(StatusCode::BAD_GATEWAY.as_u16());
        return json(
            StatusCode::BAD_GATEWAY,
            serde_json::json!({"error": "the instance answered 101 without an Upgrade header", "service": &**service}),
        );
    };
    let Upgrading { offer, ticket } = upgrading;
    let tunnel = ticket.switched(service, lane, &protocol, upstream);
    offer.handoff.hand_over(tunnel);
    let fell_back = tally.fell_back();
    tally.count(lane, StatusCode::SWITCHING_PROTOCOLS.as_u16());
    timing.served(StatusCode::SWITCHING_PROTOCOLS.as_u16(), fell_back);
    let (mut head, _) = response.into_parts();
    hop::strip(&mut head.headers);
    head.headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    head.headers.insert(header::UPGRADE, protocol);
    Response::from_parts(head, Either::Right(Full::new(Bytes::new())))
}

pin_project_lite::pin_project! {
    /// The response future of [`Proxy`]: the upstream's response with its hop-by-hop
    /// headers removed, once its body's first frame arrived (or the hold's bound passed),
    /// or the gateway's own answer (404, 502, 503, 504).
    pub(crate) struct ProxyFuture {
        #[pin]
        state: State,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State {
        Ready { response: Option<Response<Body>> },
        Upstream {
            #[pin]
            call: BalancerCall,
            // Set once the response head arrived.
            hold: Option<Hold>,
            routes: Arc<Routes>,
            service: Arc<str>,
            lane: Option<Lane>,
            // The client speaks gRPC: the gateway's own answers are gRPC statuses.
            grpc: bool,
            timing: Timing,
            // Leaves the in-flight counts with the future.
            flight: Flight,
            // The first poll was seen (and yielded, when others were in flight: see
            // `ProxyFuture::poll`).
            yielded: bool,
            // An upgrade request (WebSocket).
            upgrading: Option<Box<Upgrading>>,
            // A request copied for the service's mirror: its copy gets the answer.
            primary: Option<Box<Primary>>,
        },
    }
}

impl std::fmt::Debug for ProxyFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyFuture").finish_non_exhaustive()
    }
}

impl ProxyFuture {
    fn ready(response: Response<Body>) -> Self {
        ProxyFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }
}

impl Future for ProxyFuture {
    type Output = Result<Response<Body>, std::convert::Infallible>;

    /// While other requests are in flight, sending to the upstream waits for one pass of
    /// the scheduler (a wake of the task by itself puts it at the back of the run queue):
    /// the requests that became ready together then go out together, so that the
    /// upstreams are woken once for several (nginx gets the same from its event loop,
    /// hyper-util's client from its connection tasks). A request alone in flight has
    /// nothing to wait for: it is sent at once, which saves the pass a client sending one
    /// request after another would pay for nothing. The answer is never held back: a
    /// second pass before answering cost 1.1 k instructions per request at 64 connections
    /// and saved no CPU (docs/performance.md). See the gateway docs, *Routing*.
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let response = match state.as_mut().project() {
            StateProj::Ready { response } => {
                return Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                    json(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        serde_json::json!({"error": "response polled after completion"}),
                    )
                })));
            }
            StateProj::Upstream {
                call,
                hold,
                routes,
                service,
                lane,
                grpc,
                timing,
                flight,
                yielded,
                upgrading,
                primary,
            } => {
                if !*yielded {
                    *yielded = true;
                    if flight.others_in_flight() {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                let mut finished = None;
                if hold.is_none() {
                    let Served {
                        mut response,
                        tally,
                    } = match std::task::ready!(call.poll(cx)) {
                        Ok(served) => served,
                        Err(error) => {
                            let (status, res) =
                                failed(routes, service, lane.as_ref(), *grpc, &*error);
                            // Timed and counted as the gateway's status, also when a gRPC
                            // client reads it as a gRPC status in an HTTP 200.
                            timing.done(status.as_u16());
                            routes
                                .metrics
                                .answered(service, lane.as_ref(), status.as_u16());
                            return Poll::Ready(Ok(res));
                        }
                    };
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                        let res = match upgrading.take() {
                            Some(upgrading) => switched(
                                service,
                                lane.as_ref(),
                                timing,
                                response,
                                tally,
                                *upgrading,
                            ),
                            // A 101 to a request that asked for no upgrade.
                            None => {
                                tally.count(lane.as_ref(), StatusCode::BAD_GATEWAY.as_u16());
                                timing.done(StatusCode::BAD_GATEWAY.as_u16());
                                json(
                                    StatusCode::BAD_GATEWAY,
                                    serde_json::json!({"error": "the instance switched protocols unasked (101)", "service": &**service}),
                                )
                            }
                        };
                        state.set(State::Ready { response: None });
                        return Poll::Ready(Ok(res));
                    }
                    hop::strip(response.headers_mut());
                    // Most bodies bring their first frame with the head: nothing is held.
                    let first = match poll_first(response.body_mut(), cx) {
                        Poll::Ready(first) => Some(first),
                        Poll::Pending if routes.head_hold.is_zero() => Some(First::Nothing),
                        Poll::Pending => None,
                    };
                    match first {
                        Some(first) => {
                            let served = Served { response, tally };
                            finished = Some(finish(
                                service,
                                lane,
                                *grpc,
                                timing,
                                served,
                                first,
                                primary.take(),
                            ));
                        }
                        None => *hold = Some(Hold::new(response, tally, routes.head_hold)),
                    }
                }
                match finished {
                    Some(response) => response,
                    // Held: polled at once, so that its timer is armed.
                    None => {
                        let Some(held) = hold.as_mut() else {
                            return Poll::Ready(Ok(polled_after_completion()));
                        };
                        match std::task::ready!(held.poll(cx)) {
                            Some((first, response, tally)) => finish(
                                service,
                                lane,
                                *grpc,
                                timing,
                                Served { response, tally },
                                first,
                                primary.take(),
                            ),
                            None => polled_after_completion(),
                        }
                    }
                }
            }
        };
        state.set(State::Ready { response: None });
        Poll::Ready(Ok(response))
    }
}

fn polled_after_completion() -> Response<Body> {
    json(
        StatusCode::INTERNAL_SERVER_ERROR,
        serde_json::json!({"error": "response polled after completion"}),
    )
}

/// The answer to a request an instance served, once its body showed what comes first:
/// the response, counted under the instance (and teed for its mirror's copy, if it has
/// one); or, when the body failed before its first byte, a 502 the client can act on,
/// counted under it as such.
fn finish(
    service: &Arc<str>,
    lane: &Option<Lane>,
    grpc: bool,
    timing: &Timing,
    served: Served,
    first: First,
    primary: Option<Box<Primary>>,
) -> Response<Body> {
    let Served { response, tally } = served;
    let lane = lane.as_ref();
    if let First::Failed(error) = first {
        let lane_label = lane.map_or("baseline", |l| l.as_str());
        let instance = tally.instance().to_owned();
        tally.count(lane, StatusCode::BAD_GATEWAY.as_u16());
        timing.done(StatusCode::BAD_GATEWAY.as_u16());
        tracing::warn!(service = %service, lane = lane_label, %instance, error = %error, "upstream failed after its response head, before its body: 502");
        return reply(
            grpc,
            StatusCode::BAD_GATEWAY,
            serde_json::json!({
                "error": format!("the upstream's response body failed before its first byte: {error}"),
                "service": &**service,
                "instance": instance,
            }),
        );
    }
    let fell_back = tally.fell_back();
    let answerer = tally.answerer();
    tally.count(lane, response.status().as_u16());
    timing.served(response.status().as_u16(), fell_back);
    let tee = primary.map(|p| p.answered(response.status(), response.headers()));
    response.map(|rest| Either::Left(HeldBody::new(first, rest, grpc, answerer).with_tee(tee)))
}

/// The answer to a request over an in-flight cap: 503 (all clients), 429 (its client's).
fn refuse(
    routes: &Routes,
    upstream: &Upstream,
    lane: Option<Lane>,
    grpc: bool,
    refused: Refused,
    client: Option<IpAddr>,
) -> (StatusCode, Response<Body>) {
    let (status, key, cap) = match refused {
        Refused::Total => (
            StatusCode::SERVICE_UNAVAILABLE,
            "max_in_flight",
            routes.limits.max_in_flight,
        ),
        Refused::Client => (
            StatusCode::TOO_MANY_REQUESTS,
            "max_in_flight_per_client",
            routes.limits.max_in_flight_per_client as usize,
        ),
    };
    crate::limits::warn(
        match refused {
            Refused::Total => crate::limits::Warning::InFlight,
            Refused::Client => crate::limits::Warning::ClientInFlight,
        },
        |suppressed| {
            tracing::warn!(service = %upstream.name, client = ?client, cap, suppressed, "request refused: {key} reached");
        },
    );
    routes
        .metrics
        .answered(&upstream.name, lane.as_ref(), status.as_u16());
    let res = reply(
        grpc,
        status,
        serde_json::json!({"error": format!("{key} reached"), "limit": cap, "service": &*upstream.name}),
    );
    (status, res)
}

/// The first of `error` and its sources that is a `T`.
pub(crate) fn find<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        cause = e.source();
    }
    None
}

/// The status of a request whose client went away with its body half sent: nginx's 499
/// (Client Closed Request), in the metrics and the rollout's timing; the client rarely
/// reads it.
fn client_closed_request() -> StatusCode {
    StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST)
}

/// The gateway's answer when the upstream call failed, by [`status_of`]: 408 for a body
/// too slow and 499 for a body the client abandoned (the client's doing), 504 for a
/// timeout, 503 naming service, lane and policy when no instance fits, 502 otherwise.
fn failed(
    routes: &Routes,
    service: &Arc<str>,
    lane: Option<&Lane>,
    grpc: bool,
    e: &(dyn std::error::Error + Send + Sync + 'static),
) -> (StatusCode, Response<Body>) {
    let lane_label = lane.map_or("baseline", |l| l.as_str());
    if let Some(slow) = find::<SlowBody>(e) {
        // The client's doing, not the upstream's.
        tracing::debug!(service = %service, lane = lane_label, error = %slow, "request body too slow");
        let status = StatusCode::REQUEST_TIMEOUT;
        let res = reply(
            grpc,
            status,
            serde_json::json!({"error": slow.to_string(), "service": &**service}),
        );
        return (status, res);
    }
    if let Some(aborted) = find::<ClientAborted>(e) {
        // The client went away with its body half sent (or reset its stream): nginx's
        // 499, counted under no instance, warned of at a bounded rate.
        crate::limits::warn(crate::limits::Warning::ClientAborted, |suppressed| {
            tracing::warn!(service = %service, lane = lane_label, error = %aborted, suppressed, "client aborted its request body: 499, no instance charged");
        });
        let res = reply(
            grpc,
            client_closed_request(),
            serde_json::json!({"error": format!("the request body failed at the client: {aborted}"), "service": &**service}),
        );
        return (client_closed_request(), res);
    }
    let status = status_of(e);
    match (status, find::<Unroutable>(e)) {
        (StatusCode::SERVICE_UNAVAILABLE, Some(unroutable)) => {
            tracing::info!(service = %service, lane = lane_label, error = %unroutable, "unroutable");
            let res = reply(
                grpc,
                status,
                serde_json::json!({
                    "error": unroutable.to_string(),
                    "service": unroutable.service(),
                    "lane": lane.map(|l| l.as_str()),
                    "policy": unroutable.policy(),
                    "detail": unroutable,
                }),
            );
            (status, res)
        }
        (StatusCode::GATEWAY_TIMEOUT, _) => {
            tracing::warn!(service = %service, lane = lane_label, error = %e, "upstream timed out");
            let res = reply(
                grpc,
                status,
                serde_json::json!({"error": "upstream timed out", "detail": e.to_string(), "service": &**service, "timeout_ms": routes.timeout.as_millis() as u64}),
            );
            (status, res)
        }
        _ => {
            tracing::warn!(service = %service, lane = lane_label, error = %e, "upstream failed");
            let status = StatusCode::BAD_GATEWAY;
            let res = reply(
                grpc,
                status,
                serde_json::json!({"error": e.to_string(), "service": &**service}),
            );
            (status, res)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_service_and_rest() {
        for (uri, service, rest) in [
            ("/orders/v1/items?id=3", "orders", "/v1/items?id=3"),
            ("/orders/", "orders", "/"),
            ("/orders", "orders", "/"),
            ("/orders?id=3", "orders", "/?id=3"),
            ("http://gw.example/orders/x?y", "orders", "/x?y"),
        ] {
            let uri: Uri = uri.parse().unwrap();
            let (s, r) = split(&uri).unwrap();
            assert_eq!((s, r.unwrap().as_str()), (service, rest), "{uri}");
        }
        for uri in ["/", "//x", "*"] {
            let uri: Uri = uri.parse().unwrap();
            assert!(split(&uri).is_none(), "{uri}");
        }
    }
}
