//! A service's `[services.<name>.mirror]` table: copies of the requests baseline serves,
//! sent to another lane's instances and compared with the answers users got.

use std::time::Duration;

use gray_config::Document;
use gray_core::Lane;
use http::{HeaderName, Method};
use serde::Deserialize;

use super::{ConfigError, MirrorConfig};

/// `[services.<name>.mirror]`; see the crate docs, *Mirroring*.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MirrorKeys {
    lane: String,
    #[serde(default = "percent")]
    percent: f64,
    methods: Option<Vec<String>>,
    #[serde(default = "max_body_bytes")]
    max_body_bytes: usize,
    #[serde(default = "max_in_flight")]
    max_in_flight: usize,
    #[serde(default = "timeout_ms")]
    timeout_ms: u64,
    #[serde(default = "max_compare_bytes")]
    max_compare_bytes: usize,
    #[serde(default)]
    ignore_headers: Vec<String>,
    #[serde(default)]
    ignore_fields: Vec<String>,
    #[serde(default = "control_percent")]
    control_percent: f64,
    #[serde(default = "alpha")]
    alpha: f64,
    #[serde(default = "noise_min")]
    noise_min: u64,
}

fn control_percent() -> f64 {
    20.0
}
fn alpha() -> f64 {
    0.05
}
fn noise_min() -> u64 {
    gray_rollout::shadow::DEFAULT_NOISE_MIN
}

fn percent() -> f64 {
    100.0
}
fn max_body_bytes() -> usize {
    64 * 1024
}
fn max_in_flight() -> usize {
    256
}
fn timeout_ms() -> u64 {
    5_000
}
fn max_compare_bytes() -> usize {
    1024 * 1024
}

/// The mirror of the service `name`'s table.
pub(super) fn mirror(
    doc: &Document<'_>,
    name: &str,
    keys: Option<&MirrorKeys>,
) -> Result<Option<MirrorConfig>, ConfigError> {
    let Some(keys) = keys else {
        return Ok(None);
    };
    let field = |f: &str| format!("services.{name}.mirror.{f}");
    let lane = Lane::new(&keys.lane).map_err(|e| doc.error(&field("lane"), e))?;
    if lane.as_str() == "baseline" {
        return Err(doc.error(
            &field("lane"),
            "copies go to another lane than baseline: baseline serves the requests copied",
        ));
    }
    if !(0.0..=100.0).contains(&keys.percent) {
        return Err(doc.error(
            &field("percent"),
            format_args!("expected 0 to 100, found {}", keys.percent),
        ));
    }
    let methods = match &keys.methods {
        None => vec![Method::GET, Method::HEAD],
        Some(names) => {
            let mut methods = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes())
                    .ok()
                    .filter(|m| *m != Method::CONNECT)
                    .ok_or_else(|| {
                        doc.error(
                            &format!("{}[{i}]", field("methods")),
                            format_args!(
                                "expected an HTTP method other than CONNECT, found {name:?}"
                            ),
                        )
                    })?;
                methods.push(method);
            }
            methods
        }
    };
    if keys.max_in_flight == 0 {
        return Err(doc.error(&field("max_in_flight"), "expected at least 1"));
    }
    if keys.timeout_ms == 0 {
        return Err(doc.error(&field("timeout_ms"), "expected at least 1"));
    }
    let mut ignore_headers = Vec::with_capacity(keys.ignore_headers.len());
    for (i, header) in keys.ignore_headers.iter().enumerate() {
        ignore_headers.push(HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
            doc.error(
                &format!("{}[{i}]", field("ignore_headers")),
                format_args!("expected a valid HTTP header name, found {header:?}"),
            )
        })?);
    }
    if !(0.0..=100.0).contains(&keys.control_percent) {
        return Err(doc.error(
            &field("control_percent"),
            format_args!("expected 0 to 100, found {}", keys.control_percent),
        ));
    }
    if !(keys.alpha > 0.0 && keys.alpha < 1.0) {
        return Err(doc.error(
            &field("alpha"),
            format_args!(
                "expected a number between 0 and 1 (exclusive), found {}",
                keys.alpha
            ),
        ));
    }
    if keys.noise_min == 0 {
        return Err(doc.error(&field("noise_min"), "expected at least 1"));
    }
    for (i, pointer) in keys.ignore_fields.iter().enumerate() {
        if !pointer.starts_with('/') {
            return Err(doc.error(
                &format!("{}[{i}]", field("ignore_fields")),
                format_args!("expected a JSON pointer starting with `/`, found {pointer:?}"),
            ));
        }
    }
    Ok(Some(MirrorConfig {
        lane,
        percent: keys.percent,
        methods,
        max_body_bytes: keys.max_body_bytes,
        max_in_flight: keys.max_in_flight,
        timeout: Duration::from_millis(keys.timeout_ms),
        max_compare_bytes: keys.max_compare_bytes,
        ignore_headers,
        ignore_fields: keys.ignore_fields.clone(),
        control_percent: keys.control_percent,
        alpha: keys.alpha,
        noise_min: keys.noise_min,
    }))
}
