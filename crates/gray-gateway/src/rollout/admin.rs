//! The rollouts' admin API: `GET /rollouts`, `GET /rollouts/{service}`,
//! `POST /rollouts/{service}` (start) and `POST /rollouts/{service}/{pause|resume|promote|abort}`.
//! Errors are JSON with a reason: 404 for a service without a rollout, 409 for a command
//! its phase does not allow, 400 for an unknown command or a start with a body.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};

use super::{Command, Refused, Rollouts};

/// The rollouts' routes, on `rollouts`.
pub(crate) fn router(rollouts: Rollouts) -> Router {
    Router::new()
        .route("/rollouts", get(list))
        .route("/rollouts/{service}", get(one).post(start))
        .route("/rollouts/{service}/{command}", post(command))
        .with_state(rollouts)
}

fn error(status: StatusCode, reason: String) -> Response {
    (status, Json(serde_json::json!({ "error": reason }))).into_response()
}

async fn list(State(rollouts): State<Rollouts>) -> Response {
    let all: serde_json::Map<String, serde_json::Value> = rollouts
        .0
        .iter()
        .map(|(name, c)| {
            (
                name.clone(),
                serde_json::to_value(c.view()).unwrap_or_default(),
            )
        })
        .collect();
    Json(serde_json::json!({ "rollouts": all })).into_response()
}

fn unknown(service: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no rollout is configured for `{service}` (a `[services.{service}.rollout]` table)"
        ),
    )
}

async fn one(State(rollouts): State<Rollouts>, Path(service): Path<String>) -> Response {
    match rollouts.0.get(&service) {
        Some(c) => Json(c.view()).into_response(),
        None => unknown(&service),
    }
}

async fn start(
    State(rollouts): State<Rollouts>,
    Path(service): Path<String>,
    body: Bytes,
) -> Response {
    if !body.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "a start takes an empty body: the rollout is the configured one".into(),
        );
    }
    run(&rollouts, &service, Command::Start).await
}

async fn command(
    State(rollouts): State<Rollouts>,
    Path((service, command)): Path<(String, String)>,
) -> Response {
    let command = match command.as_str() {
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "promote" => Command::Promote,
        "abort" => Command::Abort,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown command `{other}`: expected pause, resume, promote or abort"),
            );
        }
    };
    run(&rollouts, &service, command).await
}

async fn run(rollouts: &Rollouts, service: &str, command: Command) -> Response {
    let Some(c) = rollouts.0.get(service) else {
        return unknown(service);
    };
    match c.command(command).await {
        Ok(view) => Json(view).into_response(),
        Err(Refused { status, reason }) => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::CONFLICT),
            reason,
        ),
    }
}
