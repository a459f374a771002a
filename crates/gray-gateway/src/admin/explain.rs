//! `POST /explain`: where a request would go, and why.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
};

use axum::{
    body::Bytes,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use gray_core::Stain;
use gray_tower::edge::{EdgeDecision, PeerAddr};
use http::{HeaderName, HeaderValue, Request};
use serde::Deserialize;
use tower::{Layer, ServiceExt, service_fn};

use super::Admin;

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ExplainRequest {
    path: Option<String>,
    client_ip: Option<IpAddr>,
    headers: std::collections::BTreeMap<String, String>,
    cookies: std::collections::BTreeMap<String, String>,
}

fn bad_request(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

pub(super) async fn explain(State(admin): State<Admin>, body: Bytes) -> Response {
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
