//! The evidence: each source's [`Report`] consumed into the tests
//! ([`observe_all`](Rollout::observe_all)), the shadow phase's judged counts, and the
//! kill switch's counts; a test's alarm or the kill switch rolls the rollout back.

use std::time::Duration;

use super::{Phase, Reason, Rollout, ShadowEvidence, Transition, whole_ms};
use crate::evidence::{Counters, PerStream, Report, Stream, Thresholds, UserLog};
use crate::histogram::Snapshot;
use crate::kill::KillCounts;

// === impl Rollout ===

impl Rollout {
    /// Consumes a source's report: only what it counts beyond its previous report (per
    /// epoch) is new. Counts of an epoch other than the current one and the one before
    /// are ignored. Distinct users come from the report's user log when it has one (the
    /// union over every source, [`users`](super::users)), else from its counters. Returns
    /// the rollback, if a stream's test alarmed or the kill switch tripped. With several
    /// sources, [`observe_all`](Rollout::observe_all) is exact where this is not quite.
    pub fn observe(&mut self, now: Duration, report: &Report) -> Option<Transition> {
        self.observe_all(now, std::slice::from_ref(report))
    }

    /// Consumes the reports of every source at once, as [`observe`](Rollout::observe)
    /// does one: the user logs' entries of the epoch before are taken from every report
    /// before those of the current epoch, so that a user who moved from baseline to gray
    /// with the weight counts in the arm of its first bad event, whichever gateway saw
    /// it.
    pub fn observe_all(&mut self, now: Duration, reports: &[Report]) -> Option<Transition> {
        let now = whole_ms(now);
        if reports.is_empty() {
            return None;
        }
        if self.state.phase == Phase::Shadow {
            return self.observe_shadow(now, reports);
        }
        self.state.last_evidence = Some(self.state.last_evidence.map_or(now, |t| t.max(now)));
        for report in reports {
            self.consume_counts(now, report);
        }
        let logs: Vec<(u64, &UserLog)> = reports
            .iter()
            .filter_map(|r| r.users.as_ref().map(|log| (r.source, log)))
            .collect();
        if !logs.is_empty() {
            let previous = self.state.previous_epoch;
            let added =
                self.state
                    .users
                    .consume(&logs, self.state.epoch.index, previous.map(|p| p.index));
            if let Some(prev) = previous {
                self.apply(now, prev.weight / 100.0, &added.previous);
            }
            self.apply(now, self.state.epoch.weight / 100.0, &added.current);
        }
        let consumed = self.state.consumed.current.values();
        let mut epoch = consumed.fold(Counters::default(), |a, c| a.add(c));
        if self.state.users.is_logged() {
            let counted = self.state.users.counted();
            epoch.gray_users = counted.gray_users;
            epoch.bad_users = counted.bad_users;
        }
        self.state.evidence.epoch = epoch;
        if self.state.epoch.thresholds.is_none() {
            self.state.epoch.thresholds = Thresholds::from_latencies(
                &self.baseline_latencies(),
                self.config.min_latency_samples,
            );
        }
        self.state.evidence.step_power = self.step_power();
        self.kill.observe(now, self.kill_counts());
        if !self.state.phase.is_active() {
            return None;
        }
        for s in Stream::ALL {
            let test = self.state.evidence.streams.get(s);
            if test.alarm() {
                let sum = test.summary();
                let reason = Reason::Alarm {
                    stream: s,
                    log_m: sum.log_m,
                    alarm_at: sum.alarm_at,
                    gray: sum.gray,
                    baseline: sum.baseline,
                    leading_ratio: sum.leading_ratio,
                };
                return Some(self.roll_back(now, reason));
            }
        }
        let trip = self.kill.check(now)?;
        Some(self.roll_back(now, Reason::KillSwitch(trip)))
    }

    /// The shadow phase's evidence: each source's judged counts beyond what was consumed
    /// of it, fed to the judge's tests as one batch each; an alarm rolls the rollout back.
    fn observe_shadow(&mut self, now: Duration, reports: &[Report]) -> Option<Transition> {
        self.state.last_evidence = Some(self.state.last_evidence.map_or(now, |t| t.max(now)));
        let fresh = &self.shadow;
        let shadow = self
            .state
            .shadow
            .get_or_insert_with(|| ShadowEvidence::new(fresh.0.clone(), fresh.1.clone(), now));
        for report in reports {
            let Some(counts) = &report.shadow else {
                continue;
            };
            let before = shadow
                .consumed
                .get(&report.source)
                .copied()
                .unwrap_or_default();
            let delta = counts.since(&before);
            shadow.consumed.insert(report.source, before.max(counts));
            shadow.counts = shadow.counts.add(&delta);
            delta.feed(now, &mut shadow.mismatch, &mut shadow.slow);
        }
        let (stream, test) = if shadow.mismatch.alarm() {
            ("mismatch", &shadow.mismatch)
        } else if shadow.slow.alarm() {
            ("slow", &shadow.slow)
        } else {
            return None;
        };
        let reason = Reason::ShadowAlarm {
            stream: stream.to_owned(),
            log_m: test.log_m(),
            alarm_at: test.log_threshold(),
            counts: shadow.counts,
        };
        Some(self.roll_back(now, reason))
    }

    /// The counters `report` has beyond what was consumed of its source, per epoch; with a
    /// user log, its user counts are left to the union.
    fn consume_counts(&mut self, now: Duration, report: &Report) {
        let logged = report.users.is_some();
        for counts in &report.epochs {
            let current = counts.epoch == self.state.epoch.index;
            let consumed = &mut self.state.consumed;
            let (weight, ledger) = match self.state.previous_epoch {
                _ if current => (self.state.epoch.weight, &mut consumed.current),
                Some(prev) if prev.index == counts.epoch => (prev.weight, &mut consumed.previous),
                _ => continue,
            };
            let before = ledger.get(&report.source).copied().unwrap_or_default();
            let mut delta = counts.counters.since(&before);
            ledger.insert(report.source, before.max(&counts.counters));
            if current {
                self.latencies
                    .insert(report.source, counts.baseline_latency.clone());
            }
            if logged {
                // the union counts this source's users
                delta.gray_users = 0;
                delta.bad_users = PerStream::default();
            }
            self.apply(now, weight / 100.0, &delta);
        }
    }

    fn apply(&mut self, now: Duration, w: f64, delta: &Counters) {
        let ev = &mut self.state.evidence;
        ev.requests = ev.requests + delta.requests;
        ev.errors = ev.errors + delta.errors;
        if delta.requests.gray > 0 {
            self.state.last_gray_request = Some(now);
        }
        for s in Stream::ALL {
            let bad = delta.bad_users.get(s);
            ev.streams.get_mut(s).update(now, w, bad.gray, bad.baseline);
        }
    }

    pub(super) fn kill_counts(&self) -> KillCounts {
        let ev = &self.state.evidence;
        KillCounts::new(ev.requests, ev.errors, ev.streams.errors.counts().0)
    }

    pub(super) fn baseline_latencies(&self) -> Snapshot {
        let mut sum = Snapshot::empty();
        for l in self.latencies.values() {
            sum.merge(l);
        }
        sum
    }
}
