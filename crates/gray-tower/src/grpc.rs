//! gRPC requests, and the answer a layer gives one itself: a gRPC status, not an HTTP
//! error with a JSON or HTML body, which a gRPC client would only report as "HTTP status
//! 400" (or worse, fail to decode).
//!
//! A request is gRPC when its `content-type` is `application/grpc` or
//! `application/grpc+…` / `application/grpc;…` ([`is_grpc`]). [`answer`] turns a response
//! into a *trailers-only* one: HTTP 200, `content-type: application/grpc`, `grpc-status`
//! and `grpc-message` (percent-encoded) in the head, and the caller gives it an empty
//! body. The status follows gRPC's "HTTP to gRPC status code mapping" ([`code`]), except
//! that a proxy's own timeout (504) is the deadline it is.
//!
//! [`Edge`](crate::Edge) answers a gRPC request it refuses (a rejected path) this way; the
//! gray gateway answers every gRPC request it does not forward this way.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
//! use gray_tower::grpc;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc+proto"));
//! assert!(grpc::is_grpc(&headers));
//!
//! let mut res = Response::new(());
//! grpc::answer(&mut res, StatusCode::BAD_REQUEST, "invalid path: 100% wrong");
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["grpc-status"], "13"); // INTERNAL
//! assert_eq!(res.headers()["grpc-message"], "invalid path: 100%25 wrong");
//! ```

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

/// Whether `headers` are a gRPC request's: `content-type: application/grpc` or
/// `application/grpc+…` / `application/grpc;…` (not `application/grpc-web`).
#[must_use]
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().strip_prefix(b"application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
}

/// The gRPC status code for an answer of HTTP `status`: 400 → `INTERNAL` (13), 401 →
/// `UNAUTHENTICATED` (16), 403 → `PERMISSION_DENIED` (7), 404 → `UNIMPLEMENTED` (12), 429,
/// 502, 503 → `UNAVAILABLE` (14), 499 (the client closed the request) → `CANCELLED` (1),
/// 504 → `DEADLINE_EXCEEDED` (4), anything else → `UNKNOWN` (2).
#[must_use]
pub fn code(status: StatusCode) -> u8 {
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 => 14,
        499 => 1,
        504 => 4,
        _ => 2,
    }
}

/// Makes `res` the trailers-only gRPC answer for HTTP `status` with `message` (see the
/// [module docs](self)); its body should be empty.
pub fn answer<B>(res: &mut Response<B>, status: StatusCode, message: &str) {
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    insert_status(headers, code(status), message);
}

/// The trailers that end a call with gRPC status `code` and `message`: for a proxy whose
/// upstream failed once the response had begun (gRPC's code for a lost transport is
/// `UNAVAILABLE`, 14, which clients retry; a reset stream would reach them as
/// `INTERNAL`).
///
/// ```
/// let trailers = gray_tower::grpc::status_trailers(14, "upstream lost: 100%");
/// assert_eq!(trailers["grpc-status"], "14");
/// assert_eq!(trailers["grpc-message"], "upstream lost: 100%25");
/// ```
#[must_use]
pub fn status_trailers(code: u8, message: &str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    insert_status(&mut trailers, code, message);
    trailers
}

fn insert_status(headers: &mut HeaderMap, code: u8, message: &str) {
    headers.insert("grpc-status", HeaderValue::from(u16::from(code)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", message);
    }
}

/// `message` as `grpc-message` carries it: bytes outside printable ASCII, and `%`,
/// percent-encoded.
fn percent_encode(message: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
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
            ("application/grpc;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_grpc(&headers), grpc, "{value}");
        }
        let mut res = Response::new(());
        answer(
            &mut res,
            StatusCode::SERVICE_UNAVAILABLE,
            "no instance: 100% é",
        );
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(res.headers()["grpc-message"], "no instance: 100%25 %C3%A9");
        assert_eq!(code(StatusCode::GATEWAY_TIMEOUT), 4);
        assert_eq!(code(StatusCode::TOO_MANY_REQUESTS), 14);
        assert_eq!(code(StatusCode::NOT_FOUND), 12);
        assert_eq!(code(StatusCode::BAD_REQUEST), 13);
        assert_eq!(code(StatusCode::INTERNAL_SERVER_ERROR), 2);
    }
}
