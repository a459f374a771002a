//! `GET /`: the admin page, and its files under `/ui/`. Everything is embedded in the
//! binary (`admin/assets/`, uPlot vendored with its licence): nothing is built at install
//! time and nothing is fetched from another host. Every admin answer carries a
//! Content-Security-Policy that lets a page load only from this address
//! (`default-src 'self'`), no inline script, and no framing.

use axum::{
    Router,
    extract::Request,
    middleware::Next,
    response::{IntoResponse, Response},
    routing::get,
};
use http::{HeaderValue, header};

/// The policy every admin answer carries.
pub(crate) const CSP: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file: its path, its media type and its bytes.
type Asset = (&'static str, &'static str, &'static [u8]);

const ASSETS: [Asset; 7] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_bytes!("assets/index.html"),
    ),
    (
        "/ui/app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/app.js"),
    ),
    (
        "/ui/app.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/app.css"),
    ),
    (
        "/ui/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/uplot/uPlot.iife.min.js"),
    ),
    (
        "/ui/uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/uplot/uPlot.min.css"),
    ),
    (
        "/ui/favicon.svg",
        "image/svg+xml",
        include_bytes!("assets/favicon.svg"),
    ),
    (
        "/ui/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("assets/uplot/LICENSE"),
    ),
];

/// The page's routes.
pub(super) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS
        .iter()
        .fold(Router::new(), |router, &(path, media_type, bytes)| {
            router.route(
                path,
                get(move || async move {
                    (
                        [
                            (header::CONTENT_TYPE, media_type),
                            // a new binary's page is read at the next load
                            (header::CACHE_CONTROL, "no-cache"),
                        ],
                        bytes,
                    )
                        .into_response()
                }),
            )
        })
}

/// The middleware that puts the security headers on every admin answer.
pub(crate) async fn secure(req: Request, next: Next) -> Response {
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
