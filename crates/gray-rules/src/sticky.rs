//! Sticky-percentage rules as a rollout sees them: which users the percentage put in gray,
//! which it kept in baseline, and the percentage itself, set from outside.
//!
//! A *sticky-percentage rule* is a rule whose `when` is a `sticky` condition, or an `all`
//! with exactly one `sticky` among other conditions (`when = { path = …, sticky = … }` is
//! one), that contains no other `sticky` and no `random` condition anywhere, and whose
//! outcome is a lane or version pins (not `baseline`, a `split` or `version_from`). For
//! such a rule, [`StickyRule::arm`] tells, for a request:
//!
//! - [`StickyArm::Gray`]: the rule matches: the other conditions hold, the request has the
//!   sticky key, and the key's bucket is inside the percentage;
//! - [`StickyArm::Baseline`]: the other conditions hold and the request has the key, but
//!   its bucket is outside the percentage: the user the percentage kept in baseline;
//! - [`StickyArm::NotApplicable`]: any other request (another path, no key, the rule or
//!   the set switched off): the percentage decided nothing about it.
//!
//! Both arms carry the **user**: the 64-bit hash of the sticky key under the rule's salt
//! ([`gray_core::hash::keyed_hash`], whose remainder by 10,000 is the user's bucket,
//! [`sticky_bucket`](crate::sticky_bucket)), the unit a rollout counts evidence in.
//! [`RuleSet::with_sticky_percent`] returns the set with the rule's percentage replaced:
//! what a rollout puts in force at each step. Growing it keeps every gray user gray.
//!
//! ```
//! use gray_rules::{Format, RequestView, RuleSet, StickyArm};
//! use http::{HeaderMap, HeaderValue, Uri};
//!
//! // [[rules]] name = "testers", when = { header = { name = "x-tester", present = true } }, lane = "gray"
//! // [[rules]] name = "canary", when = { path = { prefix = "/orders/" }, sticky = { by = { header = "x-user" }, percent = 10 } }, lane = "gray"
//! let rules = RuleSet::parse(
//!     r#"{"rules": [
//!         {"name": "testers", "when": {"header": {"name": "x-tester", "present": true}}, "lane": "gray"},
//!         {"name": "canary", "lane": "gray",
//!          "when": {"path": {"prefix": "/orders/"}, "sticky": {"by": {"header": "x-user"}, "percent": 10}}}
//!     ]}"#,
//!     Format::Json,
//!     "rules.json",
//! )?;
//! let canary = rules.sticky_rule("canary")?;
//! assert_eq!((canary.rule().index(), canary.percent()), (1, 10.0));
//!
//! let arm = |path: &str, user: Option<&'static str>| {
//!     let uri: Uri = path.parse().unwrap();
//!     let mut headers = HeaderMap::new();
//!     if let Some(user) = user {
//!         headers.insert("x-user", HeaderValue::from_static(user));
//!     }
//!     canary.arm(&RequestView::new(&uri, &headers))
//! };
//! let users: Vec<_> = (0..1000).map(|i| format!("user-{i}")).map(|u| &*u.leak()).collect();
//! let gray = users.iter().filter(|u| matches!(arm("/orders/1", Some(u)), StickyArm::Gray(_))).count();
//! assert!((60..140).contains(&gray), "about 10 % of 1000: {gray}");
//! // another path, or no key: the percentage decided nothing
//! assert_eq!(arm("/stock/1", Some("user-1")), StickyArm::NotApplicable);
//! assert_eq!(arm("/orders/1", None), StickyArm::NotApplicable);
//!
//! // at 100 %, every user with the key is gray
//! let all = rules.with_sticky_percent("canary", 100.0)?;
//! assert_eq!(all.sticky_rule("canary")?.percent(), 100.0);
//! // the testers' rule is no sticky-percentage rule
//! assert!(rules.sticky_rule("testers").is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use gray_core::hash::keyed_hash;

use crate::{
    Outcome, RequestView, Rule, RuleSet,
    condition::{Condition, Key},
    hash::BUCKETS,
};

/// Where a request stands to a sticky-percentage rule; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StickyArm {
    /// The percentage put this user in gray: the rule matches. The user's hash.
    Gray(u64),
    /// The other conditions hold and the key is there, but the percentage kept this user
    /// in baseline. The user's hash.
    Baseline(u64),
    /// The percentage decided nothing about this request.
    NotApplicable,
}

impl StickyArm {
    /// The user's hash, for either arm.
    #[must_use]
    pub fn user(self) -> Option<u64> {
        match self {
            StickyArm::Gray(user) | StickyArm::Baseline(user) => Some(user),
            StickyArm::NotApplicable => None,
        }
    }
}

/// Why a rule cannot be driven as a sticky percentage.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StickyRuleError {
    /// No rule has this name.
    Missing {
        /// The name asked for.
        name: String,
        /// The names of the rules there are.
        known: Vec<String>,
    },
    /// Several rules have this name.
    Ambiguous {
        /// The name.
        name: String,
        /// The indices of the rules that have it.
        indices: Vec<usize>,
    },
    /// The rule is not a sticky-percentage rule.
    NotSticky {
        /// The name.
        name: String,
        /// Why not.
        reason: &'static str,
    },
    /// The percentage is not in `[0, 100]`.
    Percent(f64),
}

impl fmt::Display for StickyRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StickyRuleError::Missing { name, known } if known.is_empty() => {
                write!(f, "no rule is named `{name}` (no rule has a name)")
            }
            StickyRuleError::Missing { name, known } => write!(
                f,
                "no rule is named `{name}` (the named rules: {})",
                known
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            StickyRuleError::Ambiguous { name, indices } => write!(
                f,
                "several rules are named `{name}` (rules{indices:?}): give the driven one a name of its own"
            ),
            StickyRuleError::NotSticky { name, reason } => {
                write!(f, "rule `{name}` is not a sticky-percentage rule: {reason}")
            }
            StickyRuleError::Percent(p) => write!(f, "{p} is not a percentage from 0 to 100"),
        }
    }
}

impl std::error::Error for StickyRuleError {}

/// A sticky-percentage rule of a [`RuleSet`]; see the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct StickyRule<'a> {
    set_enabled: bool,
    rule: &'a Rule,
    /// `all`'s conditions (empty when `when` is the sticky alone), the sticky one at
    /// `sticky_at`.
    all: &'a [Condition],
    sticky_at: Option<usize>,
    key: &'a Key,
    threshold: u32,
    salt: &'a [u8],
}

// === impl StickyRule ===

impl<'a> StickyRule<'a> {
    /// The rule.
    #[must_use]
    pub fn rule(&self) -> &'a Rule {
        self.rule
    }

    /// Its percentage, in `[0, 100]` (with a resolution of 0.01).
    #[must_use]
    pub fn percent(&self) -> f64 {
        f64::from(self.threshold) / 100.0
    }

    /// Where `req` stands: see [`StickyArm`]. No allocation (but for a percent-encoded
    /// query key, decoded as the rule decodes it), no random roll.
    #[must_use]
    pub fn arm(&self, req: &RequestView<'_>) -> StickyArm {
        if !(self.set_enabled && self.rule.is_enabled()) {
            return StickyArm::NotApplicable;
        }
        // No `random` among them (checked when this was made): no dice are rolled.
        let mut dice = None;
        let mut others = self
            .all
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.sticky_at);
        if !others.all(|(_, c)| c.eval(req, &mut dice)) {
            return StickyArm::NotApplicable;
        }
        let Some(user) = self.key.with_bytes(req, |key| keyed_hash(self.salt, key)) else {
            return StickyArm::NotApplicable;
        };
        // The bucket as `sticky_bucket` computes it: the same hash, mod 10000.
        if ((user % u64::from(BUCKETS)) as u32) < self.threshold {
            StickyArm::Gray(user)
        } else {
            StickyArm::Baseline(user)
        }
    }
}

/// Whether `c` holds a `sticky` or `random` condition anywhere.
fn has_sticky_or_random(c: &Condition) -> bool {
    match c {
        Condition::Sticky { .. } | Condition::Random(_) => true,
        Condition::All(list) | Condition::Any(list) => list.iter().any(has_sticky_or_random),
        Condition::Not(c) => has_sticky_or_random(c),
        _ => false,
    }
}

/// The sticky condition of `rule` (its index among `all`'s conditions, if any), or why it
/// has none.
fn sticky_part(rule: &Rule) -> Result<Option<usize>, &'static str> {
    match &rule.outcome {
        Outcome::Fixed(stain) if stain.lane().is_some() || stain.pins().is_some() => {}
        Outcome::Fixed(_) => return Err("its outcome is `baseline`, not a lane"),
        Outcome::Split(_) => return Err("its outcome is a `split`; a percentage needs a lane"),
        Outcome::VersionFrom(_) => {
            return Err("its outcome is `version_from`; a percentage needs a lane");
        }
    }
    match &rule.condition {
        None => Err("it has no `when`: it matches every request"),
        Some(Condition::Sticky { .. }) => Ok(None),
        Some(Condition::All(list)) => {
            let mut sticky = None;
            for (i, c) in list.iter().enumerate() {
                match c {
                    Condition::Sticky { .. } if sticky.is_none() => sticky = Some(i),
                    Condition::Sticky { .. } => {
                        return Err("its `when` has more than one `sticky` condition");
                    }
                    c if has_sticky_or_random(c) => {
                        return Err(
                            "a condition beside its `sticky` holds another `sticky` or a `random`",
                        );
                    }
                    _ => {}
                }
            }
            sticky
                .map(Some)
                .ok_or("its `when` has no `sticky` condition at its top level")
        }
        Some(_) => Err(
            "its `when` is neither a `sticky` condition nor an `all` with one `sticky` among others",
        ),
    }
}

// === impl RuleSet ===

impl RuleSet {
    fn rule_named(&self, name: &str) -> Result<usize, StickyRuleError> {
        let indices: Vec<usize> = self
            .rules
            .iter()
            .filter(|r| r.name() == Some(name))
            .map(Rule::index)
            .collect();
        match indices.as_slice() {
            [i] => Ok(*i),
            [] => Err(StickyRuleError::Missing {
                name: name.to_owned(),
                known: self
                    .rules
                    .iter()
                    .filter_map(|r| r.name().map(str::to_owned))
                    .collect(),
            }),
            _ => Err(StickyRuleError::Ambiguous {
                name: name.to_owned(),
                indices,
            }),
        }
    }

    /// The sticky-percentage rule named `name`, or why there is none; see the
    /// [module docs](crate::sticky).
    pub fn sticky_rule(&self, name: &str) -> Result<StickyRule<'_>, StickyRuleError> {
        self.sticky_rule_at(self.rule_named(name)?)
    }

    /// The rule at `index` as a sticky-percentage rule (for a caller that found it by name
    /// once per version of the set).
    pub fn sticky_rule_at(&self, index: usize) -> Result<StickyRule<'_>, StickyRuleError> {
        let rule = self
            .rules
            .get(index)
            .ok_or_else(|| StickyRuleError::Missing {
                name: format!("rules[{index}]"),
                known: Vec::new(),
            })?;
        let not_sticky = |reason| StickyRuleError::NotSticky {
            name: rule
                .name()
                .map_or_else(|| format!("rules[{index}]"), str::to_owned),
            reason,
        };
        let part = sticky_part(rule).map_err(not_sticky)?;
        let (all, sticky): (&[Condition], &Condition) = match (&rule.condition, part) {
            (Some(Condition::All(list)), Some(i)) => (list, &list[i]),
            (Some(c), _) => (&[], c),
            (None, _) => return Err(not_sticky("it has no `when`")),
        };
        let Condition::Sticky {
            key,
            threshold,
            salt,
        } = sticky
        else {
            return Err(not_sticky("its `when` has no `sticky` condition"));
        };
        Ok(StickyRule {
            set_enabled: self.enabled,
            rule,
            all,
            sticky_at: part,
            key,
            threshold: *threshold,
            salt,
        })
    }

    /// This set with the percentage of the sticky-percentage rule `name` replaced by
    /// `percent` (in `[0, 100]`, rounded to 0.01): what a rollout puts in force.
    pub fn with_sticky_percent(
        &self,
        name: &str,
        percent: f64,
    ) -> Result<RuleSet, StickyRuleError> {
        if !(percent.is_finite() && (0.0..=100.0).contains(&percent)) {
            return Err(StickyRuleError::Percent(percent));
        }
        let index = self.rule_named(name)?;
        self.sticky_rule_at(index)?;
        let mut set = self.clone();
        let threshold_of = |c: &mut Condition| {
            if let Condition::Sticky { threshold, .. } = c {
                // In range, so the product is in [0, 10000].
                *threshold = (percent * 100.0).round() as u32;
            }
        };
        match &mut set.rules[index].condition {
            Some(Condition::All(list)) => list.iter_mut().for_each(threshold_of),
            Some(c) => threshold_of(c),
            None => {}
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, Uri};

    use super::*;
    use crate::{Format, sticky_bucket};

    fn rules(text: &str) -> RuleSet {
        RuleSet::parse(text, Format::Toml, "rules.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    fn view<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> RequestView<'a> {
        RequestView::new(uri, headers)
    }

    fn user(name: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-user", HeaderValue::from_str(name).unwrap());
        h
    }

    const CANARY: &str = r#"
[[rules]]
name = "testers"
when = { header = { name = "x-tester", present = true } }
lane = "gray"

[[rules]]
name = "canary"
when = { all = [{ path = { prefix = "/orders" } }, { sticky = { by = { header = "x-user" }, percent = 25, salt = "s" } }, { not = { header = { name = "x-bot", present = true } } }] }
lane = "gray"
"#;

    #[test]
    fn the_arm_is_the_rules_decision_and_the_user_is_the_sticky_hash() {
        let set = rules(CANARY);
        let canary = set.sticky_rule("canary").unwrap();
        let uri: Uri = "/orders/1".parse().unwrap();
        let (mut gray, mut baseline) = (0, 0);
        for i in 0..4000 {
            let name = format!("user-{i}");
            let headers = user(&name);
            let req = view(&uri, &headers);
            let hash = keyed_hash(b"s", name.as_bytes());
            let fired = set.evaluate(&req).map(|m| m.rule().index());
            match canary.arm(&req) {
                StickyArm::Gray(u) => {
                    gray += 1;
                    assert_eq!(u, hash);
                    assert_eq!(fired, Some(1), "{name}");
                    assert!(sticky_bucket(b"s", name.as_bytes()) < 2500);
                }
                StickyArm::Baseline(u) => {
                    baseline += 1;
                    assert_eq!(u, hash);
                    assert_eq!(fired, None, "{name}");
                }
                StickyArm::NotApplicable => panic!("{name}: the key is there"),
            }
        }
        // 25 % of 4000 = 1000, σ ≈ 27: 4σ
        assert!((890..=1110).contains(&gray), "{gray}");
        assert_eq!(gray + baseline, 4000);
    }

    #[test]
    fn requests_the_percentage_did_not_decide_are_not_applicable() {
        let set = rules(CANARY);
        let canary = set.sticky_rule("canary").unwrap();
        let orders: Uri = "/orders/1".parse().unwrap();
        let stock: Uri = "/stock/1".parse().unwrap();
        // another path; no key; a condition beside the sticky one (after it) fails
        assert_eq!(
            canary.arm(&view(&stock, &user("u"))),
            StickyArm::NotApplicable
        );
        assert_eq!(
            canary.arm(&view(&orders, &HeaderMap::new())),
            StickyArm::NotApplicable
        );
        let mut bot = user("u");
        bot.insert("x-bot", HeaderValue::from_static("1"));
        assert_eq!(canary.arm(&view(&orders, &bot)), StickyArm::NotApplicable);
        // a tester is decided by the rule before: the arm says what the percentage would
        // do, the caller checks which rule decided
        let mut tester = user("u");
        tester.insert("x-tester", HeaderValue::from_static("1"));
        assert!(canary.arm(&view(&orders, &tester)).user().is_some());
        // switched off: the rule, or the whole set
        let off = rules(&CANARY.replace("name = \"canary\"", "name = \"canary\"\nenabled = false"));
        let arm = off
            .sticky_rule("canary")
            .unwrap()
            .arm(&view(&orders, &user("u")));
        assert_eq!(arm, StickyArm::NotApplicable);
        let off = rules(&format!("enabled = false\n{CANARY}"));
        let arm = off
            .sticky_rule("canary")
            .unwrap()
            .arm(&view(&orders, &user("u")));
        assert_eq!(arm, StickyArm::NotApplicable);
    }

    #[test]
    fn a_new_percentage_keeps_every_gray_user_gray() {
        let set = rules(CANARY);
        let uri: Uri = "/orders/1".parse().unwrap();
        let mut before = 0;
        let mut after = 0;
        let grown = set.with_sticky_percent("canary", 60.0).unwrap();
        assert_eq!(grown.sticky_rule("canary").unwrap().percent(), 60.0);
        assert_eq!(set.sticky_rule("canary").unwrap().percent(), 25.0);
        for i in 0..2000 {
            let headers = user(&format!("user-{i}"));
            let req = view(&uri, &headers);
            let was = matches!(
                set.sticky_rule("canary").unwrap().arm(&req),
                StickyArm::Gray(_)
            );
            let is = grown.evaluate(&req).is_some();
            assert!(!was || is, "user-{i} left gray");
            before += usize::from(was);
            after += usize::from(is);
        }
        assert!(after > before + 500, "{before} → {after}");
        let none = set.with_sticky_percent("canary", 0.0).unwrap();
        let headers = user("anyone");
        assert!(none.evaluate(&view(&uri, &headers)).is_none());
        for bad in [-1.0, 100.5, f64::NAN] {
            assert!(matches!(
                set.with_sticky_percent("canary", bad),
                Err(StickyRuleError::Percent(_))
            ));
        }
    }

    #[test]
    fn rules_that_are_not_sticky_percentages_are_refused_with_the_reason() {
        let reason = |when: &str, outcome: &str| {
            let set = rules(&format!("[[rules]]\nname = \"r\"\n{when}\n{outcome}\n"));
            set.sticky_rule("r").unwrap_err().to_string()
        };
        let sticky = "when = { sticky = { by = \"client_ip\", percent = 5 } }";
        for (when, outcome, expected) in [
            ("", "lane = \"gray\"", "no `when`"),
            (
                "when = { header = { name = \"x\", present = true } }",
                "lane = \"gray\"",
                "neither a `sticky`",
            ),
            (sticky, "baseline = true", "`baseline`"),
            (
                sticky,
                "split = [{ weight = 1, lane = \"a\" }, { weight = 1 }]",
                "`split`",
            ),
            (
                "when = { all = [{ sticky = { by = \"client_ip\", percent = 5 } }, { sticky = { by = \"client_ip\", percent = 6 } }] }",
                "lane = \"gray\"",
                "more than one",
            ),
            (
                "when = { sticky = { by = \"client_ip\", percent = 5 }, random = { percent = 50 } }",
                "lane = \"gray\"",
                "a `random`",
            ),
            (
                "when = { any = [{ sticky = { by = \"client_ip\", percent = 5 } }] }",
                "lane = \"gray\"",
                "neither a `sticky`",
            ),
        ] {
            let message = reason(when, outcome);
            assert!(message.contains(expected), "{when} {outcome}: {message}");
            assert!(
                message.starts_with("rule `r` is not a sticky-percentage rule"),
                "{message}"
            );
        }
        let set = rules(&format!(
            "[[rules]]\nname = \"r\"\n{sticky}\nlane = \"gray\"\n"
        ));
        assert!(set.sticky_rule("r").is_ok());
        assert_eq!(
            set.sticky_rule("other").unwrap_err().to_string(),
            "no rule is named `other` (the named rules: `r`)"
        );
        let twice = rules(&format!(
            "[[rules]]\nname = \"r\"\n{sticky}\nlane = \"gray\"\n[[rules]]\nname = \"r\"\n{sticky}\nlane = \"gray\"\n"
        ));
        assert!(matches!(
            twice.sticky_rule("r"),
            Err(StickyRuleError::Ambiguous { indices, .. }) if indices == [0, 1]
        ));
    }
}
