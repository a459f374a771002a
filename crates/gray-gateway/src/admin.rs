//! The admin endpoint: `/explain`, `/metrics`, `/healthz`.
//!
//! `POST /explain` with a JSON body describes a request as the gateway would see it:
//!
//! ```json
//! {"path": "/orders/items", "client_ip": "10.1.2.3",
//!  "headers": {"x-gray-lane": "gray", "x-forwarded-for": "203.0.113.9"},
//!  "cookies": {"uid": "42"}}
//! ```
//!
//! and answers which rule fires (and the generation of the rule set that decided), which
//! lane and pins result, and, for each service, the decision its live balancer would make
//! now: the subsets walked and the candidate instances with their availability (`ready`,
//! `unready`, `ejected` after connection errors), exactly what a request would meet. It
//! also shows how fresh discovery is (`discovery`: the source, whether it is reachable, the
//! seconds since the last contact, the etcd revision and cluster ID, the last error) and
//! the state of the rules (`rules`: generation, rejected versions, last error).
//!
//! `GET /metrics` is in the [`metrics`](crate::metrics) module's format. `/rollouts` is
//! the rollouts' API (see the [crate docs](crate#rollouts)). `GET /mirrors` shows each
//! service's mirror: its lane, its copies in flight, and its latest mismatches (method,
//! path, both statuses, both latencies and where the answers differ).
use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use gray_core::Stain;
use gray_discovery::Registry;
use gray_tower::edge::{EdgeDecision, EdgeLayer, LiveRules, PeerAddr};
use http::{HeaderName, HeaderValue, Request};
use serde::Deserialize;
use tower::{Layer, ServiceExt, service_fn};

use crate::{metrics::Metrics, proxy::Routes};

/// What the admin endpoint needs.
#[derive(Debug, Clone)]
pub(crate) struct Admin {
    /// The routing table (for the instance lists and policies).
    pub(crate) routes: Arc<Routes>,
    /// The staining rules in force.
    pub(crate) rules: LiveRules,
    /// The edge layer the proxy runs, to explain its decisions.
    pub(crate) edge: EdgeLayer,
    /// The counters.
    pub(crate) metrics: Arc<Metrics>,
    /// Discovery, for its freshness.
    pub(crate) registry: Registry,
    /// The rollouts (`/rollouts`).
    pub(crate) rollouts: crate::rollout::Rollouts,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ExplainRequest {
    path: Option<String>,
    client_ip: Option<IpAddr>,
    headers: std::collections::BTreeMap<String, String>,
    cookies: std::collections::BTreeMap<String, String>,
}

/// `GET /mirrors`: each service's mirror, with its latest mismatches.
async fn mirrors(State(admin): State<Admin>) -> axum::Json<serde_json::Value> {
    let mirrors: serde_json::Map<String, serde_json::Value> = admin
        .routes
        .services
        .iter()
        .filter_map(|(name, upstream)| {
            let mirror = upstream.mirror.as_ref()?;
            Some((
                name.to_string(),
                serde_json::json!({
                    "lane": mirror.lane().as_str(),
                    "in_flight": mirror.in_flight(),
                    "recent_mismatches": mirror.recent(),
                    "judge": mirror.judgement(),
                }),
            ))
        })
        .collect();
    axum::Json(serde_json::Value::Object(mirrors))
}

/// The admin router.
pub(crate) fn router(admin: Admin) -> Router {
    let rollouts = crate::rollout::router(admin.rollouts.clone());
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/explain", post(explain))
        .route("/mirrors", get(mirrors))
        .with_state(admin)
        .merge(rollouts)
}

async fn metrics(State(admin): State<Admin>) -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        admin.metrics.render(),
    )
        .into_response()
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

async fn explain(State(admin): State<Admin>, body: Bytes) -> Response {
    let ask: ExplainRequest = if body.is_empty() {
        ExplainRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(ask) => ask,
            Err(e) => return bad_request(format!("invalid explain request: {e}")),
        }
    };
    let mut req = Request::new(());
    let path = ask.path.as_deref().unwrap_or("/");
    match path.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return bad_request(format!("invalid path `{path}`: {e}")),
    }
    for (name, value) in &ask.headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            return bad_request(format!("invalid header `{name}: {value}`"));
        };
        req.headers_mut().append(name, value);
    }
    if !ask.cookies.is_empty() {
        let cookie = ask
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        match HeaderValue::from_str(&cookie) {
            Ok(v) => {
                req.headers_mut().append(http::header::COOKIE, v);
            }
            Err(_) => return bad_request("invalid cookies".into()),
        }
    }
    let peer = ask.client_ip.unwrap_or(IpAddr::from([127, 0, 0, 1]));
    req.extensions_mut()
        .insert(PeerAddr(SocketAddr::new(peer, 0)));

    // The same edge layer the proxy runs, around a service that reports what it decided.
    let probe = admin.edge.layer(service_fn(|req: Request<()>| async move {
        Ok::<_, Infallible>(http::Response::new((
            req.extensions().get::<Stain>().cloned().unwrap_or_default(),
            req.extensions().get::<EdgeDecision>().cloned(),
        )))
    }));
    let Ok(answer) = probe.oneshot(req).await;
    let (parts, body) = answer.into_parts();
    // The edge refused the request itself (a rejected path): it would not be routed.
    if let Some(refusal) = body.answer() {
        let refusal: serde_json::Value =
            serde_json::from_slice(refusal).unwrap_or(serde_json::Value::Null);
        return axum::Json(serde_json::json!({
            "edge": {"refused": parts.status.as_u16(), "answer": refusal},
            "lane": null,
            "services": {},
        }))
        .into_response();
    }
    let Some((stain, decision)) = body.into_inner() else {
        return bad_request("the edge answered without passing the request on".into());
    };

    let services: serde_json::Map<String, serde_json::Value> = admin
        .routes
        .services
        .iter()
        .map(|(name, upstream)| {
            let decision = upstream.balance().explain(Some(&stain));
            (
                name.to_string(),
                serde_json::to_value(&decision).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    let rule = decision.as_ref().map(|d| {
        serde_json::json!({
            "decided_by": d.decided_by.as_str(),
            "rule_index": d.rule_index,
            "rule_name": d.rule_name.as_deref(),
            "generation": d.generation,
            "client_ip": d.client_ip,
            "trusted_client": d.trusted,
        })
    });
    let discovery = admin.registry.status();
    let rules = admin.rules.status();
    axum::Json(serde_json::json!({
        "edge": rule,
        "lane": stain.lane().map(|l| l.as_str()),
        "pins": stain.pins().map(|p| p.route_header_value().to_str().unwrap_or_default().to_owned()),
        "services": services,
        "discovery": {
            "source": admin.registry.source(),
            "connected": discovery.connected,
            "seconds_since_contact": discovery.since_last_contact().map(|d| d.as_secs_f64()),
            "revision": discovery.revision,
            "cluster_id": discovery.cluster_id,
            "last_error": discovery.last_error,
        },
        "rules": {
            "generation": rules.generation,
            "rejected": rules.rejected,
            "last_error": rules.last_error,
        },
    }))
    .into_response()
}
