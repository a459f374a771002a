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
    net::{IpAddr, SocketAddr},
    sync::Arc,
    task::Poll,
    time::Duration,
};

use bytes::Bytes;
use gray_core::Stain;
use http::{
    HeaderValue, Request, Response, StatusCode, Uri, header,
    uri::{InvalidUri, PathAndQuery},
};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tower::Service;

use gray_tower::edge::ClientIpResolver;

use crate::{
    config::Limits,
    hold::HeldBody,
    limits::{InFlight, Paced},
    metrics::Metrics,
    mirror::Teed,
    upgrade::{Offer, Tunnels},
    upstream::Upstream,
};

mod answers;
mod future;
mod upgrade;

pub(crate) use self::{
    answers::{find, json},
    future::ProxyFuture,
};
use self::{
    answers::{refuse, reply},
    future::{Call, State},
    upgrade::upgrade,
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
                Some(offered) => (offered.tee, Some(offered.primary)),
                None => (None, None),
            },
            _ => (None, None),
        };
        // The endpoint's response timeout bounds the wait for the response head. A service
        // with no instance that fits fails at once (503).
        ProxyFuture {
            state: State::Upstream {
                call: Box::pin(Call::Sending {
                    call: upstream.balancer.clone().call(req.map(|body| {
                        let limits = &routes.limits;
                        let paced = Paced::new(
                            body,
                            limits.request_body_timeout,
                            limits.request_body_min_rate,
                        );
                        Teed::new(paced, tee)
                    })),
                }),
                hold: None,
                routes: self.routes.clone(),
                service: upstream.name.clone(),
                lane,
                grpc,
                timing,
                flight,
                upgrading,
                primary,
            },
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
