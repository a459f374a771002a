//! Prometheus metrics in the text exposition format, without a metrics dependency.
//!
//! - `gray_gateway_requests_total{service, lane, instance, status}`
//! - `gray_gateway_fallbacks_total{service, lane, subset}`
//! - `gray_gateway_rules_generation` (the generation of the rule set in force; added by
//!   the admin endpoint).

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write,
    sync::{Arc, Mutex},
};

use gray_core::Lane;
use gray_discovery::InstanceId;

/// The labels of `gray_gateway_requests_total`: cheap clones, no string built per request.
type RequestKey = (Arc<str>, Option<Lane>, Option<InstanceId>, u16);

/// The labels of `gray_gateway_fallbacks_total`.
type FallbackKey = (Arc<str>, Option<Lane>, String);

/// The gateway's counters. Updating one takes a short, uncontended lock.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Answers made by the gateway itself, and anything counted without an endpoint.
    requests: Mutex<HashMap<RequestKey, u64>>,
    fallbacks: Mutex<HashMap<FallbackKey, u64>>,
    /// The counters of every endpoint ever routed to (counters outlive their instance).
    endpoints: Mutex<Vec<Arc<EndpointMetrics>>>,
}

/// The answers of one endpoint, by lane and status: a handful of entries, found by a
/// linear scan under the endpoint's own lock, with no key built or hashed per request.
#[derive(Debug)]
pub struct EndpointMetrics {
    service: Arc<str>,
    instance: InstanceId,
    counts: Mutex<Vec<(Option<Lane>, u16, u64)>>,
}

impl EndpointMetrics {
    /// Counts one response with `status` to a request of `lane`.
    pub fn request(&self, lane: Option<&Lane>, status: u16) {
        let mut counts = lock(&self.counts);
        match counts
            .iter_mut()
            .find(|(l, s, _)| *s == status && l.as_ref() == lane)
        {
            Some((_, _, n)) => *n += 1,
            None => counts.push((lane.cloned(), status, 1)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lane_label(lane: Option<&Lane>) -> &str {
    lane.map_or("baseline", Lane::as_str)
}

impl Metrics {
    /// The counters of `instance` of `service`, registered for rendering.
    pub fn endpoint(&self, service: &Arc<str>, instance: &InstanceId) -> Arc<EndpointMetrics> {
        let endpoint = Arc::new(EndpointMetrics {
            service: service.clone(),
            instance: instance.clone(),
            counts: Mutex::default(),
        });
        lock(&self.endpoints).push(endpoint.clone());
        endpoint
    }

    /// Counts one request answered with `status`, served by `instance` (`None`: answered
    /// by the gateway itself).
    pub fn request(
        &self,
        service: &Arc<str>,
        lane: Option<&Lane>,
        instance: Option<&InstanceId>,
        status: u16,
    ) {
        let key = (service.clone(), lane.cloned(), instance.cloned(), status);
        *lock(&self.requests).entry(key).or_insert(0) += 1;
    }

    /// Counts one request served from a fallback subset.
    pub fn fallback(&self, service: &Arc<str>, lane: Option<&Lane>, subset: String) {
        *lock(&self.fallbacks)
            .entry((service.clone(), lane.cloned(), subset))
            .or_insert(0) += 1;
    }

    /// Renders the counters in the Prometheus text format, sorted.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP gray_gateway_requests_total Requests answered, by service, lane, instance and status.\n");
        out.push_str("# TYPE gray_gateway_requests_total counter\n");
        // One line per label set: an instance that was removed and added again has two
        // endpoints, whose counts add up.
        let mut requests: BTreeMap<(String, String, String, u16), u64> = BTreeMap::new();
        for ((service, lane, instance, status), n) in lock(&self.requests).iter() {
            let key = (
                service.to_string(),
                lane_label(lane.as_ref()).to_owned(),
                instance.as_ref().map_or("-", InstanceId::as_str).to_owned(),
                *status,
            );
            *requests.entry(key).or_default() += n;
        }
        for endpoint in lock(&self.endpoints).iter() {
            for (lane, status, n) in lock(&endpoint.counts).iter() {
                let key = (
                    endpoint.service.to_string(),
                    lane_label(lane.as_ref()).to_owned(),
                    endpoint.instance.as_str().to_owned(),
                    *status,
                );
                *requests.entry(key).or_default() += n;
            }
        }
        let lines = requests.into_iter().map(|((service, lane, instance, status), n)| {
            format!(
                "gray_gateway_requests_total{{service=\"{}\",lane=\"{}\",instance=\"{}\",status=\"{status}\"}} {n}",
                escape(&service),
                escape(&lane),
                escape(&instance),
            )
        });
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        out.push_str(
            "# HELP gray_gateway_fallbacks_total Requests served from a fallback subset.\n",
        );
        out.push_str("# TYPE gray_gateway_fallbacks_total counter\n");
        let mut lines: Vec<String> = lock(&self.fallbacks)
            .iter()
            .map(|((service, lane, subset), n)| {
                format!(
                    "gray_gateway_fallbacks_total{{service=\"{}\",lane=\"{}\",subset=\"{}\"}} {n}",
                    escape(service),
                    escape(lane_label(lane.as_ref())),
                    escape(subset),
                )
            })
            .collect();
        lines.sort();
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        out
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters() {
        let m = Metrics::default();
        let svc: Arc<str> = "orders".into();
        let gray = Lane::new("gray").unwrap();
        let id: InstanceId = "o-1".parse().unwrap();
        m.request(&svc, Some(&gray), Some(&id), 200);
        m.request(&svc, Some(&gray), Some(&id), 200);
        m.request(&svc, None, None, 503);
        // Per-endpoint counters, and an instance that came back as a new endpoint.
        let endpoint = m.endpoint(&svc, &id);
        endpoint.request(Some(&gray), 200);
        endpoint.request(None, 200);
        m.endpoint(&svc, &id).request(Some(&gray), 200);
        m.fallback(&svc, Some(&gray), "baseline".into());
        let text = m.render();
        assert!(text.contains(
            "gray_gateway_requests_total{service=\"orders\",lane=\"gray\",instance=\"o-1\",status=\"200\"} 4"
        ), "{text}");
        assert!(text.contains(
            "gray_gateway_requests_total{service=\"orders\",lane=\"baseline\",instance=\"-\",status=\"503\"} 1"
        ), "{text}");
        assert!(text.contains(
            "gray_gateway_requests_total{service=\"orders\",lane=\"baseline\",instance=\"o-1\",status=\"200\"} 1"
        ), "{text}");
        assert_eq!(text.matches("instance=\"o-1\"").count(), 2, "{text}");
        assert!(text.contains(
            "gray_gateway_fallbacks_total{service=\"orders\",lane=\"gray\",subset=\"baseline\"} 1"
        ), "{text}");
    }
}
