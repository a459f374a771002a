//! The admin address: the page, the API behind it, `/explain`, `/metrics`, `/healthz`.
//!
//! - `GET /` is the admin page ([`page`]): services, lanes, rollouts and their evidence,
//!   drawn from the API below, updated every second or two.
//! - `GET /services` lists each service's instances by lane with their availability
//!   ([`services`]); `GET /services/history` and `GET /rollouts/{service}/history` give
//!   the last ten minutes at one point a second ([`history`]).
//! - `POST /explain` describes where a request would go, and why ([`explain`]).
//! - `GET /metrics` is in the [`metrics`](crate::metrics) module's format. `/rollouts`
//!   is the rollouts' API (see the [crate docs](crate#rollouts)). `GET /mirrors` shows
//!   each service's mirror: its lane, its copies in flight, and its latest mismatches
//!   (method, path, both statuses, both latencies and where the answers differ).
//!
//! With an `admin_token`, the commands need it, and with `admin_token_for_reads` so does
//! everything but the page's files and `/healthz` ([`auth`]).

mod auth;
mod explain;
mod history;
mod page;
mod services;

use std::sync::Arc;

use axum::{
    Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use gray_discovery::Registry;
use gray_tower::edge::{EdgeLayer, LiveRules};

pub(crate) use self::history::History;
use crate::{config::AdminAccess, metrics::Metrics, proxy::Routes};

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
    /// The last minutes, for the page.
    pub(crate) history: Arc<History>,
    /// Who may use the address.
    pub(crate) access: AdminAccess,
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

/// The admin router: every route behind the access guard, every answer with the page's
/// security headers.
pub(crate) fn router(admin: Admin) -> Router {
    let rollouts = crate::rollout::router(admin.rollouts.clone());
    let access = admin.access.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/explain", post(explain::explain))
        .route("/mirrors", get(mirrors))
        .route("/services", get(services::services))
        .route("/services/history", get(services_history))
        .route("/rollouts/{service}/history", get(rollout_history))
        .with_state(admin)
        .merge(rollouts)
        .merge(page::router())
        .layer(axum::middleware::from_fn_with_state(access, auth::guard))
        .layer(axum::middleware::from_fn(page::secure))
}

/// Takes the history's points until `stopped`.
pub(crate) async fn sample(admin: Admin, stopped: tokio::sync::watch::Receiver<bool>) {
    history::run(admin.history.clone(), admin, stopped).await;
}

async fn services_history(State(admin): State<Admin>) -> Response {
    axum::Json(admin.history.services()).into_response()
}

async fn rollout_history(State(admin): State<Admin>, Path(service): Path<String>) -> Response {
    if !admin.rollouts.0.contains_key(&service) {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": format!("no rollout is configured for `{service}` (a `[services.{service}.rollout]` table)")
            })),
        )
            .into_response();
    }
    let history = admin.history.rollout(&service).unwrap_or_else(|| {
        serde_json::json!({"service": service, "t": [], "phase": [], "weight": [], "log_m": {}, "alarm_at": {}})
    });
    axum::Json(history).into_response()
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
