//! The test's power (see [`MixtureTest::power`]).

use std::time::Duration;

use super::MixtureTest;

impl MixtureTest {
    /// The chance (normal approximation) that the test alarms on the evidence of a period
    /// from `since`, at gray's share `w` in (0, 1), when `gray` and `baseline` bad events
    /// are expected in it (means of Poisson counts). 0 when nothing can be told at that
    /// share, or before the test began.
    ///
    /// The test's power: how likely it is to alarm on a period's evidence, had gray been worse
    /// by a given ratio over that period. The state machine asks it before a step advances
    /// ([`Detect`](crate::machine::Detect)).
    ///
    /// Over a period that began at `since`, with gray's share `w`, say `c` bad events are
    /// expected from gray and `b` from baseline (Poisson counts). Take the onset open at
    /// `since` (prior weight `π_j`) and a ratio `r_k` of the grid: the test alarms once
    ///
    /// ```text
    /// ln π_j − ln K + ℓ_k ≥ ln(1/α),    ℓ_k = c·(A_k + D_k) + b·D_k
    /// A_k = ln(r_k/r0),   D_k = ln(1 + w(r0 − 1)) − ln(1 + w(r_k − 1))
    /// ```
    ///
    /// `ℓ_k` has the mean above and the variance `c·(A_k + D_k)² + b·D_k²`; by the normal
    /// approximation, P(alarm) ≈ Φ((mean − line)/sd), and the power is the largest over `k`.
    /// Two things make it an estimate rather than a bound: the onset's evidence from before
    /// `since` (at most `onset_every` of it: a healthy period before lowers `ℓ_k` a little),
    /// and the normal approximation at small counts. The seeded simulations of the state
    /// machine measure what it gives (`crates/gray-rollout/tests/statistics.rs`).
    #[must_use]
    pub fn power(&self, since: Duration, w: f64, gray: f64, baseline: f64) -> f64 {
        let Some(began) = self.began else {
            return 0.0;
        };
        if !(w > 0.0 && w < 1.0 && gray >= 0.0 && baseline >= 0.0) {
            return 0.0;
        }
        let log_prior = if self.onset_every.is_zero() {
            0.0
        } else {
            let j = (since.saturating_sub(began).as_nanos() / self.onset_every.as_nanos()) as f64;
            -((j + 1.0) * (j + 2.0)).ln()
        };
        let line = self.log_threshold() + (self.ratios.len() as f64).ln() - log_prior;
        let base = (w * (self.r0 - 1.0)).ln_1p();
        self.ratios
            .iter()
            .map(|r| {
                let d = base - (w * (r - 1.0)).ln_1p();
                let a = (r / self.r0).ln() + d;
                let mean = gray.mul_add(a, baseline * d);
                let sd = gray.mul_add(a * a, baseline * d * d).sqrt();
                if sd == 0.0 {
                    return if mean >= line { 1.0 } else { 0.0 };
                }
                normal_cdf((mean - line) / sd)
            })
            .fold(0.0, f64::max)
    }
}

/// Φ(x), the standard normal distribution function (from erfc, Numerical Recipes'
/// Chebyshev fit: relative error below 1.2e-7).
pub(crate) fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / 0.5f64.mul_add(z, 1.0);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let sum = poly.iter().rev().fold(0.0_f64, |acc, c| acc.mul_add(t, *c));
    let r = t * (-z).mul_add(z, sum).exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequential::DEFAULT_MULTIPLIERS;

    #[test]
    fn the_normal_distribution_function() {
        for (x, p) in [
            (0.0, 0.5),
            (1.0, 0.841_344_7),
            (-1.281_551_6, 0.1),
            (3.0, 0.998_650_1),
        ] {
            assert!(
                (normal_cdf(x) - p).abs() < 1e-6,
                "Φ({x}) = {}",
                normal_cdf(x)
            );
        }
    }

    #[test]
    fn power_grows_with_the_evidence_and_falls_with_the_share() {
        let mut test = MixtureTest::new(1.0, &DEFAULT_MULTIPLIERS, 0.01 / 3.0).unwrap();
        assert_eq!(test.power(Duration::ZERO, 0.1, 10.0, 0.0), 0.0, "not begun");
        test.begin(Duration::ZERO);
        let s = Duration::from_secs;
        // gray-only bad events at 10 %: each is worth ln(100 / 10.9) = 2.2 at most, and the
        // line is ln 300 + ln 8 + ln 2 = 8.5: about 4 events on average, 7 to be sure
        let p = |c: f64| test.power(s(0), 0.1, c, 0.0);
        assert!(p(2.0) < 0.1, "{}", p(2.0));
        assert!(p(4.0) > 0.3 && p(4.0) < 0.7, "{}", p(4.0));
        assert!(p(9.0) > 0.9, "{}", p(9.0));
        assert!(
            p(9.0) > test.power(s(0), 0.5, 9.0, 0.0),
            "less per event at 50 %"
        );
        // baseline events expected beside them lower it
        assert!(test.power(s(0), 0.1, 9.0, 40.0) < p(9.0));
        // a period starting ten minutes in pays the onset's prior: ln 110 against ln 2
        assert!(test.power(s(600), 0.1, 9.0, 0.0) < p(9.0));
        assert_eq!(
            test.power(s(0), 1.0, 9.0, 0.0),
            0.0,
            "nothing told at 100 %"
        );
    }
}
