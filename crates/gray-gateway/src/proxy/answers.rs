//! The gateway's own answers: JSON, or a gRPC status to a gRPC request; the refusals of
//! the in-flight caps; and the status of a failed upstream call.

use std::{net::IpAddr, sync::Arc};

use bytes::Bytes;
use gray_balance::error::status_of;
use gray_core::{Lane, aborted::ClientAborted};
use gray_policy::Unroutable;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use super::{Body, Routes};
use crate::{
    limits::{Refused, SlowBody},
    upstream::Upstream,
};

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
pub(super) fn reply(grpc: bool, status: StatusCode, value: serde_json::Value) -> Response<Body> {
    if grpc {
        let message = value["error"].as_str().unwrap_or_default();
        return crate::grpc::status(status, message);
    }
    json(status, value)
}

/// The answer to a request over an in-flight cap: 503 (all clients), 429 (its client's).
pub(super) fn refuse(
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
pub(super) fn failed(
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
