//! A certificate's validity period, read from its DER encoding (RFC 5280, 4.1): only the
//! few fields in front of it are walked, nothing is verified. rustls checks certificates
//! against trust anchors, not a server's own certificate against the clock; this is what
//! `--check` and every (re)load use to refuse an expired or not yet valid certificate.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// When a certificate is valid: `notBefore` and `notAfter`, in seconds since the Unix
/// epoch (negative before 1970).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validity {
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
}

impl Validity {
    /// Reads the validity of the certificate `der`.
    pub(crate) fn of(der: &[u8]) -> Result<Validity, &'static str> {
        const MALFORMED: &str = "not a well-formed X.509 certificate";
        let (certificate, _) = element(der, SEQUENCE).ok_or(MALFORMED)?;
        let (mut tbs, _) = element(certificate, SEQUENCE).ok_or(MALFORMED)?;
        // version [0] EXPLICIT, optional; serialNumber; signature; issuer
        if tbs.first() == Some(&VERSION) {
            tbs = element(tbs, VERSION).ok_or(MALFORMED)?.1;
        }
        let rest = element(tbs, INTEGER).ok_or(MALFORMED)?.1;
        let rest = element(rest, SEQUENCE).ok_or(MALFORMED)?.1;
        let rest = element(rest, SEQUENCE).ok_or(MALFORMED)?.1;
        let (validity, _) = element(rest, SEQUENCE).ok_or(MALFORMED)?;
        let (not_before, rest) = time(validity).ok_or(MALFORMED)?;
        let (not_after, _) = time(rest).ok_or(MALFORMED)?;
        Ok(Validity {
            not_before,
            not_after,
        })
    }

    /// Whether it holds at `now`; else why not.
    pub(crate) fn check(&self, now: SystemTime) -> Result<(), String> {
        let now = unix(now);
        if now < self.not_before {
            return Err(format!(
                "the certificate is not valid yet: valid from {} (it is now {})",
                Utc(self.not_before),
                Utc(now)
            ));
        }
        if now > self.not_after {
            return Err(format!(
                "the certificate expired on {} (it is now {})",
                Utc(self.not_after),
                Utc(now)
            ));
        }
        Ok(())
    }

    /// How long until it expires, from `now` (zero once it has).
    pub(crate) fn remaining(&self, now: SystemTime) -> Duration {
        Duration::from_secs(u64::try_from(self.not_after - unix(now)).unwrap_or(0))
    }
}

/// Seconds since the Unix epoch.
fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// A time in seconds since the Unix epoch, shown as `2026-03-01 12:00:00 UTC`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Utc(pub(crate) i64);

impl fmt::Display for Utc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (days, secs) = (self.0.div_euclid(86_400), self.0.rem_euclid(86_400));
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The contents of the DER element of type `tag` at the start of `der`, and what follows
/// it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = der.split_first()?;
    if first != tag {
        return None;
    }
    let (&len, rest) = rest.split_first()?;
    let (len, rest) = if len < 0x80 {
        (usize::from(len), rest)
    } else {
        // The long form: the next `len & 0x7f` bytes, big-endian (at most 4 here).
        let n = usize::from(len & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A `Time` (UTCTime or GeneralizedTime, in the forms RFC 5280 allows: seconds, `Z`) at
/// the start of `der`, in seconds since the Unix epoch, and what follows it.
fn time(der: &[u8]) -> Option<(i64, &[u8])> {
    let (tag, digits) = match *der.first()? {
        UTC_TIME => (UTC_TIME, 12),
        GENERALIZED_TIME => (GENERALIZED_TIME, 14),
        _ => return None,
    };
    let (value, rest) = element(der, tag)?;
    if value.len() != digits + 1 || value[digits] != b'Z' {
        return None;
    }
    let number = |at: usize, len: usize| -> Option<i64> {
        value[at..at + len].iter().try_fold(0i64, |acc, &b| {
            b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0'))
        })
    };
    let (year, at) = if tag == UTC_TIME {
        // RFC 5280: YY of 50 and above is 19YY, below 50 is 20YY.
        let yy = number(0, 2)?;
        (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
    } else {
        (number(0, 4)?, 4)
    };
    let (month, day) = (number(at, 2)?, number(at + 2, 2)?);
    let (hour, minute, second) = (number(at + 4, 2)?, number(at + 6, 2)?, number(at + 8, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((days * 86_400 + hour * 3600 + minute * 60 + second, rest))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use gray_test_support::tls::{Ca, Leaf};

    use super::*;

    fn at(secs: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap())
    }

    #[test]
    fn reads_the_validity_rcgen_wrote() {
        let ca = Ca::new("validity");
        // 2001-09-09 01:46:40 UTC to 2033-05-18 03:33:20 UTC (UTCTime), then to
        // 2096-10-02 07:06:40 UTC (GeneralizedTime, from 2050 on).
        for (from, to) in [
            (1_000_000_000, 2_000_000_000),
            (1_000_000_000, 4_000_000_000),
        ] {
            let cert = ca.issue(&Leaf::server(&["localhost"]).with_validity(at(from), at(to)));
            let validity = Validity::of(cert.cert_der()).unwrap();
            assert_eq!(
                validity,
                Validity {
                    not_before: from,
                    not_after: to
                }
            );
        }
        assert_eq!(Utc(1_000_000_000).to_string(), "2001-09-09 01:46:40 UTC");
        assert_eq!(Utc(4_000_000_000).to_string(), "2096-10-02 07:06:40 UTC");
        assert_eq!(Utc(0).to_string(), "1970-01-01 00:00:00 UTC");
        assert_eq!(Utc(951_782_400).to_string(), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn checks_against_the_clock() {
        let validity = Validity {
            not_before: 1_000,
            not_after: 2_000,
        };
        assert!(validity.check(at(1_500)).is_ok());
        let early = validity.check(at(999)).unwrap_err();
        assert!(
            early.starts_with(
                "the certificate is not valid yet: valid from 1970-01-01 00:16:40 UTC"
            ),
            "{early}"
        );
        let late = validity.check(at(2_001)).unwrap_err();
        assert!(
            late.starts_with("the certificate expired on 1970-01-01 00:33:20 UTC"),
            "{late}"
        );
        assert_eq!(validity.remaining(at(1_500)), Duration::from_secs(500));
        assert_eq!(validity.remaining(at(3_000)), Duration::ZERO);
    }

    #[test]
    fn anything_else_is_malformed() {
        let cert = Ca::new("x").issue(&Leaf::server(&["localhost"]));
        let der = cert.cert_der();
        for bad in [
            &[][..],
            b"\x30",
            b"not a certificate",
            &der[..der.len() / 3],
        ] {
            assert!(Validity::of(bad).is_err(), "{bad:?}");
        }
        // Every truncation fails cleanly, never panics.
        for n in 0..der.len() {
            let _ = Validity::of(&der[..n]);
        }
    }
}
