//! When a controller writes to the store: the state on a transition, else at most every
//! `save_every`; this gateway's report only when it changed, at most every
//! `report_every`, but at its next look when it has news against gray.
//!
//! Every write is a revision etcd keeps until it compacts, so a rollout at a step under
//! steady traffic should write a few times a minute, not once per look and gateway (on
//! three gateways with looks every second: 240 revisions a minute). Nothing is lost by
//! writing less: reports are cumulative and a report's user log is forgotten only once a
//! saved state consumed it, so a leader that restores an older state reads the same
//! evidence again. What costs time is evidence against gray waiting for the next write:
//! so a report whose new counts weigh against gray (below) is published at once.
//!
//! **News against gray**, since the report last published, for the requests' errors and
//! for each stream's bad users: gray has at least 2 new ones, and more than twice its
//! share of the new requests would give it. Under a healthy gray, gray's share of new bad
//! users is about its share of requests, so this fires by chance only on small counts; a
//! failing gray trips it within a look or two, and its report goes out at once. A new
//! epoch is news too: the counts of the epoch before are final.

use std::time::{Duration, Instant};

use gray_rollout::evidence::{Counters, Pair, Report, Stream};

/// The last writes of one controller, and what is due.
#[derive(Debug, Default)]
pub(crate) struct Cadence {
    /// The report published last: what, when, and under which holder
    /// ([`RolloutStore::reports_holder`](super::store::RolloutStore::reports_holder)).
    published: Option<(Report, Instant, u64)>,
    /// When this gateway's look last saved the state.
    saved: Option<Instant>,
}

impl Cadence {
    /// Whether `report` is to be published now: never published, published under another
    /// holder (those reports may be gone), changed with news against gray or a new epoch,
    /// or changed and `every` since the last publication.
    pub(crate) fn publish_due(
        &self,
        report: &Report,
        holder: u64,
        now: Instant,
        every: Duration,
    ) -> bool {
        let Some((last, at, last_holder)) = &self.published else {
            return true;
        };
        if *last_holder != holder {
            return true;
        }
        if last == report {
            return false;
        }
        now.saturating_duration_since(*at) >= every || news(last, report)
    }

    /// `report` was published at `now`, under `holder`.
    pub(crate) fn published(&mut self, report: Report, holder: u64, now: Instant) {
        self.published = Some((report, now, holder));
    }

    /// Whether a state without a transition is to be saved: `every` since the last save
    /// of this gateway's looks (at once after the start, or a lead taken).
    pub(crate) fn save_due(&self, now: Instant, every: Duration) -> bool {
        self.saved
            .is_none_or(|at| now.saturating_duration_since(at) >= every)
    }

    /// The state was saved at `now` (or `None`: the next look's state is due, as after
    /// losing the lead).
    pub(crate) fn saved(&mut self, now: Option<Instant>) {
        self.saved = now;
    }
}

/// Whether `now`'s counts of the current epoch, beyond `last`'s, weigh against gray; a new
/// epoch is news.
fn news(last: &Report, now: &Report) -> bool {
    let (Some(before), Some(after)) = (last.epochs.first(), now.epochs.first()) else {
        return !now.epochs.is_empty();
    };
    if before.epoch != after.epoch {
        return true;
    }
    let delta = after.counters.since(&before.counters);
    against_gray(&delta)
}

/// Whether the new counts `delta` weigh against gray: see the [module docs](self).
fn against_gray(delta: &Counters) -> bool {
    let requests = delta.requests.gray.saturating_add(delta.requests.baseline);
    let share = if requests == 0 {
        0.0
    } else {
        delta.requests.gray as f64 / requests as f64
    };
    let heavy = |p: Pair| {
        let all = p.gray.saturating_add(p.baseline);
        p.gray >= 2 && p.gray as f64 > 2.0 * share * all as f64
    };
    heavy(delta.errors) || Stream::ALL.iter().any(|s| heavy(*delta.bad_users.get(*s)))
}

#[cfg(test)]
mod tests {
    use gray_rollout::evidence::{EpochCounts, PerStream};

    use super::*;

    fn report(epoch: u64, requests: Pair, errors: Pair) -> Report {
        let mut c = Counters::default();
        c.requests = requests;
        c.errors = errors;
        c.bad_users = PerStream::from_fn(|_| Pair::default());
        c.bad_users.errors = errors;
        Report::new(1, vec![EpochCounts::new(epoch, c)])
    }

    #[test]
    fn a_changed_report_waits_for_its_turn_unless_it_is_news() {
        let t0 = Instant::now();
        let every = Duration::from_secs(15);
        let mut c = Cadence::default();
        let first = report(1, Pair::new(10, 90), Pair::default());
        assert!(c.publish_due(&first, 7, t0, every), "never published");
        c.published(first.clone(), 7, t0);
        let s = |n| t0 + Duration::from_secs(n);
        assert!(!c.publish_due(&first, 7, s(60), every), "unchanged");
        assert!(c.publish_due(&first, 8, s(1), every), "another lease");
        // healthy: gray's share of errors like its share of requests
        let healthy = report(1, Pair::new(20, 180), Pair::new(1, 9));
        assert!(!c.publish_due(&healthy, 7, s(1), every));
        assert!(c.publish_due(&healthy, 7, s(15), every), "its turn");
        // gray failing: 3 of 4 new errors where gray has a tenth of the requests
        let failing = report(1, Pair::new(20, 180), Pair::new(3, 1));
        assert!(c.publish_due(&failing, 7, s(1), every));
        // one gray error is not news
        let one = report(1, Pair::new(20, 180), Pair::new(1, 0));
        assert!(!c.publish_due(&one, 7, s(1), every));
        // a new epoch is
        let next = report(2, Pair::new(1, 1), Pair::default());
        assert!(c.publish_due(&next, 7, s(1), every));
    }

    #[test]
    fn a_state_is_due_every_period_and_at_once_after_losing_the_lead() {
        let t0 = Instant::now();
        let every = Duration::from_secs(15);
        let mut c = Cadence::default();
        assert!(c.save_due(t0, every));
        c.saved(Some(t0));
        assert!(!c.save_due(t0 + Duration::from_secs(14), every));
        assert!(c.save_due(t0 + every, every));
        c.saved(None);
        assert!(c.save_due(t0, every));
    }
}
