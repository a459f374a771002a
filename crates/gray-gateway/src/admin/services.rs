//! `GET /services`: each routed service with its instances (their lane and versions by
//! the service's policy, and whether each is ready, unready or ejected), its mirror's lane
//! and whether a rollout is configured on it.

use axum::{Json, extract::State};
use serde_json::{Value, json};

use super::Admin;

/// `GET /services`.
pub(super) async fn services(State(admin): State<Admin>) -> Json<Value> {
    let services: serde_json::Map<String, Value> = admin
        .routes
        .services
        .iter()
        .map(|(name, upstream)| {
            let instances: Vec<Value> = upstream
                .balance()
                .endpoints()
                .into_iter()
                .map(|(id, labels, availability)| {
                    let class = upstream.policy.classify(&labels);
                    json!({
                        "id": id.as_str(),
                        "lane": class.lane().map(|l| l.as_str()),
                        "versions": class.versions().iter().map(|v| v.as_str()).collect::<Vec<_>>(),
                        "availability": availability,
                    })
                })
                .collect();
            (
                name.to_string(),
                json!({
                    "instances": instances,
                    "mirror": upstream.mirror.as_ref().map(|m| m.lane().as_str()),
                    "rollout": admin.rollouts.0.contains_key(name.as_ref()),
                }),
            )
        })
        .collect();
    Json(json!({ "services": services }))
}
