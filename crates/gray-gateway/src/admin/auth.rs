//! Who may use the admin address: with an `admin_token`, every command (a `POST` under
//! `/rollouts`) needs `Authorization: Bearer <token>`, and with `admin_token_for_reads`
//! every read does too. The page's own files (`/`, `/ui/…`) and `/healthz` never need it:
//! they hold no data, and a probe has no token. A request without the right token gets
//! 401 with a JSON body that says what was missing, and `WWW-Authenticate: Bearer`.

use axum::{
    Json,
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http::{HeaderValue, Method, StatusCode, header};

use crate::config::AdminAccess;

/// What a request asks of the admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The page's files and `/healthz`: open to anyone who reaches the address.
    Open,
    /// Reading state: the API, `/metrics`, `/explain`.
    Read,
    /// Changing state: the rollout commands.
    Change,
}

/// The access `method` on `path` needs.
pub(crate) fn access(method: &Method, path: &str) -> Access {
    if path == "/" || path == "/healthz" || path.starts_with("/ui/") {
        return Access::Open;
    }
    // `POST /explain` reads: it describes a request, and changes nothing.
    let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
        || (*method == Method::POST && path == "/explain");
    if reads { Access::Read } else { Access::Change }
}

/// Why a request was refused, if it was.
fn refusal(access: &AdminAccess, req: &Request) -> Option<&'static str> {
    let token = access.token.as_ref()?;
    match self::access(req.method(), req.uri().path()) {
        Access::Open => return None,
        Access::Read if !access.for_reads => return None,
        Access::Read | Access::Change => {}
    }
    let Some(presented) = req.headers().get(header::AUTHORIZATION) else {
        return Some(
            "this admin needs a bearer token for this request: send `Authorization: Bearer <admin_token>`",
        );
    };
    let presented = presented.as_bytes();
    let Some(token_part) = presented
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .and_then(|_| presented.get(7..))
    else {
        return Some("the `Authorization` header is not `Bearer <admin_token>`");
    };
    if token.matches(token_part.trim_ascii()) {
        None
    } else {
        Some("the bearer token is not this admin's `admin_token`")
    }
}

/// The middleware: lets a request through, or answers 401.
pub(crate) async fn guard(State(access): State<AdminAccess>, req: Request, next: Next) -> Response {
    match refusal(&access, &req) {
        None => next.run(req).await,
        Some(reason) => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"gray admin\""),
            )],
            Json(serde_json::json!({ "error": reason })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_change_and_the_page_is_open() {
        assert_eq!(access(&Method::GET, "/"), Access::Open);
        assert_eq!(access(&Method::GET, "/ui/app.js"), Access::Open);
        assert_eq!(access(&Method::GET, "/healthz"), Access::Open);
        assert_eq!(access(&Method::GET, "/rollouts/orders"), Access::Read);
        assert_eq!(access(&Method::GET, "/metrics"), Access::Read);
        assert_eq!(access(&Method::POST, "/explain"), Access::Read);
        assert_eq!(access(&Method::POST, "/rollouts/orders"), Access::Change);
        assert_eq!(
            access(&Method::POST, "/rollouts/orders/abort"),
            Access::Change
        );
        // whatever else a client sends is treated as a change, not let through as a read
        assert_eq!(access(&Method::DELETE, "/rollouts/orders"), Access::Change);
        assert_eq!(access(&Method::PUT, "/metrics"), Access::Change);
    }
}
