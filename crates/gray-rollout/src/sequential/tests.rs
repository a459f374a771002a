use std::time::Duration;

use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;

fn q(w: f64, r: f64) -> f64 {
    w * r / w.mul_add(r, 1.0 - w)
}

fn single(r0: f64, multipliers: &[f64]) -> MixtureTest {
    MixtureTest::new(r0, multipliers, 0.01)
        .and_then(|t| t.with_onsets(Duration::ZERO, 1))
        .unwrap()
}

#[test]
fn one_onset_is_the_formula_of_the_design() {
    let mut t = single(1.2, &[2.0, 10.0]);
    t.update(S(1), 0.1, 3, 40);
    t.update(S(2), 0.25, 2, 7);
    let mut direct = Vec::new();
    for r in [2.4, 12.0] {
        let mut l = 0.0;
        for (w, c, b) in [(0.1, 3.0_f64, 40.0), (0.25, 2.0, 7.0)] {
            let (qk, q0) = (q(w, r), q(w, 1.2));
            l += c.mul_add((qk / q0).ln(), b * ((1.0 - qk) / (1.0 - q0)).ln());
        }
        direct.push(l);
    }
    assert_eq!(t.onsets.len(), 1);
    for (got, want) in t.onsets[0].log_likelihoods.iter().zip(&direct) {
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }
    let m = (direct.iter().map(|l| l.exp()).sum::<f64>() / 2.0).ln();
    assert!((t.log_m() - m).abs() < 1e-9);
    assert_eq!(t.counts(), (5, 47));
}

#[test]
fn onsets_open_on_schedule_with_their_prior_and_the_oldest_close() {
    let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01)
        .and_then(|t| t.with_onsets(S(60), 3))
        .unwrap();
    t.begin(S(1000));
    assert_eq!(t.log_m(), 0.0);
    // minutes 1 and 2 are due at once: one onset with both weights (1/6 + 1/12)
    t.update(S(1000 + 150), 0.05, 0, 0);
    assert_eq!(t.opened, 3);
    let w: Vec<f64> = t.onsets.iter().map(|o| o.log_weight.exp()).collect();
    assert!(
        (w[0] - 0.5).abs() < 1e-12 && (w[1] - 0.25).abs() < 1e-12,
        "{w:?}"
    );
    // M is still 1: no evidence, the weights sum to 1 with what is not open yet
    assert!(t.log_m().abs() < 1e-12, "{}", t.log_m());
    // evidence, then more onsets than stay open: the oldest is frozen at its value;
    // opening and closing onsets never changes M
    t.update(S(1000 + 170), 0.05, 0, 50);
    let before = t.log_m();
    t.update(S(1000 + 200), 0.05, 0, 0);
    t.update(S(1000 + 260), 0.05, 0, 0);
    assert_eq!(t.onsets.len(), 3);
    assert_eq!(
        t.onsets.iter().map(|o| o.index).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert!(t.log_closed.is_some());
    assert!(
        (t.log_m() - before).abs() < 1e-9,
        "{} vs {before}",
        t.log_m()
    );
    // and the fresh onsets carry none of the debt
    assert!(t.onsets[2].log_likelihoods.iter().all(|l| *l == 0.0));
}

#[test]
fn a_fresh_onset_detects_a_late_fault_sooner() {
    let run = |every: Duration| {
        let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01 / 3.0)
            .and_then(|t| t.with_onsets(every, 16))
            .unwrap();
        t.begin(S(0));
        // an hour of healthy traffic: 1 gray to 19 baseline bad users a minute at 5 %
        for minute in 1..=60 {
            t.update(S(60 * minute), 0.05, 1, 19);
        }
        // then 3 gray bad users for every baseline one, a batch a second
        (1..)
            .find(|s| t.update(S(3600 + s), 0.05, 1, u64::from(s % 3 == 0)))
            .unwrap()
    };
    let (with_onsets, design) = (run(S(60)), run(Duration::ZERO));
    assert!(with_onsets < design / 2, "{with_onsets} s vs {design} s");
}

#[test]
fn huge_evidence_does_not_overflow() {
    let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01).unwrap();
    t.update(S(0), 0.01, 1_000_000, 0);
    assert!(t.log_m().is_finite() && t.log_m() > 1000.0);
    let mut t = single(1.0, &DEFAULT_MULTIPLIERS);
    t.update(S(0), 0.5, 0, 10_000_000);
    assert!(t.log_m().is_finite() && t.log_m() < -1000.0);
    assert!(!t.alarm());
}

#[test]
fn shares_of_zero_and_one_carry_no_evidence() {
    let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01).unwrap();
    t.update(S(0), 0.0, 5, 5);
    t.update(S(1), 1.0, 5, 5);
    t.update(S(2), f64::NAN, 5, 5);
    assert_eq!(t.log_m(), 0.0);
    assert_eq!(t.counts(), (0, 0));
}

#[test]
fn one_event_can_never_alarm() {
    // the largest factor one gray event brings is below mean(r_k / r0) = 23.9 < 1/α'
    for w in [0.0001, 0.01, 0.05, 0.5, 0.99] {
        let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01 / 3.0).unwrap();
        t.update(S(0), w, 1, 0);
        assert!(t.log_m() < 23.9f64.ln(), "w {w}: {}", t.log_m());
        assert!(!t.alarm());
    }
}

#[test]
fn the_cheap_bound_agrees_with_the_exact_alarm() {
    let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01).unwrap();
    for s in 0..600u64 {
        let alarm = t.update(S(s), 0.05, u64::from(s % 7 == 0), 1);
        assert_eq!(alarm, t.log_m() >= t.log_threshold(), "second {s}");
    }
}

#[test]
fn the_evidence_round_trips_through_json() {
    let mut t = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01)
        .and_then(|t| t.with_onsets(S(10), 2))
        .unwrap();
    for s in 0..40 {
        t.update(S(s), 0.05, u64::from(s % 5 == 0), 3);
    }
    let json = serde_json::to_value(&t).unwrap();
    assert_eq!(json["log_m"].as_f64(), Some(t.log_m()));
    assert_eq!(json["gray"], 8);
    let back: MixtureTest = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, t);
    let mut broken = json;
    broken["onsets"][1]["log_likelihoods"] = serde_json::json!([1.0]);
    let err = serde_json::from_value::<MixtureTest>(broken).unwrap_err();
    assert!(
        err.to_string()
            .contains("onset 1: 1 log-likelihoods for 8 ratios"),
        "{err}"
    );
}

#[test]
fn invalid_parameters_are_refused() {
    let m = &DEFAULT_MULTIPLIERS;
    assert_eq!(
        MixtureTest::new(0.0, m, 0.01),
        Err(InvalidTest::Tolerance(0.0))
    );
    assert_eq!(
        MixtureTest::new(1.0, &[], 0.01),
        Err(InvalidTest::NoMultipliers)
    );
    assert_eq!(
        MixtureTest::new(1.0, &[2.0, 1.0], 0.01),
        Err(InvalidTest::Multiplier(1.0))
    );
    assert_eq!(MixtureTest::new(1.0, m, 1.0), Err(InvalidTest::Alpha(1.0)));
    assert!(MixtureTest::new(1.0, m, f64::NAN).is_err());
    let t = MixtureTest::new(1.0, m, 0.01).unwrap();
    assert_eq!(t.with_onsets(S(1), 0), Err(InvalidTest::MaxOnsets));
}
