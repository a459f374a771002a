//! The `lane` label's values, bounded: the first `metrics_max_lanes` lanes seen get their
//! own, every later one is counted as `other`.

use std::sync::{Arc, Mutex};

use gray_core::Lane;

use super::lock;

// === impl LaneLabels ===

/// The lane label values: the first `max` lanes seen each get their own, later ones
/// `other`.
pub(super) struct LaneLabels {
    pub(super) max: usize,
    baseline: Arc<str>,
    other: Arc<str>,
    known: Mutex<Vec<(Lane, Arc<str>)>>,
}

impl LaneLabels {
    pub(super) fn new(max: usize) -> Self {
        LaneLabels {
            max,
            baseline: Arc::from("baseline"),
            other: Arc::from("other"),
            known: Mutex::default(),
        }
    }

    pub(super) fn label(&self, lane: Option<&Lane>) -> Arc<str> {
        let Some(lane) = lane else {
            return self.baseline.clone();
        };
        let mut known = lock(&self.known);
        if let Some((_, label)) = known.iter().find(|(l, _)| l == lane) {
            return label.clone();
        }
        if known.len() >= self.max {
            return self.other.clone();
        }
        let label: Arc<str> = Arc::from(lane.as_str());
        known.push((lane.clone(), label.clone()));
        label
    }
}
