use std::time::Duration;

use super::*;
use crate::evidence::{
    Arm, EpochCounts, Observation, Outcome, Pair, PerStream, Recorder, Report, Stream,
};
use crate::kill::KillSwitch;

const S: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

fn config() -> RolloutConfig {
    RolloutConfig::new("canary")
        .with_steps([1.0, 5.0, 100.0])
        .with_hold(S(10))
        .with_min_users(5)
        // the power a step needs has tests of its own (below): these count few users
        .with_detect(Detect::new().with_power(0.0))
}

/// Cumulative counts of `epoch`: `users` gray users, `requests` per arm, and bad users
/// per arm in the errors stream.
fn counts(epoch: u64, users: u64, requests: Pair, bad_errors: Pair) -> EpochCounts {
    let mut c = Counters {
        requests,
        errors: bad_errors,
        gray_users: users,
        ..Counters::default()
    };
    c.bad_users.errors = bad_errors;
    EpochCounts::new(epoch, c)
}

fn report(source: u64, epochs: Vec<EpochCounts>) -> Report {
    Report::new(source, epochs)
}

/// A healthy report of the current epoch with `n` gray users.
fn healthy(r: &Rollout, source: u64, n: u64) -> Report {
    let epoch = r.state().epoch.index;
    report(
        source,
        vec![counts(epoch, n, Pair::new(n, 20 * n), Pair::default())],
    )
}

#[test]
fn steps_advance_when_both_the_hold_and_the_users_are_met() {
    let mut r = Rollout::new(config()).unwrap();
    assert_eq!((r.state().phase, r.state().weight), (Phase::Pending, 0.0));
    let t = r.start(S(100)).unwrap();
    assert_eq!(
        (t.from, t.to, t.weight, t.reason.clone()),
        (Phase::Pending, Phase::Step, 1.0, Reason::Start)
    );
    assert_eq!((t.epoch, t.step), (1, Some(0)));

    // users met, time not
    assert!(r.observe(S(105), &healthy(&r, 1, 10)).is_none());
    assert!(r.tick(S(105)).is_none());
    // time met, but only 4 distinct gray users in a fresh step
    let t = r.tick(S(110)).unwrap();
    assert_eq!((t.to, t.weight, t.epoch), (Phase::Step, 5.0, 2));
    assert_eq!(
        t.reason,
        Reason::Advance {
            held_ms: 10_000,
            users: 10,
            power: None
        }
    );
    r.observe(S(111), &healthy(&r, 1, 4));
    assert!(r.tick(S(121)).is_none(), "4 users < min_users 5");
    r.observe(S(122), &healthy(&r, 1, 5));
    let t = r.tick(S(122)).unwrap();
    assert_eq!(
        (t.to, t.weight, t.reason.clone()),
        (Phase::Promoted, 100.0, Reason::Complete)
    );
    assert_eq!(r.state().transitions, 3);
    // promoted is the end: time changes nothing
    assert!(r.tick(S(10_000)).is_none());
}

#[test]
fn a_gated_step_waits_for_a_resume() {
    let mut r = Rollout::new(config().with_gates([5.0])).unwrap();
    r.start(S(0)).unwrap();
    r.observe(S(10), &healthy(&r, 1, 10));
    let t = r.tick(S(10)).unwrap();
    assert_eq!((t.to, t.weight), (Phase::Paused, 1.0));
    assert_eq!(t.reason, Reason::Gate { next_weight: 5.0 });
    assert_eq!(r.state().pause, Some(PauseReason::Gate { step: 1 }));
    r.observe(S(100), &healthy(&r, 1, 20));
    assert!(r.tick(S(100)).is_none(), "a gate never lifts by itself");
    let err = r.pause(S(100)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot pause the rollout: it is paused (at the gate of step 1)"
    );
    let t = r.resume(S(101)).unwrap();
    assert_eq!(
        (t.to, t.weight, t.step, t.reason),
        (Phase::Step, 5.0, Some(1), Reason::Resume)
    );
}

#[test]
fn stale_evidence_pauses_and_fresh_evidence_resumes() {
    let mut r = Rollout::new(config().with_stale_after(S(30))).unwrap();
    r.start(S(0)).unwrap();
    r.observe(S(5), &healthy(&r, 1, 2));
    assert!(r.tick(S(35)).is_none(), "30 s is not more than 30 s");
    let t = r.tick(S(36)).unwrap();
    assert_eq!((t.to, t.weight), (Phase::Paused, 1.0));
    assert_eq!(
        t.reason,
        Reason::Stale {
            last_evidence_ms: Some(5_000)
        }
    );
    assert!(r.tick(S(60)).is_none());
    // evidence comes back, with gray traffic
    r.observe(S(61), &healthy(&r, 1, 3));
    let t = r.tick(S(61)).unwrap();
    assert_eq!((t.to, t.reason), (Phase::Step, Reason::Fresh));
    // the hold kept counting from the step's start
    r.observe(S(62), &healthy(&r, 1, 10));
    assert_eq!(r.tick(S(62)).unwrap().weight, 5.0);
}

#[test]
fn no_gray_traffic_pauses_until_gray_serves_again() {
    let mut r = Rollout::new(config().with_stale_after(S(30))).unwrap();
    r.start(S(0)).unwrap();
    let epoch = r.state().epoch.index;
    // reports keep coming, but gray serves nothing
    let quiet = report(
        1,
        vec![counts(epoch, 0, Pair::new(0, 500), Pair::default())],
    );
    for t in [10, 20, 31] {
        r.observe(S(t), &quiet);
    }
    let t = r.tick(S(31)).unwrap();
    assert_eq!(
        t.reason,
        Reason::NoData {
            last_gray_request_ms: None
        }
    );
    r.observe(S(40), &quiet);
    assert!(r.tick(S(40)).is_none());
    r.observe(S(41), &healthy(&r, 1, 1));
    assert_eq!(r.tick(S(41)).unwrap().reason, Reason::Fresh);
}

#[test]
fn an_alarm_rolls_back_at_once_with_its_evidence() {
    let mut r = Rollout::new(config().with_steps([5.0, 100.0])).unwrap();
    r.start(S(0)).unwrap();
    // 5 % of users in gray, and as many bad users there as in baseline
    let bad = report(
        1,
        vec![counts(1, 40, Pair::new(40, 760), Pair::new(10, 10))],
    );
    let t = r.observe(S(3), &bad).expect("rolled back");
    assert_eq!(
        (t.from, t.to, t.from_weight, t.weight),
        (Phase::Step, Phase::RolledBack, 5.0, 0.0)
    );
    let Reason::Alarm {
        stream,
        log_m,
        alarm_at,
        gray,
        baseline,
        leading_ratio,
    } = t.reason
    else {
        panic!("{:?}", t.reason)
    };
    assert_eq!((stream, gray, baseline), (Stream::Errors, 10, 10));
    assert!(log_m >= alarm_at && (alarm_at - (300.0f64).ln()).abs() < 1e-9);
    assert!(
        leading_ratio.is_some_and(|r| r >= 10.0),
        "{leading_ratio:?}"
    );
    assert!(t.evidence.streams.errors.alarm);
    assert_eq!(r.state().weight, 0.0);
    assert_eq!(r.state().epoch.weight, 0.0);
    // a rolled-back rollout stays there until started again
    assert!(r.observe(S(4), &bad).is_none());
    assert!(r.tick(S(100)).is_none());
    assert_eq!(r.state().last_transition.as_ref(), Some(&t));
}

#[test]
fn the_kill_switch_rolls_back_a_catastrophe_the_test_has_not_judged_yet() {
    let kill = |switch: KillSwitch| {
        let mut r =
            Rollout::new(config().with_steps([5.0, 100.0]).with_kill_switch(switch)).unwrap();
        r.start(S(0)).unwrap();
        // 90 % of gray's requests fail, from 3 users; baseline has 60 users failing
        // (3 %), so the user-level test sees nothing unusual
        let mut c = counts(1, 40, Pair::new(100, 1900), Pair::new(90, 60));
        c.counters.bad_users.errors = Pair::new(3, 60);
        r.observe(S(2), &report(1, vec![c]))
    };
    let t = kill(KillSwitch::new()).expect("tripped");
    assert_eq!(t.to, Phase::RolledBack);
    let json = serde_json::to_string(&t).unwrap();
    assert!(json.contains(r#""kind":"kill_switch""#), "{json}");
    assert_eq!(serde_json::from_str::<Transition>(&json).unwrap(), t);
    let Reason::KillSwitch(k) = t.reason else {
        panic!("{:?}", t.reason)
    };
    assert_eq!(
        (k.gray_requests, k.gray_errors, k.gray_error_users),
        (100, 90, 3)
    );
    assert!(!t.evidence.streams.errors.alarm);
    assert!(kill(KillSwitch::new().with_enabled(false)).is_none());
    assert!(kill(KillSwitch::new().with_min_users(4)).is_none());
}

#[test]
fn manual_commands_and_their_refusals() {
    let mut r = Rollout::new(config()).unwrap();
    for (err, text) in [
        (
            r.pause(S(0)).unwrap_err(),
            "cannot pause the rollout: it is pending",
        ),
        (
            r.resume(S(0)).unwrap_err(),
            "cannot resume the rollout: it is pending",
        ),
        (
            r.promote(S(0)).unwrap_err(),
            "cannot promote the rollout: it is pending",
        ),
        (
            r.abort(S(0)).unwrap_err(),
            "cannot abort the rollout: it is pending",
        ),
    ] {
        assert_eq!(err.to_string(), text);
    }
    r.start(S(0)).unwrap();
    assert_eq!(
        r.start(S(0)).unwrap_err().to_string(),
        "cannot start the rollout: it is step"
    );
    let t = r.pause(S(1)).unwrap();
    assert_eq!((t.to, t.reason.clone()), (Phase::Paused, Reason::Pause));
    // the test keeps running while paused, and time does not advance a paused rollout
    r.observe(S(20), &healthy(&r, 1, 50));
    assert!(r.tick(S(20)).is_none());
    assert_eq!(r.resume(S(21)).unwrap().to, Phase::Step);
    let t = r.promote(S(22)).unwrap();
    assert_eq!(
        (t.to, t.weight, t.reason.clone()),
        (Phase::Promoted, 100.0, Reason::Promote)
    );
    let t = r.abort(S(23)).unwrap();
    assert_eq!(
        (t.from, t.to, t.weight),
        (Phase::Promoted, Phase::RolledBack, 0.0)
    );
    assert_eq!(r.abort(S(24)).unwrap_err().phase(), Phase::RolledBack);
    // a new start begins with fresh evidence, in a new run whose users count afresh
    let run = r.state().run;
    let t = r.start(S(30)).unwrap();
    assert_eq!(
        (t.to, t.weight, t.evidence.requests),
        (Phase::Step, 1.0, Pair::default())
    );
    assert_eq!(t.evidence.streams.errors.log_m, 0.0);
    assert!(r.state().run > run);
    assert_eq!(r.epoch_spec().run, r.state().epoch.index);
}

#[test]
fn an_automatic_pause_becomes_manual_when_paused_by_hand() {
    let mut r = Rollout::new(config()).unwrap();
    r.start(S(0)).unwrap();
    assert_eq!(r.tick(S(31)).unwrap().reason.as_str(), "stale");
    r.pause(S(32)).unwrap();
    r.observe(S(33), &healthy(&r, 1, 10));
    assert!(
        r.tick(S(33)).is_none(),
        "fresh evidence does not lift a manual pause"
    );
    assert_eq!(r.state().pause, Some(PauseReason::Manual));
}

#[test]
fn several_sources_sum_and_a_repeated_report_counts_once() {
    let bad = |gray, baseline| Pair::new(gray, baseline);
    let mut one = Rollout::new(config()).unwrap();
    let mut two = Rollout::new(config()).unwrap();
    one.start(S(0)).unwrap();
    two.start(S(0)).unwrap();
    // one process saw everything; two processes saw a part each, reported twice
    one.observe(
        S(1),
        &report(9, vec![counts(1, 30, Pair::new(30, 3000), bad(2, 150))]),
    );
    let a = report(1, vec![counts(1, 10, Pair::new(10, 1000), bad(1, 100))]);
    let b = report(2, vec![counts(1, 20, Pair::new(20, 2000), bad(1, 50))]);
    for rep in [&a, &b, &a, &b] {
        two.observe(S(1), rep);
    }
    let (e1, e2) = (&one.state().evidence, &two.state().evidence);
    assert_eq!(
        (e1.requests, e1.errors, e1.epoch),
        (e2.requests, e2.errors, e2.epoch)
    );
    for s in Stream::ALL {
        let (t1, t2) = (e1.streams.get(s), e2.streams.get(s));
        assert_eq!(t1.counts(), t2.counts());
        // the same sums, added in another order
        assert!((t1.log_m() - t2.log_m()).abs() < 1e-9, "{s}");
    }
    // a restarted process is a new source: its counts start again from 0
    let restarted = report(3, vec![counts(1, 1, Pair::new(1, 100), bad(0, 5))]);
    two.observe(S(2), &restarted);
    assert_eq!(two.state().evidence.epoch.bad_users.errors, bad(2, 155));
    // a source whose counts went down (not a cumulative counter) adds nothing
    two.observe(
        S(3),
        &report(2, vec![counts(1, 0, Pair::default(), bad(0, 0))]),
    );
    assert_eq!(two.state().evidence.epoch.bad_users.errors, bad(2, 155));
}

#[test]
fn late_counts_of_the_epoch_before_use_its_share() {
    let mut r = Rollout::new(config().with_min_users(0)).unwrap();
    r.start(S(0)).unwrap();
    r.observe(
        S(1),
        &report(1, vec![counts(1, 5, Pair::new(5, 500), Pair::new(0, 20))]),
    );
    r.tick(S(10)).unwrap(); // epoch 2 at 5 %
    let mut at_one_percent = r.state().evidence.streams.errors.clone();
    // the epoch-1 counts grow after the switch: 1 gray and 10 baseline bad users more
    let late = report(
        1,
        vec![
            counts(2, 0, Pair::new(0, 0), Pair::default()),
            counts(1, 5, Pair::new(6, 600), Pair::new(1, 30)),
        ],
    );
    r.observe(S(11), &late);
    at_one_percent.update(S(11), 0.01, 1, 10);
    assert_eq!(r.state().evidence.streams.errors, at_one_percent);
    // epochs that are neither the current one nor the one before are ignored
    let old = report(1, vec![counts(0, 5, Pair::new(6, 600), Pair::new(5, 5))]);
    r.observe(S(12), &old);
    assert_eq!(r.state().evidence.streams.errors, at_one_percent);
}

#[test]
fn thresholds_come_from_the_baseline_before_the_epoch_and_are_frozen() {
    let config = config().with_min_latency_samples(100).with_min_users(0);
    let mut r = Rollout::new(config).unwrap();
    let rec = Recorder::new(1);
    rec.follow(&r.epoch_spec());
    // pending: baseline latencies of 1..=200 ms
    for i in 1..=200u64 {
        rec.record(&Observation::new(Arm::Baseline, i, Outcome::Ok, MS(i)));
    }
    r.observe(S(1), &rec.report());
    r.start(S(2)).unwrap();
    let t = r.state().epoch.thresholds.expect("from the pending epoch");
    assert!((t.p99.as_secs_f64() - 0.198).abs() <= 0.198 / 16.0, "{t:?}");
    assert!((t.p50.as_secs_f64() - 0.100).abs() <= 0.100 / 16.0, "{t:?}");
    // within the epoch they stay, whatever the baseline does
    rec.follow(&r.epoch_spec());
    for i in 1..=500u64 {
        rec.record(&Observation::new(
            Arm::Baseline,
            i,
            Outcome::Ok,
            MS(1000 + i),
        ));
    }
    r.observe(S(3), &rec.report());
    assert_eq!(r.state().epoch.thresholds, Some(t));
    // the next epoch takes them from this one
    r.tick(S(12)).unwrap();
    let next = r.state().epoch.thresholds.unwrap();
    assert!(next.p50 > S(1), "{next:?}");

    // no thresholds yet: set once, as soon as the epoch has enough baseline latencies
    let mut r = Rollout::new(super::tests::config().with_min_latency_samples(100)).unwrap();
    r.start(S(0)).unwrap();
    let rec = Recorder::new(1);
    rec.follow(&r.epoch_spec());
    for i in 1..=99u64 {
        rec.record(&Observation::new(Arm::Baseline, i, Outcome::Ok, MS(i)));
    }
    r.observe(S(1), &rec.report());
    assert_eq!(r.state().epoch.thresholds, None);
    rec.record(&Observation::new(Arm::Baseline, 100, Outcome::Ok, MS(100)));
    r.observe(S(2), &rec.report());
    assert!(r.state().epoch.thresholds.is_some());
}

#[test]
fn a_restored_state_resumes_the_same_step_with_the_same_evidence() {
    let mut r = Rollout::new(config().with_gates([100.0])).unwrap();
    r.start(S(0)).unwrap();
    let rec = Recorder::new(4);
    rec.follow(&r.epoch_spec());
    for user in 0..300u64 {
        let arm = if user % 20 == 0 {
            Arm::Gray
        } else {
            Arm::Baseline
        };
        let outcome = if user % 7 == 0 {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        rec.record(&Observation::new(arm, user, outcome, MS(5 + user % 50)));
    }
    r.observe(S(5), &rec.report());
    r.tick(S(10)).unwrap(); // to 5 %
    rec.follow(&r.epoch_spec());
    rec.record(&Observation::new(Arm::Gray, 1, Outcome::Error, MS(3)));
    r.observe(S(11), &rec.report());

    let json = serde_json::to_string_pretty(r.state()).unwrap();
    for key in [
        "\"phase\": \"step\"",
        "\"weight\": 5.0",
        "\"step\": 1",
        "\"log_m\"",
        "\"kind\": \"advance\"",
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
    let state: State = serde_json::from_str(&json).unwrap();
    assert_eq!(&state, r.state());
    let mut restored = Rollout::restore(config().with_gates([100.0]), state).unwrap();
    assert_eq!(restored.state(), r.state());

    // both carry on alike: the same reports, the same transitions
    for t in [12, 25, 40] {
        for user in 300..320u64 {
            rec.record(&Observation::new(Arm::Gray, user + t, Outcome::Ok, MS(10)));
        }
        let report = rec.report();
        assert_eq!(r.observe(S(t), &report), restored.observe(S(t), &report));
        assert_eq!(r.tick(S(t)), restored.tick(S(t)));
    }
    assert_eq!(restored.state(), r.state());
    assert_eq!(restored.state().pause, Some(PauseReason::Gate { step: 2 }));
}

#[test]
fn restore_refuses_a_state_that_does_not_fit_its_configuration() {
    let mut r = Rollout::new(config()).unwrap();
    r.start(S(0)).unwrap();
    let state = r.state().clone();
    let err = Rollout::restore(config().with_alpha(0.05), state.clone()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("rollout state `evidence.streams.errors`: made with r0 1"),
        "{err}"
    );
    let err = Rollout::restore(config().with_steps([2.0, 100.0]), state.clone()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("rollout state `weight`: 1 (epoch 1) does not fit"),
        "{err}"
    );
    let mut paused = state.clone();
    paused.pause = Some(PauseReason::Manual);
    let err = Rollout::restore(config(), paused).unwrap_err();
    assert!(err.to_string().contains("`pause`"), "{err}");
    let err = Rollout::restore(config().with_alpha(2.0), state.clone()).unwrap_err();
    assert!(err.to_string().contains("`alpha`"), "{err}");
    // the abort that works whatever configuration wrote the state: rolled back, and then
    // it fits the other configuration, and the first
    let other = config().with_alpha(0.05).with_steps([2.0, 100.0]);
    let (aborted, t) = Rollout::abort_unfit(other.clone(), state.clone(), S(5)).unwrap();
    assert_eq!(
        (t.from, t.to, t.weight),
        (Phase::Step, Phase::RolledBack, 0.0)
    );
    assert_eq!(aborted.state().transitions, state.transitions + 1);
    assert!(
        aborted.state().epoch.index > state.epoch.index,
        "a new epoch"
    );
    let mut again = Rollout::restore(other, aborted.state().clone()).unwrap();
    Rollout::restore(config(), aborted.state().clone()).unwrap();
    // and a start there begins fresh evidence under that configuration
    again.start(S(6)).unwrap();
    assert_eq!(again.state().weight, 2.0);
    let err = Rollout::abort_unfit(config(), aborted.state().clone(), S(7)).unwrap_err();
    assert!(
        err.to_string().contains("rolled_back cannot be aborted"),
        "{err}"
    );
    // a file that is not a state says where
    let err = serde_json::from_str::<State>(r#"{"phase": "flying"}"#).unwrap_err();
    assert!(
        err.to_string().contains("unknown variant `flying`"),
        "{err}"
    );
}

#[test]
fn a_single_step_of_100_promotes_on_start() {
    let mut r = Rollout::new(config().with_steps([100.0])).unwrap();
    let t = r.start(S(0)).unwrap();
    assert_eq!((t.to, t.weight), (Phase::Promoted, 100.0));
    let _ = PerStream::<bool>::default();
}

/// A report of the current epoch: `users` gray users, the requests of a share `w`, and
/// `gray_bad` and `base_bad` bad users in the errors stream.
fn step_report(r: &Rollout, users: u64, gray_bad: u64, base_bad: u64) -> Report {
    let epoch = r.state().epoch.index;
    let w = r.state().weight / 100.0;
    let base_requests = (users as f64 * (1.0 - w) / w) as u64;
    let errors = Pair::new(gray_bad, base_bad);
    report(
        1,
        vec![counts(
            epoch,
            users,
            Pair::new(users, base_requests),
            errors,
        )],
    )
}

#[test]
fn a_step_waits_until_its_evidence_could_catch_the_degradation() {
    // 25 %, a clean baseline, the defaults: +2 % of users is the degradation to catch
    let config = RolloutConfig::new("canary")
        .with_steps([25.0, 100.0])
        .with_hold(S(4))
        .with_min_users(50);
    let mut r = Rollout::new(config).unwrap();
    r.start(S(0)).unwrap();
    // hold and min_users met, 100 gray users: 2 bad expected under the degradation,
    // far from the 7 or so it takes
    r.observe(S(5), &step_report(&r, 100, 0, 0));
    assert!(
        r.tick(S(5)).is_none(),
        "{:?}",
        r.state().evidence.step_power
    );
    let low = r.state().evidence.step_power.unwrap();
    assert!(low < 0.1, "{low}");
    // 400 users: still short of 0.9
    r.observe(S(30), &step_report(&r, 400, 0, 0));
    assert!(r.tick(S(30)).is_none());
    let mid = r.state().evidence.step_power.unwrap();
    assert!(mid > low && mid < 0.9, "{mid}");
    // 1,000 users: enough
    r.observe(S(60), &step_report(&r, 1000, 0, 0));
    let t = r
        .tick(S(60))
        .unwrap_or_else(|| panic!("not powered: {:?}", r.state().evidence));
    assert_eq!((t.to, t.reason.as_str()), (Phase::Promoted, "complete"));
    assert!(t.evidence.step_power.unwrap() >= 0.9);
}

#[test]
fn a_noisy_baseline_asks_for_more_evidence_and_the_power_is_in_the_advance() {
    let config = RolloutConfig::new("canary")
        .with_steps([10.0, 50.0, 100.0])
        .with_hold(S(1))
        .with_min_users(1);
    let (mut clean, mut noisy) = (
        Rollout::new(config.clone()).unwrap(),
        Rollout::new(config).unwrap(),
    );
    clean.start(S(0)).unwrap();
    noisy.start(S(0)).unwrap();
    clean.observe(S(2), &step_report(&clean, 500, 0, 0));
    // 10 % of baseline's users failed: the degradation is 20 %, but the baseline events
    // count against the test too
    noisy.observe(S(2), &step_report(&noisy, 500, 50, 450));
    let (c, n) = (
        clean.state().evidence.step_power.unwrap(),
        noisy.state().evidence.step_power.unwrap(),
    );
    assert!(c >= 0.9, "{c}");
    let t = clean.tick(S(2)).unwrap();
    assert!(
        matches!(t.reason, Reason::Advance { power: Some(p), .. } if p == c),
        "{:?}",
        t.reason
    );
    assert!(n != c, "{n} {c}");
    // turned off, the hold and the users decide alone
    let off = RolloutConfig::new("canary")
        .with_steps([10.0, 100.0])
        .with_hold(S(1))
        .with_min_users(1)
        .with_detect(Detect::new().with_power(0.0));
    let mut r = Rollout::new(off).unwrap();
    r.start(S(0)).unwrap();
    r.observe(S(2), &step_report(&r, 3, 0, 0));
    assert_eq!(r.tick(S(2)).unwrap().to, Phase::Promoted);
}

#[test]
fn a_shared_outage_pauses_and_the_step_starts_again_after_it() {
    let config = RolloutConfig::new("canary")
        .with_steps([50.0, 100.0])
        .with_hold(S(4))
        .with_min_users(1)
        .with_detect(Detect::new().with_power(0.0));
    let mut r = Rollout::new(config).unwrap();
    r.start(S(0)).unwrap();
    let epoch = r.state().epoch.index;
    // cumulative requests and errors per arm, one report a second
    let send = |r: &mut Rollout, at: u64, requests: u64, errors: u64| {
        let c = counts(
            r.state().epoch.index,
            requests,
            Pair::new(requests, requests),
            Pair::new(errors, errors),
        );
        r.observe(S(at), &report(1, vec![c]))
    };
    assert!(send(&mut r, 1, 10, 0).is_none());
    assert!(r.tick(S(1)).is_none());
    // both arms fail every request from 2 s on
    assert!(send(&mut r, 2, 40, 30).is_none());
    let t = r.tick(S(2)).expect("an outage");
    assert_eq!((t.to, t.weight), (Phase::Paused, 50.0));
    let Reason::Outage(e) = &t.reason else {
        panic!("{:?}", t.reason)
    };
    assert_eq!((e.gray_errors, e.baseline_errors), (30, 30));
    assert_eq!(r.state().pause, Some(PauseReason::Outage));
    // the hold passes during the outage: nothing advances
    for at in 3..12 {
        assert!(send(&mut r, at, 40 + 30 * (at - 2), 30 + 30 * (at - 2)).is_none());
        assert!(r.tick(S(at)).is_none(), "at {at} s");
    }
    // healthy again: the window still holds the outage until it slides past it
    let mut at = 12;
    let resumed = loop {
        let n = 310 + 30 * (at - 11);
        assert!(send(&mut r, at, n, 300).is_none());
        if let Some(t) = r.tick(S(at)) {
            break t;
        }
        at += 1;
        assert!(at < 40, "never resumed");
    };
    assert_eq!(
        (resumed.to, resumed.reason.as_str()),
        (Phase::Step, "recovered")
    );
    assert!(r.state().epoch.index > epoch, "a fresh epoch");
    assert_eq!(r.state().epoch.started, S(at));
    // the hold counts from the recovery
    let c = counts(
        r.state().epoch.index,
        10,
        Pair::new(10, 10),
        Pair::default(),
    );
    r.observe(S(at + 3), &report(1, vec![c.clone()]));
    assert!(r.tick(S(at + 3)).is_none(), "3 s since the recovery");
    r.observe(S(at + 4), &report(1, vec![c]));
    assert_eq!(r.tick(S(at + 4)).unwrap().to, Phase::Promoted);
}

/// A rollout started at its first step, and a recorder of `source` following it.
fn started(source: u64) -> (Rollout, Recorder) {
    let mut r = Rollout::new(config()).unwrap();
    r.start(S(0)).unwrap();
    let rec = Recorder::new(source);
    rec.follow(&r.epoch_spec());
    (r, rec)
}

/// Records `user`'s request on `rec`: in gray when `gray`, failed when `fail`.
fn request(rec: &Recorder, user: u64, gray: bool, fail: bool) {
    let arm = if gray { Arm::Gray } else { Arm::Baseline };
    let outcome = if fail { Outcome::Error } else { Outcome::Ok };
    rec.record(&Observation::new(arm, user, outcome, MS(5)));
}

/// The same requests, to one gateway and spread round robin over three: both leaders
/// count what one gateway counts.
#[test]
fn one_user_over_three_gateways_is_one_user() {
    let mut one = Rollout::new(config()).unwrap();
    let mut three = Rollout::new(config()).unwrap();
    let mut summed = Rollout::new(config()).unwrap();
    for r in [&mut one, &mut three, &mut summed] {
        r.start(S(0)).unwrap();
    }
    let alone = Recorder::new(100);
    let gateways: Vec<Recorder> = (1..=3).map(Recorder::new).collect();
    for rec in gateways.iter().chain([&alone]) {
        rec.follow(&one.epoch_spec());
    }
    let mut i = 0;
    for round in 0..12u64 {
        // user 7 fails every request in gray; 40 healthy users, every tenth in gray
        for user in (0..40).chain([7, 7, 7]) {
            let gray = user == 7 || user % 10 == 3;
            let fail = user == 7;
            request(&alone, user, gray, fail);
            request(&gateways[i % 3], user, gray, fail);
            i += 1;
        }
        let at = S(1 + round);
        one.observe(at, &alone.report());
        for rec in &gateways {
            let report = rec.report();
            three.observe(at, &report);
            summed.observe(at, &Report::new(report.source, report.epochs.clone()));
            rec.acknowledge(three.state().users.cursor(rec.source()));
        }
    }
    let (e1, e3) = (&one.state().evidence, &three.state().evidence);
    assert_eq!((e1.requests, e1.errors), (e3.requests, e3.errors));
    assert_eq!(e1.epoch.gray_users, 5, "users 3, 7, 13, 23, 33");
    assert_eq!(e3.epoch.gray_users, e1.epoch.gray_users);
    assert_eq!(e1.epoch.bad_users.errors, Pair::new(1, 0));
    assert_eq!(e3.epoch.bad_users, e1.epoch.bad_users);
    for s in Stream::ALL {
        assert_eq!(
            e1.streams.get(s).counts(),
            e3.streams.get(s).counts(),
            "{s}"
        );
        assert!((e1.streams.get(s).log_m() - e3.streams.get(s).log_m()).abs() < 1e-9);
    }
    assert_eq!(three.state().phase, Phase::Step);
    // summing the gateways' own counts (no user logs) counted user 7 once per gateway:
    // three bad users in gray at 1 %, and a healthy gray rolled back
    let sum = &summed.state().evidence;
    assert_eq!(sum.streams.errors.counts(), (3, 0));
    assert_eq!(summed.state().phase, Phase::RolledBack);
}

/// A leader that read a log and died before saving: the next one restores the last saved
/// state and reads the same entries again, because only a saved state acknowledges them.
#[test]
fn entries_leave_a_log_only_once_a_saved_state_consumed_them() {
    let (mut leader, rec) = started(5);
    // users 0 and 1 fail in baseline, 2 to 5 are seen in gray
    for user in 0..6 {
        request(&rec, user, user >= 2, user < 2);
    }
    leader.observe(S(1), &rec.report());
    let saved = leader.state().clone();
    rec.acknowledge(saved.users.cursor(5));
    assert!(rec.report().users.unwrap().is_empty(), "all acknowledged");
    assert_eq!(saved.users.cursor(5), 6, "4 gray users and 2 bad ones");

    for user in 6..9 {
        request(&rec, user, true, false);
        request(&rec, 100 + user, false, true);
    }
    let report = rec.report();
    assert_eq!(
        report.users.as_ref().map(|l| (l.from, l.len())),
        Some((6, 6))
    );
    leader.observe(S(2), &report);
    // a report read twice counts once
    leader.observe(S(3), &report);
    assert_eq!(leader.state().evidence.streams.errors.counts(), (0, 5));
    assert_eq!(leader.state().evidence.epoch.gray_users, 7);
    // the leader dies before saving; the next one restores the saved state
    let mut next = Rollout::restore(config(), saved).unwrap();
    next.observe(S(4), &rec.report());
    assert_eq!(next.state().users, leader.state().users);
    assert_eq!(next.state().evidence.epoch, leader.state().evidence.epoch);
    assert_eq!(
        next.state().evidence.streams.errors.counts(),
        leader.state().evidence.streams.errors.counts()
    );
    // an acknowledgement below what was acknowledged already changes nothing
    rec.acknowledge(3);
    assert_eq!(rec.report().users.unwrap().from, 6);
}

/// Entries of the epoch before count at its weight and not toward the new step's users;
/// a later epoch's users start from zero, while bad users stay counted for the run.
#[test]
fn logged_users_of_the_epoch_before_count_at_its_weight() {
    let mut r = Rollout::new(config()).unwrap();
    r.start(S(0)).unwrap();
    let (a, b) = (Recorder::new(1), Recorder::new(2));
    a.follow(&r.epoch_spec());
    b.follow(&r.epoch_spec());
    for user in 0..10 {
        request(&a, user, true, false);
    }
    r.observe(S(1), &a.report());
    let t = r.tick(S(10)).unwrap();
    assert_eq!((t.weight, r.state().epoch.index), (5.0, 2));
    // b is late: its epoch-1 users (user 3 failing) arrive after the switch
    request(&b, 3, true, true);
    request(&b, 42, true, false);
    r.observe(S(11), &b.report());
    let ev = &r.state().evidence;
    assert_eq!(ev.epoch.gray_users, 0, "epoch 2 has seen no user yet");
    assert_eq!(ev.streams.errors.counts(), (1, 0));
    // the same user failing again in the new epoch, on the other gateway: still one
    a.follow(&r.epoch_spec());
    request(&a, 3, true, true);
    request(&a, 50, true, false);
    r.observe(S(12), &a.report());
    let ev = &r.state().evidence;
    assert_eq!(ev.epoch.gray_users, 2, "users 3 and 50 in epoch 2");
    assert_eq!(ev.streams.errors.counts(), (1, 0));
}

#[test]
fn a_saved_union_round_trips_and_garbage_is_refused() {
    let (mut r, rec) = started(9);
    // 25 users in gray; 5 users fail in baseline
    for user in 0..50 {
        request(&rec, user, user % 2 == 0, user % 10 == 5);
    }
    r.observe(S(1), &rec.report());
    let json = serde_json::to_value(&r.state().users).unwrap();
    let back: Users = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(&back, &r.state().users);
    let gray = json["gray"].as_str().unwrap();
    assert_eq!(gray.len(), 25 * 8, "{gray}");

    let mut bad = json.clone();
    bad["gray"] = serde_json::Value::from("0000001");
    let err = serde_json::from_value::<Users>(bad)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a whole number of 8-digit fingerprints"),
        "{err}"
    );
    let mut bad = json;
    bad["gray"] = serde_json::Value::from("0000001x");
    let err = serde_json::from_value::<Users>(bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("user fingerprint 0"), "{err}");
}

/// Counts and numbers read back from a store are saturated, never a panic: reports of
/// absurd counts, and a state whose transition and epoch numbers are at their ends.
#[test]
fn absurd_counts_from_a_store_saturate() {
    let mut r = Rollout::new(config()).unwrap();
    r.start(S(0)).unwrap();
    let max = u64::MAX;
    for source in [1, 2] {
        let c = counts(1, max, Pair::new(max, max), Pair::new(max, max));
        r.observe(S(1), &report(source, vec![c]));
    }
    let ev = &r.state().evidence;
    assert_eq!(
        (ev.requests, ev.errors),
        (Pair::new(max, max), Pair::new(max, max))
    );
    assert_eq!(ev.streams.errors.counts(), (max, max));
    let mut state = r.state().clone();
    state.transitions = max;
    state.epoch.index = max;
    // the absurd counts alarmed: rolled back; a start numbers its transition and epoch
    assert_eq!(state.phase, Phase::RolledBack);
    let mut r = Rollout::restore(config(), state).unwrap();
    r.start(S(2)).unwrap();
    assert_eq!((r.state().transitions, r.state().epoch.index), (max, max));
}

// === the shadow phase ===

fn shadowed() -> RolloutConfig {
    config().with_shadow(ShadowPhase::new(S(30), 100))
}

/// A report of `source` whose mirror judged `copies` copies and `copies / 5` controls,
/// `bad` of the copies mismatching (none of the controls).
fn judged(source: u64, copies: u64, bad: u64) -> Report {
    let counts = crate::shadow::ShadowCounts {
        copies,
        controls: copies / 5,
        copy_mismatches: bad,
        ..Default::default()
    };
    Report::new(source, Vec::new()).with_shadow(counts)
}

#[test]
fn a_rollout_with_a_shadow_starts_with_copies_only_and_enters_its_first_step_once_judged() {
    let mut r = Rollout::new(shadowed()).unwrap();
    let t = r.start(S(100)).unwrap();
    assert_eq!(
        (t.to, t.weight, t.step, t.reason.as_str()),
        (Phase::Shadow, 0.0, None, "start")
    );
    assert!(r.state().phase.is_active());
    // A pause is for steps; an abort and a promotion work.
    assert!(r.pause(S(101)).is_err());
    // Clean copies from two gateways: held 30 s and 100 copies before the first step.
    assert!(
        r.observe_all(S(110), &[judged(1, 40, 0), judged(2, 40, 0)])
            .is_none()
    );
    assert!(r.tick(S(129)).is_none(), "the hold is not met");
    assert!(
        r.observe_all(S(130), &[judged(1, 40, 0), judged(2, 40, 0)])
            .is_none()
    );
    assert!(r.tick(S(131)).is_none(), "80 copies of 100 judged");
    assert!(
        r.observe_all(S(132), &[judged(1, 60, 0), judged(2, 60, 0)])
            .is_none()
    );
    let t = r.tick(S(133)).unwrap();
    assert_eq!(
        (t.from, t.to, t.weight, t.step, t.reason.as_str()),
        (Phase::Shadow, Phase::Step, 1.0, Some(0), "shadow_passed")
    );
    match &t.reason {
        Reason::ShadowPassed { held_ms, counts } => {
            assert_eq!(
                (*held_ms, counts.copies, counts.controls),
                (33_000, 120, 24)
            );
        }
        other => panic!("{other:?}"),
    }
    // The state round-trips with its shadow evidence, and restores.
    let json = serde_json::to_string(r.state()).unwrap();
    let state: State = serde_json::from_str(&json).unwrap();
    assert_eq!(state.shadow.as_ref().unwrap().counts.copies, 120);
    Rollout::restore(shadowed(), state).unwrap();
}

#[test]
fn copies_that_differ_beyond_the_controls_roll_the_shadow_back() {
    let mut r = Rollout::new(shadowed()).unwrap();
    r.start(S(0)).unwrap();
    let mut rolled_back = None;
    for i in 1..=60 {
        // 5 % of the copies mismatch, none of the controls.
        if let Some(t) = r.observe(S(i), &judged(1, 100 * i, 5 * i)) {
            rolled_back = Some(t);
            break;
        }
    }
    let t = rolled_back.expect("an alarm within a minute");
    assert_eq!(
        (t.from, t.to, t.weight),
        (Phase::Shadow, Phase::RolledBack, 0.0)
    );
    match &t.reason {
        Reason::ShadowAlarm {
            stream,
            log_m,
            alarm_at,
            counts,
        } => {
            assert_eq!(stream, "mismatch");
            assert!(log_m >= alarm_at);
            assert_eq!(counts.control_mismatches, 0);
        }
        other => panic!("{other:?}"),
    }
    // A state in its shadow phase needs a configuration with one.
    let mut r = Rollout::new(shadowed()).unwrap();
    r.start(S(0)).unwrap();
    let e = Rollout::restore(config(), r.state().clone()).unwrap_err();
    assert!(e.to_string().contains("shadow"), "{e}");
}
