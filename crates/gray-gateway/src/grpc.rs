//! gRPC through the gateway: what tells a gRPC request, and the gateway's own answers to
//! one (a gRPC status, not a JSON body).
//!
//! A request whose `content-type` is `application/grpc` (or `application/grpc+proto`, …)
//! that the gateway answers itself gets a *trailers-only* response: HTTP 200, `content-type:
//! application/grpc`, `grpc-status` and `grpc-message` (percent-encoded) in the head, no
//! body. The status follows gRPC's "HTTP to gRPC status code mapping", except that the
//! gateway's own timeout is the deadline it is:
//!
//! | gateway answer | gRPC status |
//! |---|---|
//! | 400 (invalid path) | `INTERNAL` (13) |
//! | 404 (no or unknown service) | `UNIMPLEMENTED` (12) |
//! | 429 (`max_in_flight_per_client` reached) | `UNAVAILABLE` (14) |
//! | 502 (the instance failed) | `UNAVAILABLE` (14) |
//! | 503 (no instance fits the stain, or an in-flight cap reached) | `UNAVAILABLE` (14), the reason as the message |
//! | 504 (no response head in `upstream_timeout_ms`) | `DEADLINE_EXCEEDED` (4) |
//! | anything else | `UNKNOWN` (2) |

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use crate::proxy::Body;

/// Whether `headers` are a gRPC request's: `content-type: application/grpc` or
/// `application/grpc+…` / `application/grpc;…`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().strip_prefix(b"application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// The gRPC status code of a gateway answer of `status`; see the [module docs](self).
pub(crate) fn code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 13,
        404 => 12,
        429 | 502 | 503 => 14,
        504 => 4,
        _ => 2,
    }
}

/// The trailers-only response for a gateway answer of `status` with `message`.
pub(crate) fn status(status: StatusCode, message: &str) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(u16::from(code(status))));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
    res
}

/// `message` as `grpc-message` carries it: bytes outside printable ASCII, and `%`,
/// percent-encoded.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_requests_and_their_statuses() {
        let mut headers = HeaderMap::new();
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_grpc(&headers), grpc, "{value}");
        }
        let res = status(StatusCode::SERVICE_UNAVAILABLE, "no instance: 100% é");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(res.headers()["grpc-message"], "no instance: 100%25 %C3%A9");
        assert_eq!(code(StatusCode::GATEWAY_TIMEOUT), 4);
        assert_eq!(code(StatusCode::TOO_MANY_REQUESTS), 14);
        assert_eq!(code(StatusCode::NOT_FOUND), 12);
        assert_eq!(code(StatusCode::BAD_REQUEST), 13);
        assert_eq!(code(StatusCode::INTERNAL_SERVER_ERROR), 2);
    }
}
