//! Percentages set from outside on sticky-percentage rules (a rollout's weight), applied to
//! every version of the rules, including the versions loaded later.
//!
//! An override applies a weight; it decides none. In the gateway, the rollout's controller
//! is its one writer (`weight_in_force` in
//! `gray-gateway/src/rollout/controller/in_force.rs`, from the state machine's weight),
//! and the sticky rule reads the percentage per request (`gray_rules::sticky`). Whoever
//! else calls [`LiveRules::override_percent`] on a rule a rollout drives overrides the
//! rollout until its next transition.

use std::collections::BTreeMap;

use gray_rules::{RuleSet, StickyRuleError};
use serde::Serialize;

use super::LiveRules;

/// The percentage of a sticky-percentage rule set from outside with
/// [`LiveRules::override_percent`]: it wins over the percentage the rules' source gives,
/// in every version put in force, until [`LiveRules::clear_override`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct PercentOverride {
    /// The rule's name.
    pub rule: String,
    /// The percentage in force.
    pub percent: f64,
    /// The percentage the source's version in force gives the rule (`None` when that
    /// version has no such sticky-percentage rule).
    pub source_percent: Option<f64>,
    /// Whether the version in force has the rule, so that the override applies.
    pub applied: bool,
    /// Why it does not apply, when it does not.
    pub problem: Option<String>,
}

/// The writer's side of [`LiveRules`]: the overrides, and the rules as their source last
/// gave them (kept only while an override is set, to put them in force again with other
/// percentages).
#[derive(Debug, Default)]
pub(super) struct Writer {
    overrides: BTreeMap<String, PercentOverride>,
    loaded: Option<RuleSet>,
}

// === impl Writer ===

impl Writer {
    /// The version to put in force for `rules`, a new version from the source: `rules`
    /// themselves without overrides, else with every override applied (and logged when
    /// the new version changes what the source says).
    pub(super) fn loaded(&mut self, rules: RuleSet) -> RuleSet {
        if self.overrides.is_empty() {
            self.loaded = None;
            return rules;
        }
        let effective = self.effective(&rules, true);
        self.loaded = Some(rules);
        effective
    }

    /// `loaded` with every override applied. `reloaded`: `loaded` is a new version from
    /// the source, whose differences are logged.
    fn effective(&mut self, loaded: &RuleSet, reloaded: bool) -> RuleSet {
        let mut rules = loaded.clone();
        for o in self.overrides.values_mut() {
            let source = loaded.sticky_rule(&o.rule).map(|s| s.percent());
            let applied = source.and_then(|p| {
                rules
                    .with_sticky_percent(&o.rule, o.percent)
                    .map(|r| (p, r))
            });
            match applied {
                Ok((source, with)) => {
                    if reloaded && o.source_percent != Some(source) {
                        tracing::info!(
                            target: "gray::rules",
                            rule = %o.rule,
                            source_percent = source,
                            percent = o.percent,
                            "a new version of the rules sets this rule's percentage; the override stays in force",
                        );
                    }
                    if !o.applied {
                        tracing::info!(
                            target: "gray::rules",
                            rule = %o.rule,
                            percent = o.percent,
                            "the rules have this sticky-percentage rule again: the override applies",
                        );
                    }
                    rules = with;
                    o.source_percent = Some(source);
                    o.applied = true;
                    o.problem = None;
                }
                Err(e) => {
                    if o.applied {
                        tracing::warn!(
                            target: "gray::rules",
                            rule = %o.rule,
                            percent = o.percent,
                            error = %e,
                            "the rules in force no longer have this sticky-percentage rule: its override cannot apply until they do",
                        );
                    }
                    o.source_percent = None;
                    o.applied = false;
                    o.problem = Some(e.to_string());
                }
            }
        }
        rules
    }
}

// === impl LiveRules ===

impl LiveRules {
    /// Sets the percentage of the sticky-percentage rule `rule` (see
    /// [`gray_rules::sticky`]) to `percent` in the version in force and in every version
    /// put in force later (a file or etcd reload, [`replace`](Self::replace),
    /// [`apply`](Self::apply)), until [`clear_override`](Self::clear_override). Returns the
    /// generation in force. A reload that changes the source's percentage for the rule is
    /// logged at INFO (target `gray::rules`) and does not change the percentage in force;
    /// one whose rules no longer have the rule is logged at WARN, and the override applies
    /// again once a version has it.
    ///
    /// Fails, and sets nothing, when the rules in force have no such rule or `percent` is
    /// not in `[0, 100]`.
    ///
    /// ```
    /// use gray_rules::{Format, RuleSet};
    /// use gray_tower::edge::{LiveRules, Revision};
    ///
    /// let rules = |percent: u32| {
    ///     format!(r#"{{"rules":[{{"name":"canary","when":{{"sticky":{{"by":{{"header":"x-user"}},"percent":{percent}}}}},"lane":"gray"}}]}}"#)
    /// };
    /// let live = LiveRules::new(RuleSet::parse(&rules(0), Format::Json, "v1").unwrap());
    /// live.override_percent("canary", 5.0).unwrap();
    /// let percent = |live: &LiveRules| live.load().rules().sticky_rule("canary").unwrap().percent();
    /// assert_eq!(percent(&live), 5.0);
    ///
    /// // a reload that says 50 % does not undo it; both values are known
    /// live.apply(&rules(50), Format::Json, "v2", Revision::Manual(2)).unwrap();
    /// assert_eq!(percent(&live), 5.0);
    /// let o = live.percent_override("canary").unwrap();
    /// assert_eq!((o.percent, o.source_percent, o.applied), (5.0, Some(50.0), true));
    ///
    /// // cleared: the source's percentage again
    /// live.clear_override("canary");
    /// assert_eq!(percent(&live), 50.0);
    /// assert!(live.override_percent("no-such-rule", 5.0).is_err());
    /// ```
    pub fn override_percent(&self, rule: &str, percent: f64) -> Result<u64, StickyRuleError> {
        if !(percent.is_finite() && (0.0..=100.0).contains(&percent)) {
            return Err(StickyRuleError::Percent(percent));
        }
        let mut writer = self.writer();
        if let Some(o) = writer.overrides.get(rule)
            && o.applied
            && o.percent == percent
        {
            return Ok(self.load().generation());
        }
        let current = self.snapshot();
        let loaded = match writer.loaded.take() {
            Some(loaded) => loaded,
            None => current.rules().clone(),
        };
        let source = match loaded.sticky_rule(rule) {
            Ok(sticky) => sticky.percent(),
            Err(e) => {
                writer.loaded = (!writer.overrides.is_empty()).then_some(loaded);
                return Err(e);
            }
        };
        writer.overrides.insert(
            rule.to_owned(),
            PercentOverride {
                rule: rule.to_owned(),
                percent,
                source_percent: Some(source),
                applied: true,
                problem: None,
            },
        );
        let effective = writer.effective(&loaded, false);
        writer.loaded = Some(loaded);
        tracing::info!(
            target: "gray::rules",
            rule,
            percent,
            source_percent = source,
            "sticky percentage overridden",
        );
        Ok(self.store(
            &writer,
            effective,
            current.revision().clone(),
            current.content,
        ))
    }

    /// Removes the override of `rule`: the source's percentage is in force again. Returns
    /// the new generation, or `None` when `rule` had no override.
    pub fn clear_override(&self, rule: &str) -> Option<u64> {
        let mut writer = self.writer();
        writer.overrides.remove(rule)?;
        let current = self.snapshot();
        let loaded = match writer.loaded.take() {
            Some(loaded) => loaded,
            None => current.rules().clone(),
        };
        let effective = if writer.overrides.is_empty() {
            loaded
        } else {
            let effective = writer.effective(&loaded, false);
            writer.loaded = Some(loaded);
            effective
        };
        tracing::info!(target: "gray::rules", rule, "sticky percentage override cleared");
        Some(self.store(
            &writer,
            effective,
            current.revision().clone(),
            current.content,
        ))
    }

    /// The override of `rule`, if any, with the source's percentage beside it.
    #[must_use]
    pub fn percent_override(&self, rule: &str) -> Option<PercentOverride> {
        self.writer().overrides.get(rule).cloned()
    }

    /// Every override, by rule name.
    #[must_use]
    pub fn overrides(&self) -> Vec<PercentOverride> {
        self.writer().overrides.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gray_rules::Format;

    use super::*;
    use crate::edge::Revision;

    fn canary(percent: u32, extra: &str) -> String {
        format!(
            r#"{{"rules":[{extra}{{"name":"canary","when":{{"sticky":{{"by":{{"header":"x-user"}},"percent":{percent}}}}},"lane":"gray"}}]}}"#
        )
    }

    fn percent(live: &LiveRules) -> Option<f64> {
        let rules = live.load();
        rules
            .rules()
            .sticky_rule("canary")
            .ok()
            .map(|s| s.percent())
    }

    #[test]
    fn an_override_survives_every_kind_of_reload() {
        let live = LiveRules::new(RuleSet::parse(&canary(1, ""), Format::Json, "v1").unwrap());
        let g = live.override_percent("canary", 25.0).unwrap();
        assert_eq!(live.load().generation(), g);
        assert_eq!(percent(&live), Some(25.0));
        // the same percentage again: nothing new in force
        assert_eq!(live.override_percent("canary", 25.0).unwrap(), g);

        // apply, replace: the override wins, the source's value is recorded
        let tester = r#"{"name":"testers","when":{"header":{"name":"x-tester","present":true}},"lane":"gray"},"#;
        live.apply(&canary(80, tester), Format::Json, "v2", Revision::Manual(2))
            .unwrap();
        assert_eq!(percent(&live), Some(25.0));
        // the rest of the new version is in force
        assert_eq!(live.load().rules().rules().len(), 2);
        let o = live.percent_override("canary").unwrap();
        assert_eq!((o.source_percent, o.applied), (Some(80.0), true));
        let _ = live.replace(
            RuleSet::parse(&canary(3, ""), Format::Json, "v3").unwrap(),
            Revision::Manual(3),
        );
        assert_eq!(percent(&live), Some(25.0));
        assert_eq!(
            live.percent_override("canary").unwrap().source_percent,
            Some(3.0)
        );

        // a version without the rule: in force as it is, the override waits for the rule
        live.apply(r#"{"rules":[]}"#, Format::Json, "v4", Revision::Manual(4))
            .unwrap();
        assert_eq!(percent(&live), None);
        let o = live.percent_override("canary").unwrap();
        assert!(!o.applied && o.source_percent.is_none(), "{o:?}");
        assert!(o.problem.unwrap().contains("no rule is named `canary`"));
        live.apply(&canary(0, ""), Format::Json, "v5", Revision::Manual(5))
            .unwrap();
        assert_eq!(percent(&live), Some(25.0));
        assert!(live.percent_override("canary").unwrap().applied);

        // moved by its owner, then cleared: the source's percentage again
        live.override_percent("canary", 50.0).unwrap();
        assert_eq!(percent(&live), Some(50.0));
        assert_eq!(live.overrides().len(), 1);
        assert!(live.clear_override("canary").is_some());
        assert_eq!(percent(&live), Some(0.0));
        assert!(live.clear_override("canary").is_none());
        assert!(live.overrides().is_empty());
        // the revision of an overridden version is its source's
        assert_eq!(live.status().revision, Revision::Manual(5));
    }

    #[test]
    fn an_override_of_a_rule_that_is_not_there_sets_nothing() {
        let live = LiveRules::new(RuleSet::parse(&canary(1, ""), Format::Json, "v1").unwrap());
        let generation = live.status().generation;
        assert!(live.override_percent("nope", 5.0).is_err());
        assert!(matches!(
            live.override_percent("canary", 101.0),
            Err(StickyRuleError::Percent(_))
        ));
        assert!(live.overrides().is_empty());
        assert_eq!(live.status().generation, generation);
        assert_eq!(percent(&live), Some(1.0));
    }

    #[cfg(feature = "file")]
    #[tokio::test]
    async fn an_override_survives_a_file_reload() {
        use gray_source::file::FileSource;

        let path = std::env::temp_dir().join(format!(
            "gray-override-{}-{}.json",
            std::process::id(),
            line!()
        ));
        std::fs::write(&path, canary(1, "")).unwrap();
        let source = FileSource::new(&path)
            .with_interval(Duration::from_millis(10))
            .with_settle(Duration::from_millis(10));
        let live = LiveRules::from_source(&source, None).await.unwrap();
        let _watch = live.follow(&source, None);
        live.override_percent("canary", 10.0).unwrap();
        let mut status = live.subscribe();
        let before = status.borrow_and_update().generation;

        std::fs::write(&path, canary(90, "")).unwrap();
        tokio::time::timeout(
            Duration::from_secs(20),
            status.wait_for(|s| s.generation > before),
        )
        .await
        .expect("the new version within 20 s")
        .unwrap();
        assert_eq!(percent(&live), Some(10.0));
        let o = live.percent_override("canary").unwrap();
        assert_eq!(o.source_percent, Some(90.0));
        let _ = std::fs::remove_file(&path);
    }
}
