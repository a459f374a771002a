//! The request target before routing: what the gateway answers itself, or fixes, because
//! of the target or the method alone (RFC 9112 §3.2, RFC 9110 §9.3.6 and §9.3.7), before
//! the [proxy](crate::proxy) routes the path.

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use crate::proxy::{Body, json};

/// The methods the gateway proxies, as `OPTIONS *` and a refused `CONNECT` list them.
const ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// What the gateway answers itself, or fixes, before routing (RFC 9112 §3.2, RFC 9110
/// §9.3.6 and §9.3.7):
///
/// - an HTTP/1.1 request without `Host`, or with more than one: `400`;
/// - an HTTP/1.x request in absolute form (`GET http://host/svc/x`): its authority
///   replaces `Host`, as a proxy must;
/// - `CONNECT`: `405` with `Allow` (the gateway is a reverse proxy, not a tunnel; an
///   HTTP/2 extended CONNECT is not offered: the gateway does not announce
///   `SETTINGS_ENABLE_CONNECT_PROTOCOL`);
/// - `OPTIONS *`: `204` with `Allow`, the gateway's own (no instance is asked).
pub(crate) fn refuse_target(req: &mut Request<Incoming>) -> Option<Response<Body>> {
    let h1 = req.version() <= http::Version::HTTP_11;
    if h1 {
        let hosts = req.headers().get_all(header::HOST).iter().count();
        if req.version() == http::Version::HTTP_11 && hosts != 1 {
            let error = if hosts == 0 {
                "an HTTP/1.1 request needs a Host header (RFC 9112 §3.2)"
            } else {
                "more than one Host header (RFC 9112 §3.2)"
            };
            return Some(json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({ "error": error }),
            ));
        }
        if let Some(authority) = req.uri().authority()
            && req.method() != http::Method::CONNECT
        {
            match HeaderValue::from_str(authority.as_str()) {
                Ok(host) => {
                    req.headers_mut().insert(header::HOST, host);
                }
                Err(_) => {
                    return Some(json(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({ "error": "invalid authority in the request target" }),
                    ));
                }
            }
        }
    }
    let allowed = |status: StatusCode, value: serde_json::Value| {
        let mut res = json(status, value);
        res.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        res
    };
    if req.method() == http::Method::CONNECT {
        return Some(allowed(
            StatusCode::METHOD_NOT_ALLOWED,
            serde_json::json!({ "error": "CONNECT is not proxied: the gateway routes /{service}/… to instances, it opens no tunnels" }),
        ));
    }
    if req.method() == http::Method::OPTIONS && req.uri() == "*" {
        let mut res = allowed(StatusCode::NO_CONTENT, serde_json::Value::Null);
        *res.body_mut() = Either::Right(Full::new(Bytes::new()));
        res.headers_mut().remove(header::CONTENT_TYPE);
        return Some(res);
    }
    None
}
