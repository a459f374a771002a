//! What the edge answers itself, and the notices it logs once: a request it refuses (a
//! rejected path, a path that climbs out of the segment it names, an edge placed after
//! axum's routing), and a request that arrives without the peer address the
//! configuration needs.

use std::{
    borrow::Cow,
    fmt::Write as _,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
};

use bytes::Bytes;
use gray_rules::path::{PathError, normalize};
use http::StatusCode;

/// Why the edge answered a request itself instead of passing it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The path was rejected by normalisation: 400.
    Path(PathError),
    /// The normalised path leaves the first segment the client named: 400.
    PrefixEscape,
    /// The edge runs after axum's routing (it found a `MatchedPath`): 500.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    AfterRouting,
}

/// The 500 body's advice, and the ERROR event's.
pub(crate) const AFTER_ROUTING: &str = "EdgeLayer runs after axum's routing (the request \
    has a MatchedPath): the path was routed before the edge normalised it, so /api/../web/x \
    would reach the api routes as /web/x. Wrap the Router instead of layering it: \
    Router::new().fallback_service(EdgeLayer::new(rules).layer(router)), served with \
    into_make_service_with_connect_info::<SocketAddr>() so that the edge knows the client IP";

// === impl Refusal ===

impl Refusal {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Refusal::Path(_) | Refusal::PrefixEscape => StatusCode::BAD_REQUEST,
            Refusal::AfterRouting => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON body: `{"error": …, "reason": …, "detail": …}`.
    pub(crate) fn body(self) -> Bytes {
        let (error, reason, detail) = self.parts();
        let mut json = String::with_capacity(64 + detail.len());
        json.push_str("{\"error\":");
        push_json_string(&mut json, error);
        json.push_str(",\"reason\":");
        push_json_string(&mut json, reason);
        json.push_str(",\"detail\":");
        push_json_string(&mut json, &detail);
        json.push('}');
        Bytes::from(json)
    }

    /// The message of a gRPC status: `<error> (<reason>): <detail>`.
    pub(crate) fn message(self) -> String {
        let (error, reason, detail) = self.parts();
        format!("{error} ({reason}): {detail}")
    }

    /// What failed, its short reason, and the detail.
    fn parts(self) -> (&'static str, &'static str, Cow<'static, str>) {
        match self {
            Refusal::Path(e) => ("invalid path", e.kind().as_str(), e.to_string().into()),
            Refusal::PrefixEscape => (
                "invalid path",
                "prefix_escape",
                "the normalised path leaves the first segment the request names".into(),
            ),
            Refusal::AfterRouting => (
                "edge layer after routing",
                "after_routing",
                AFTER_ROUTING.into(),
            ),
        }
    }
}

/// Appends `s` as a JSON string.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// === prefix escape ===

/// The first segment of a path as normalising it would leave it, skipping empty and `.`
/// segments (`/./%73vc/x` → `svc`); `None` when it starts by climbing (`/../x`).
fn first_segment(path: &str) -> Option<Cow<'_, str>> {
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        if segment.bytes().all(|b| b != b'%' && b != b'.') {
            return Some(Cow::Borrowed(segment));
        }
        let alone = format!("/{segment}");
        let normal = normalize(&alone).ok()?;
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
pub(crate) fn escapes_prefix(raw: &str, normal: &str) -> bool {
    let named = first_segment(raw);
    let now = normal
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or("");
    named.as_deref() != Some(now)
}

// === notices ===

/// The events the edge logs once per layer rather than per request.
#[derive(Debug, Default)]
pub(crate) struct Notices {
    /// The ERROR for an edge placed after axum's routing has been logged.
    #[cfg(feature = "axum")]
    after_routing: AtomicBool,
    /// The WARN for a request without a peer address has been logged.
    missing_peer: AtomicBool,
    /// 1 + the generation of the rule set last found not to read the client IP (0: none).
    rules_checked: AtomicU64,
}

/// What, in the edge's configuration, needs the client IP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NeedsIp {
    pub(crate) trusted_clients: bool,
    pub(crate) trusted_proxies: bool,
}

impl Notices {
    /// Logs, the first time only, that the edge runs after routing.
    #[cfg(feature = "axum")]
    pub(crate) fn after_routing(&self) {
        if !self.after_routing.swap(true, Ordering::Relaxed) {
            tracing::error!(target: "gray::edge", "{AFTER_ROUTING}; answering 500 to every request until it is moved");
        }
    }

    /// A request arrived without a peer address: logs a WARN, once, when the
    /// configuration or the rule set of `generation` reads the client IP.
    /// `rules_read_ip` is asked at most once per generation.
    pub(crate) fn missing_peer(
        &self,
        needs: NeedsIp,
        generation: u64,
        rules_read_ip: impl FnOnce() -> bool,
    ) {
        if self.missing_peer.load(Ordering::Relaxed) {
            return;
        }
        let config = needs.trusted_clients || needs.trusted_proxies;
        let checked = generation.wrapping_add(1);
        if !config && self.rules_checked.load(Ordering::Relaxed) == checked {
            return;
        }
        let rules = rules_read_ip();
        if !config && !rules {
            self.rules_checked.store(checked, Ordering::Relaxed);
            return;
        }
        if self.missing_peer.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            target: "gray::edge",
            trusted_clients = needs.trusted_clients,
            trusted_proxies = needs.trusted_proxies,
            ip_rules = rules,
            "a request reached the edge without a peer address, so the client IP is unknown: \
             IP rules, sticky-by-IP rules, trusted clients and trusted proxies cannot match it. \
             With axum, enable gray-tower's `axum` feature and serve with \
             into_make_service_with_connect_info::<SocketAddr>(); with hyper, call \
             Edge::with_peer per connection or insert a PeerAddr extension (logged once)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_climbs_out_of_its_first_segment_escapes() {
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
    fn bodies_are_json_with_reason_and_detail() {
        let e = normalize("/a%2Fb").unwrap_err();
        let body = Refusal::Path(e).body();
        let text = std::str::from_utf8(&body).unwrap();
        assert_eq!(
            text,
            format!(r#"{{"error":"invalid path","reason":"encoded_slash","detail":"{e}"}}"#)
        );
        let mut s = String::new();
        push_json_string(&mut s, "a\"b\\c\nd");
        assert_eq!(s, r#""a\"b\\c\u000ad""#);
        assert_eq!(
            Refusal::AfterRouting.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(Refusal::PrefixEscape.status(), StatusCode::BAD_REQUEST);
    }
}
