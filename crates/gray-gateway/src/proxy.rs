//! The proxy: `/{service}/rest` goes to an instance of `service` as `/rest`.

use std::{
    borrow::Cow, collections::BTreeMap, future::Future, net::IpAddr, pin::Pin, sync::Arc,
    task::Poll, time::Duration,
};

use bytes::Bytes;
use gray_core::{Lane, Stain};
use gray_discovery::http::{RequestError, ResponseBody};
use gray_policy::Unroutable;
use http::{
    HeaderValue, Request, Response, StatusCode, Uri, header,
    uri::{InvalidUri, PathAndQuery},
};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tower::Service;

use gray_tower::edge::{PathRejected, RawUri, client_ip, hop};

use crate::{
    metrics::Metrics,
    upstream::{BalancerCall, Upstream},
};

/// The body of every gateway response: streamed from the upstream, or made here.
pub(crate) type Body = Either<ResponseBody, Full<Bytes>>;

/// The routing table and what every request needs.
#[derive(Debug)]
pub(crate) struct Routes {
    /// The upstream of each service, by name (a few string comparisons to find one, no
    /// hashing of a name that comes from the request path).
    pub(crate) services: BTreeMap<Box<str>, Upstream>,
    /// The time allowed until an upstream's response headers (the endpoints enforce it;
    /// here it is reported in the 504's body).
    pub(crate) timeout: Duration,
    /// The counters.
    pub(crate) metrics: Arc<Metrics>,
    /// Whether a path whose normalised form leaves its `/{service}` prefix is refused.
    pub(crate) reject_prefix_escape: bool,
}

/// The proxy service (behind the edge layer), one per connection. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Proxy {
    routes: Arc<Routes>,
    /// The connection's peer as an `X-Forwarded-For` value, made once per connection.
    forwarded_for: Option<HeaderValue>,
}

impl Proxy {
    /// The proxy for the connection from `peer`, which it appends to `X-Forwarded-For`.
    pub(crate) fn for_peer(routes: Arc<Routes>, peer: IpAddr) -> Self {
        Proxy {
            routes,
            forwarded_for: Some(client_ip::forwarded_for(peer)),
        }
    }
}

/// Whether `error` (or one of its sources) is the endpoint's response timeout.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<RequestError>()
            .is_some_and(RequestError::is_timeout)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::from(value.to_string()))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
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
        // The edge layer rejected the path (an encoded slash, `..` above the root, …): no
        // rule saw it, and it is not forwarded.
        if let Some(PathRejected(e)) = req.extensions().get::<PathRejected>() {
            return ProxyFuture::ready(json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "invalid path", "reason": e.kind().as_str(), "detail": e.to_string()}),
            ));
        }
        // The edge rewrote the path to its normal form: `/svc/../other/x` became
        // `/other/x`. A client that names one service in its path must not reach another.
        if routes.reject_prefix_escape {
            if let Some(RawUri(raw)) = req.extensions().get::<RawUri>() {
                if escapes_prefix(raw.path(), req.uri().path()) {
                    return ProxyFuture::ready(json(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": "invalid path", "reason": "prefix_escape", "detail": "the normalised path leaves the /{service} prefix the request names"}),
                    ));
                }
            }
        }
        let Some((service, rest)) = split(req.uri()) else {
            return ProxyFuture::ready(json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "no service in the path; expected /{service}/…"}),
            ));
        };
        let Some(upstream) = routes.services.get(service) else {
            return ProxyFuture::ready(json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "unknown service", "service": service}),
            ));
        };
        match rest {
            Ok(rest) => *req.uri_mut() = Uri::from(rest),
            Err(_) => {
                return ProxyFuture::ready(json(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": "invalid path"}),
                ));
            }
        }
        // The edge layer in front removed the client's hop-by-hop headers before it wrote
        // the stain; removing them here would let `Connection` name the stain's headers.
        // `Expect: 100-continue` is the gateway's to answer (hyper sends `100 Continue` when
        // the body is first read, by the upstream connection): the upstream never sees it.
        if req.headers().contains_key(header::EXPECT) {
            req.headers_mut().remove(header::EXPECT);
        }
        if let Some(peer) = &self.forwarded_for {
            client_ip::append_forwarded_for(req.headers_mut(), peer);
        }
        let lane = req
            .extensions()
            .get::<Stain>()
            .and_then(|c| c.lane().cloned());
        // The endpoint's response timeout bounds the wait for the response head. A service
        // with no instance that fits fails at once (503).
        ProxyFuture {
            state: State::Upstream {
                call: upstream.balancer.clone().call(req),
                routes: self.routes.clone(),
                service: upstream.name.clone(),
                lane,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Proxy`]: the upstream's response with its hop-by-hop
    /// headers removed, or the gateway's own answer (404, 502, 503, 504).
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
            routes: Arc<Routes>,
            service: Arc<str>,
            lane: Option<Lane>,
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

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Ready { response } => {
                Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                    json(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        serde_json::json!({"error": "response polled after completion"}),
                    )
                })))
            }
            StateProj::Upstream {
                call,
                routes,
                service,
                lane,
            } => {
                let error = match std::task::ready!(call.poll(cx)) {
                    // Served by an instance: the endpoint wrapper counted it and named the
                    // instance.
                    Ok(mut res) => {
                        hop::strip(res.headers_mut());
                        return Poll::Ready(Ok(res.map(Either::Left)));
                    }
                    Err(error) => error,
                };
                let res = failed(routes, service, lane.as_ref(), &*error);
                routes
                    .metrics
                    .answered(service, lane.as_ref(), res.status().as_u16());
                Poll::Ready(Ok(res))
            }
        }
    }
}

/// The gateway's answer when the upstream call failed: 504 for a timeout, 503 naming
/// service, lane and policy when no instance fits, 502 otherwise.
fn failed(
    routes: &Routes,
    service: &Arc<str>,
    lane: Option<&Lane>,
    e: &(dyn std::error::Error + Send + Sync + 'static),
) -> Response<Body> {
    let lane_label = lane.map_or("baseline", |l| l.as_str());
    if is_timeout(e) {
        tracing::warn!(service = %service, lane = lane_label, error = %e, "upstream timed out");
        return json(
            StatusCode::GATEWAY_TIMEOUT,
            serde_json::json!({"error": "upstream timed out", "detail": e.to_string(), "service": &**service, "timeout_ms": routes.timeout.as_millis() as u64}),
        );
    }
    match e.downcast_ref::<Unroutable>() {
        Some(unroutable) => {
            tracing::info!(service = %service, lane = lane_label, error = %unroutable, "unroutable");
            json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({
                    "error": unroutable.to_string(),
                    "service": unroutable.service(),
                    "lane": lane.map(|l| l.as_str()),
                    "policy": unroutable.policy(),
                    "detail": unroutable,
                }),
            )
        }
        None => {
            tracing::warn!(service = %service, lane = lane_label, error = %e, "upstream failed");
            json(
                StatusCode::BAD_GATEWAY,
                serde_json::json!({"error": e.to_string(), "service": &**service}),
            )
        }
    }
}

/// The first segment of a path as normalising it would leave it, skipping empty and `.`
/// segments (`/./%73vc/x` → `svc`); `None` when it starts by climbing (`/../x`).
fn first_segment(path: &str) -> Option<Cow<'_, str>> {
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        if segment.bytes().all(|b| b != b'%' && b != b'.') {
            return Some(Cow::Borrowed(segment));
        }
        let alone = format!("/{segment}");
        let normal = gray_rules::path::normalize(&alone).ok()?;
        match normal.strip_prefix('/') {
            Some("") => {}
            Some(s) => return Some(Cow::Owned(s.to_owned())),
            None => return None,
        }
    }
    Some(Cow::Borrowed(""))
}

/// Whether normalising `raw` into `normal` moved it out of the first segment it names:
/// `/svc/../other/x` → `/other/x`.
fn escapes_prefix(raw: &str, normal: &str) -> bool {
    let named = first_segment(raw);
    let now = normal
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    named.as_deref() != Some(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_climbs_out_of_its_service_escapes() {
        for (raw, normal, escapes) in [
            ("/svc/../other/x", "/other/x", true),
            ("/svc/x/../../other/x", "/other/x", true),
            ("/svc/..", "/", true),
            ("/svc/x/../y", "/svc/y", false),
            ("/svc/../svc/y", "/svc/y", false),
            ("//svc//x", "/svc/x", false),
            ("/./svc/x", "/svc/x", false),
            ("/%73vc/x", "/svc/x", false),
            ("/svc/%2e%2e/other", "/other", true),
        ] {
            assert_eq!(escapes_prefix(raw, normal), escapes, "{raw}");
        }
    }

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
