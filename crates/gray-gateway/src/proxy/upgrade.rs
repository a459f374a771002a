//! Upgrade requests (WebSocket) through the proxy: readied for their instance, and a
//! `101` handed over as the client's tunnel ([`crate::upgrade`]).

use std::sync::Arc;

use bytes::Bytes;
use gray_core::Lane;
use gray_discovery::http::ResponseBody;
use gray_tower::edge::hop;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use super::{Body, Routes, answers::json};
use crate::{
    rollout::Timing,
    upgrade::{Offer, Ticket},
    upstream::{Tally, Upstream},
};

/// An upgrade request on its way: what its tunnel needs once the instance switched.
#[derive(Debug)]
pub(crate) struct Upgrading {
    offer: Offer,
    ticket: Ticket,
}

/// Readies an upgrade request for its instance: its `Connection` and `Upgrade` headers
/// back (the edge took them off as hop-by-hop), and a place under `max_upgraded`; or the
/// gateway's answer when it cannot go.
pub(super) fn upgrade(
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
pub(super) fn switched(
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
