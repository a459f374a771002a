//! gRPC through the gateway: what tells a gRPC request, and the gateway's own answers to
//! one (a gRPC status, not a JSON body).
//!
//! A request whose `content-type` is `application/grpc` (or `application/grpc+proto`, …)
//! that the gateway answers itself gets a *trailers-only* response: HTTP 200, `content-type:
//! application/grpc`, `grpc-status` and `grpc-message` (percent-encoded) in the head, no
//! body (`gray_tower::grpc`). The status follows gRPC's "HTTP to gRPC status code mapping",
//! except that the gateway's own timeout is the deadline it is:
//!
//! | gateway answer | gRPC status |
//! |---|---|
//! | 400 (invalid path: the edge's refusal, answered by gray-tower's `Edge` the same way) | `INTERNAL` (13) |
//! | 404 (no or unknown service) | `UNIMPLEMENTED` (12) |
//! | 429 (`max_in_flight_per_client` reached) | `UNAVAILABLE` (14) |
//! | 502 (the instance failed) | `UNAVAILABLE` (14) |
//! | 503 (no instance fits the stain, or an in-flight cap reached) | `UNAVAILABLE` (14), the reason as the message |
//! | 504 (no response head in `upstream_timeout_ms`) | `DEADLINE_EXCEEDED` (4) |
//! | 499 (the client abandoned its request body) | `CANCELLED` (1) |
//! | anything else | `UNKNOWN` (2) |
//!
//! Once a call's response has begun, an upstream failing mid-stream (its connection lost,
//! its stream reset: a killed gRPC server) ends the call with trailers `grpc-status: 14`
//! (`UNAVAILABLE`), what gRPC gives a lost transport and what clients' retry policies
//! retry, instead of a reset stream, which clients read as `INTERNAL`.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use crate::proxy::Body;

pub(crate) use gray_tower::grpc::is_grpc;

/// The trailers-only response for a gateway answer of `status` with `message`
/// ([`gray_tower::grpc::answer`]).
pub(crate) fn status(status: StatusCode, message: &str) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::new())));
    gray_tower::grpc::answer(&mut res, status, message);
    res
}
