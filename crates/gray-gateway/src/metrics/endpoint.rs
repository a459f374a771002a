//! The counters of each instance: an [`EndpointMetrics`] counts without a lock through
//! the counters it has used, and the series of an instance that leaves the registry go
//! with it ([`Metrics::remove_endpoint`]).

use std::{
    collections::HashSet,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use arc_swap::ArcSwap;
use gray_core::Lane;
use prometheus_client::metrics::counter::Counter;

use super::{Metrics, RequestLabels, lock};

/// An instance, by service and id.
pub(super) type InstanceKey = (Arc<str>, Arc<str>);

/// The most `(lane, status)` counters an endpoint keeps at hand; more are found through
/// the family (a read lock).
const ENDPOINT_CACHE: usize = 64;

// === impl Metrics ===

impl Metrics {
    /// The counters of `instance` of `service`, registered so that
    /// [`remove_endpoint`](Self::remove_endpoint) removes their series. An instance put again
    /// (relabelled) keeps its series.
    pub fn endpoint(self: &Arc<Self>, service: &str, instance: &str) -> Arc<EndpointMetrics> {
        let key: InstanceKey = (service.into(), instance.into());
        let series = lock(&self.instances)
            .entry(key.clone())
            .or_default()
            .clone();
        Arc::new(EndpointMetrics {
            service: key.0,
            instance: key.1,
            cache: ArcSwap::default(),
            series,
            metrics: self.clone(),
        })
    }

    /// `instance` left `service`: its series are removed, and the counters of its
    /// endpoints count no more.
    pub fn remove_endpoint(&self, service: &str, instance: &str) {
        let key: InstanceKey = (service.into(), instance.into());
        let Some(series) = lock(&self.instances).remove(&key) else {
            return;
        };
        let mut created = lock(&series.created);
        series.removed.store(true, Ordering::Release);
        for labels in created.drain() {
            self.requests.remove(&labels);
        }
    }
}

// === impl EndpointMetrics ===

/// The counters of one instance; see [`Metrics::endpoint`].
pub struct EndpointMetrics {
    service: Arc<str>,
    instance: Arc<str>,
    /// The counters used so far, by lane and status.
    cache: ArcSwap<Vec<(Option<Lane>, u16, Counter)>>,
    series: Arc<InstanceSeries>,
    metrics: Arc<Metrics>,
}

/// The series of one instance, shared by its endpoints (one per version of its labels).
#[derive(Default)]
pub(super) struct InstanceSeries {
    /// The label sets created in the family.
    created: Mutex<HashSet<RequestLabels>>,
    /// The instance left the registry.
    removed: AtomicBool,
}

impl fmt::Debug for EndpointMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointMetrics")
            .field("service", &self.service)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl EndpointMetrics {
    /// Counts one response with `status` to a request of `lane`.
    pub fn request(&self, lane: Option<&Lane>, status: u16) {
        if let Some((_, _, counter)) = self
            .cache
            .load()
            .iter()
            .find(|(l, s, _)| *s == status && l.as_ref() == lane)
        {
            counter.inc();
            return;
        }
        self.miss(lane, status);
    }

    #[cold]
    fn miss(&self, lane: Option<&Lane>, status: u16) {
        let labels = RequestLabels {
            service: self.service.clone(),
            lane: self.metrics.lanes.label(lane),
            instance: self.instance.clone(),
            status,
        };
        let counter = {
            let mut created = lock(&self.series.created);
            // Gone from the registry: its series are not brought back.
            if self.series.removed.load(Ordering::Acquire) {
                return;
            }
            created.insert(labels.clone());
            self.metrics.requests.get_or_create_owned(&labels)
        };
        counter.inc();
        if self.cache.load().len() < ENDPOINT_CACHE {
            self.cache.rcu(|cache| {
                let mut cache = Vec::clone(cache);
                cache.push((lane.cloned(), status, counter.clone()));
                cache
            });
        }
    }
}
