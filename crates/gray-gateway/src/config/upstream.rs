//! A service's `retry` and `health_check` tables: when a request goes to another instance,
//! and how an instance is ejected and checked before it comes back.

use std::time::Duration;

use gray_balance::{
    health::{Ejection, Probe},
    retry::RetryPolicy,
};
use gray_config::Document;
use gray_core::backoff::Backoff;
use http::Method;
use serde::Deserialize;

use super::ConfigError;

/// `[services.<name>] retry = { … }`; see the crate docs, "Retries and health checks".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryKeys {
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default = "max_retries")]
    max_retries: u32,
    #[serde(default = "budget_percent")]
    budget_percent: u32,
    #[serde(default = "min_per_second")]
    min_per_second: u32,
    #[serde(default = "budget_window_ms")]
    budget_window_ms: u64,
    #[serde(default = "yes")]
    idempotent: bool,
    methods: Option<Vec<String>>,
    #[serde(default = "max_replay_bytes")]
    max_replay_bytes: usize,
}

/// What `health_check.kind` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Connect,
    Http,
    Grpc,
    None,
}

/// `[services.<name>] health_check = { … }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HealthKeys {
    kind: Option<Kind>,
    path: Option<String>,
    grpc_service: Option<String>,
    #[serde(default = "timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "interval_ms")]
    interval_ms: u64,
    #[serde(default = "max_interval_ms")]
    max_interval_ms: u64,
    #[serde(default = "max_fails")]
    max_fails: u32,
}

fn yes() -> bool {
    true
}
fn max_retries() -> u32 {
    2
}
fn budget_percent() -> u32 {
    20
}
fn min_per_second() -> u32 {
    10
}
fn budget_window_ms() -> u64 {
    10_000
}
fn max_replay_bytes() -> usize {
    64 * 1024
}
fn timeout_ms() -> u64 {
    1_000
}
fn interval_ms() -> u64 {
    1_000
}
fn max_interval_ms() -> u64 {
    60_000
}
fn max_fails() -> u32 {
    5
}

/// The retry policy of the service `name`'s table.
pub(super) fn retry(
    doc: &Document<'_>,
    name: &str,
    keys: Option<&RetryKeys>,
) -> Result<RetryPolicy, ConfigError> {
    let Some(keys) = keys else {
        return Ok(RetryPolicy::new());
    };
    let field = |f: &str| format!("services.{name}.retry.{f}");
    if !keys.enabled {
        return Ok(RetryPolicy::disabled());
    }
    if keys.max_retries > 7 {
        return Err(doc.error(&field("max_retries"), "expected at most 7"));
    }
    if keys.budget_window_ms < 1_000 {
        return Err(doc.error(
            &field("budget_window_ms"),
            "expected at least 1000 (one second)",
        ));
    }
    let mut methods = Vec::new();
    if keys.idempotent {
        match &keys.methods {
            None => methods = RetryPolicy::rfc9110_idempotent(),
            Some(names) => {
                for (i, name) in names.iter().enumerate() {
                    let method =
                        Method::from_bytes(name.to_ascii_uppercase().as_bytes()).map_err(|_| {
                            doc.error(
                                &format!("{}[{i}]", field("methods")),
                                format_args!("expected an HTTP method, found {name:?}"),
                            )
                        })?;
                    methods.push(method);
                }
            }
        }
    } else if keys.methods.is_some() {
        return Err(doc.error(
            &field("methods"),
            "`methods` lists the idempotent methods, and `idempotent = false` retries none",
        ));
    }
    Ok(RetryPolicy::new()
        .with_max_retries(keys.max_retries)
        .with_budget_percent(keys.budget_percent)
        .with_min_per_second(keys.min_per_second)
        .with_budget_window(Duration::from_millis(keys.budget_window_ms))
        .with_idempotent(methods)
        .with_max_replay_bytes(keys.max_replay_bytes))
}

/// The probe and the ejection of the service `name`'s table.
pub(super) fn health(
    doc: &Document<'_>,
    name: &str,
    keys: Option<&HealthKeys>,
) -> Result<(Probe, Ejection), ConfigError> {
    let Some(keys) = keys else {
        return Ok((Probe::connect(), Ejection::new()));
    };
    let field = |f: &str| format!("services.{name}.health_check.{f}");
    let kind = match (keys.kind, &keys.path) {
        (Some(kind), _) => kind,
        (None, Some(_)) => Kind::Http,
        (None, None) => Kind::Connect,
    };
    if keys.path.is_some() && kind != Kind::Http {
        return Err(doc.error(&field("path"), "a path is for `kind = \"http\"` only"));
    }
    if keys.grpc_service.is_some() && kind != Kind::Grpc {
        return Err(doc.error(&field("grpc_service"), "for `kind = \"grpc\"` only"));
    }
    let probe = match kind {
        Kind::Connect => Probe::connect(),
        Kind::None => Probe::disabled(),
        Kind::Http => {
            let path = keys.path.as_deref().unwrap_or("/healthz");
            if !path.starts_with('/') || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(doc.error(
                    &field("path"),
                    format_args!("expected a path starting with `/`, found {path:?}"),
                ));
            }
            Probe::http(path)
        }
        Kind::Grpc => Probe::grpc(keys.grpc_service.clone().unwrap_or_default()),
    };
    if keys.timeout_ms == 0 {
        return Err(doc.error(&field("timeout_ms"), "expected at least 1"));
    }
    if keys.interval_ms == 0 {
        return Err(doc.error(&field("interval_ms"), "expected at least 1"));
    }
    if keys.max_interval_ms < keys.interval_ms {
        return Err(doc.error(
            &field("max_interval_ms"),
            format_args!("expected at least `interval_ms` ({})", keys.interval_ms),
        ));
    }
    let backoff = Backoff::new(
        Duration::from_millis(keys.interval_ms),
        Duration::from_millis(keys.max_interval_ms),
    );
    let ejection = Ejection::new()
        .with_consecutive(keys.max_fails)
        .with_backoff(backoff);
    Ok((
        probe.with_timeout(Duration::from_millis(keys.timeout_ms)),
        ejection,
    ))
}
