#![doc = include_str!("../docs/rules.md")]
#![forbid(unsafe_code)]

mod cidr;
mod condition;
mod config;
mod error;
mod hash;
pub mod path;
mod request;
mod split;
pub mod sticky;

use std::{collections::HashMap, sync::Arc};

use http::HeaderName;
use serde::Serialize;

pub use gray_config::Format;

pub use self::{
    cidr::{Cidr, CidrList, InvalidCidr},
    condition::MAX_DEPTH,
    config::{
        ConditionConfig, FieldMatchConfig, KeyConfig, PathMatchConfig, RandomConfig, RuleConfig,
        RulesConfig, SplitArmConfig, SplitConfig, StickyConfig, VersionFromConfig,
    },
    error::{Problem, RulesError},
    hash::{BUCKETS, Dice, sticky_bucket, sticky_split_arm},
    request::{RequestView, canonical_ip, percent_decode},
    sticky::{StickyArm, StickyRule, StickyRuleError},
};
use self::{
    condition::{Condition, header_name},
    error::At,
};
use gray_config::Document;
use gray_core::{Lane, Names, Pins, Stain, Version};

/// A compiled, validated rule set: rules in priority order, first match wins.
///
/// Built once per configuration version; evaluation borrows the request, allocates
/// nothing in the common cases, and a match clones a stain built at load time.
#[derive(Debug, Clone)]
pub struct RuleSet {
    enabled: bool,
    rules: Vec<Rule>,
    source: Arc<str>,
    names: Names,
}

// === impl RuleSet ===

impl Default for RuleSet {
    /// An enabled rule set without rules: nothing matches.
    fn default() -> Self {
        RuleSet {
            enabled: true,
            rules: Vec::new(),
            source: Arc::from("(empty)"),
            names: Names::new(),
        }
    }
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    index: usize,
    name: Option<Arc<str>>,
    enabled: bool,
    condition: Option<Condition>,
    outcome: Outcome,
}

#[derive(Debug, Clone)]
enum Outcome {
    Fixed(Stain),
    Split(split::Split),
    VersionFrom(VersionFrom),
}

#[derive(Debug, Clone)]
struct VersionFrom {
    source: VersionSource,
    strip_prefix: Box<[u8]>,
    lane: Option<Lane>,
    known: HashMap<Box<[u8]>, Stain>,
}

#[derive(Debug, Clone)]
enum VersionSource {
    PathSegment(usize),
    Query(Box<str>),
    Header(HeaderName),
}

// === impl Rule ===

impl Rule {
    /// The rule's 0-based position in the set.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The rule's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The name as a shared string (cheap to clone).
    pub fn shared_name(&self) -> Option<&Arc<str>> {
        self.name.as_ref()
    }

    /// The stain of a rule with a fixed outcome (`lane = …`, `version = …`): `None` for a
    /// split, or a version read from the request.
    pub fn stain(&self) -> Option<&Stain> {
        match &self.outcome {
            Outcome::Fixed(stain) => Some(stain),
            _ => None,
        }
    }

    /// `false` when the rule is switched off in the configuration.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    fn matches(&self, req: &RequestView<'_>, dice: &mut Option<Dice>) -> Option<Stain> {
        if !self.enabled {
            return None;
        }
        if let Some(c) = &self.condition
            && !c.eval(req, dice)
        {
            return None;
        }
        match &self.outcome {
            Outcome::Fixed(stain) => Some(stain.clone()),
            Outcome::Split(split) => split.pick(req, dice),
            Outcome::VersionFrom(v) => v.stain(req),
        }
    }
}

// === impl VersionFrom ===

impl VersionFrom {
    fn stain(&self, req: &RequestView<'_>) -> Option<Stain> {
        let decoded;
        let raw: &[u8] = match &self.source {
            VersionSource::PathSegment(n) => req
                .path()
                .split('/')
                .filter(|s| !s.is_empty())
                .nth(*n)?
                .as_bytes(),
            VersionSource::Query(name) => {
                decoded = req.query_param(name)?;
                &decoded
            }
            VersionSource::Header(name) => req.headers().get(name)?.as_bytes(),
        };
        let value = raw.strip_prefix(&*self.strip_prefix)?;
        if !self.known.is_empty() {
            return self.known.get(value).cloned();
        }
        // Open set: build the stain on the spot (allocates; list `known` to avoid it).
        let version = Version::from_bytes(value).ok()?;
        Some(Stain::pinned(Pins::all(version)).with_lane(self.lane.clone()))
    }
}

/// The rule that decided a request, and the stain it decided.
#[derive(Debug, Clone)]
pub struct RuleMatch<'a> {
    rule: &'a Rule,
    stain: Stain,
}

/// The former name of [`RuleMatch`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `RuleMatch` (one name for one thing); removed in 0.4.0"
)]
pub type Decision<'a> = RuleMatch<'a>;

// === impl RuleMatch ===

impl<'a> RuleMatch<'a> {
    /// The rule that fired.
    #[must_use]
    pub fn rule(&self) -> &'a Rule {
        self.rule
    }

    /// The decided stain (baseline for a `baseline = true` rule or a baseline split arm).
    #[must_use]
    pub fn stain(&self) -> &Stain {
        &self.stain
    }

    /// The decided stain, by value.
    #[must_use]
    pub fn into_stain(self) -> Stain {
        self.stain
    }
}

/// Why a request got the stain it got: for admin endpoints and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Explanation {
    /// The source the rule set was loaded from.
    pub source: String,
    /// The global switch.
    pub enabled: bool,
    /// The rules checked, in order, up to and including the one that fired.
    pub checked: Vec<RuleCheck>,
    /// The index of the rule that fired, if any.
    pub fired: Option<usize>,
    /// The decided lane (`None`: baseline or no decision).
    pub lane: Option<String>,
    /// The decided `all` version pin.
    pub version: Option<String>,
    /// The decided per-service version pins.
    pub services: std::collections::BTreeMap<String, String>,
}

/// One rule checked by [`RuleSet::explain`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RuleCheck {
    /// The rule's index.
    pub index: usize,
    /// The rule's name.
    pub name: Option<String>,
    /// `false` when the rule is switched off and was skipped.
    pub enabled: bool,
    /// `true` when it matched (and so fired).
    pub matched: bool,
}

impl RuleSet {
    /// Parses and compiles `text` in `format`. `source` names it in errors (a file path,
    /// an etcd key).
    ///
    /// Every error names the source, the rule, the field and, as the format reports it,
    /// the line and column: a key no table knows, a value of the wrong type, or one that
    /// does not compile (a regular expression, a CIDR block).
    pub fn parse(text: &str, format: Format, source: &str) -> Result<Self, RulesError> {
        let document = Document::new(text, format, source);
        let config: RulesConfig = document
            .parse()
            .map_err(|e| RulesError::from_document(e, &document))?;
        Self::compile_shared(&config, Arc::from(source)).map_err(|e| e.locate(&document))
    }

    /// Compiles a configuration that is already deserialized.
    pub fn compile(config: &RulesConfig, source: &str) -> Result<Self, RulesError> {
        Self::compile_shared(config, Arc::from(source))
    }

    fn compile_shared(config: &RulesConfig, source: Arc<str>) -> Result<Self, RulesError> {
        let mut names = Names::new();
        let mut rules = Vec::with_capacity(config.rules.len());
        for (index, rc) in config.rules.iter().enumerate() {
            let at = At {
                source_name: &source,
                rule: Some((index, rc.name.as_deref())),
            };
            rules.push(compile_rule(&at, index, rc, &mut names)?);
        }
        Ok(RuleSet {
            enabled: config.enabled,
            rules,
            source,
            names,
        })
    }

    /// `false` when the global switch is off: nothing is decided.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The rules, in priority order.
    #[must_use]
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The source the set was loaded from.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every lane and version the rules decide, interned: give it to
    /// [`Carriers::with_names`](gray_core::Carriers::with_names) so decoding them allocates nothing.
    #[must_use]
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Whether an enabled rule reads the client IP: an `ip` condition, or a `sticky` one
    /// keyed by the client IP, anywhere in its condition. An edge that cannot tell the
    /// client IP says so when this is true.
    ///
    /// ```
    /// use gray_rules::{Format, RuleSet};
    ///
    /// let by_ip = r#"{"rules":[{"when":{"not":{"ip":["10.0.0.0/8"]}},"lane":"gray"}]}"#;
    /// let by_header = r#"{"rules":[{"when":{"header":{"name":"x-beta","present":true}},"lane":"gray"}]}"#;
    /// let sticky = r#"{"rules":[{"when":{"sticky":{"by":"client_ip","percent":10}},"lane":"gray"}]}"#;
    /// let read = |text| RuleSet::parse(text, Format::Json, "inline").unwrap().reads_client_ip();
    /// assert!(read(by_ip));
    /// assert!(!read(by_header));
    /// assert!(read(sticky));
    /// ```
    #[must_use]
    pub fn reads_client_ip(&self) -> bool {
        self.enabled
            && self.rules.iter().any(|rule| {
                rule.enabled
                    && rule
                        .condition
                        .as_ref()
                        .is_some_and(Condition::reads_client_ip)
            })
    }

    /// The first rule that matches `req`, and its stain. `None` when the set is switched
    /// off or no rule matches. Random conditions and splits use a per-thread generator.
    #[must_use]
    pub fn evaluate(&self, req: &RequestView<'_>) -> Option<RuleMatch<'_>> {
        let mut dice = None;
        self.evaluate_inner(req, &mut dice)
    }

    /// Like [`RuleSet::evaluate`], drawing random rolls from `dice` (deterministic tests).
    pub fn evaluate_with(&self, req: &RequestView<'_>, dice: &mut Dice) -> Option<RuleMatch<'_>> {
        let mut slot = Some(dice.clone());
        let out = self.evaluate_inner(req, &mut slot);
        if let Some(d) = slot {
            *dice = d;
        }
        out
    }

    fn evaluate_inner(
        &self,
        req: &RequestView<'_>,
        dice: &mut Option<Dice>,
    ) -> Option<RuleMatch<'_>> {
        if !self.enabled {
            return None;
        }
        self.rules.iter().find_map(|rule| {
            rule.matches(req, dice)
                .map(|stain| RuleMatch { rule, stain })
        })
    }

    /// Evaluates `req` and says which rules were checked and which one fired.
    ///
    /// Random conditions roll again, so for them the explanation is one possible outcome.
    pub fn explain(&self, req: &RequestView<'_>) -> Explanation {
        let mut out = Explanation {
            source: self.source.to_string(),
            enabled: self.enabled,
            checked: Vec::new(),
            fired: None,
            lane: None,
            version: None,
            services: Default::default(),
        };
        if !self.enabled {
            return out;
        }
        let mut dice = None;
        for rule in &self.rules {
            let stain = rule.matches(req, &mut dice);
            out.checked.push(RuleCheck {
                index: rule.index,
                name: rule.name().map(str::to_owned),
                enabled: rule.enabled,
                matched: stain.is_some(),
            });
            if let Some(stain) = stain {
                out.fired = Some(rule.index);
                out.lane = stain.lane().map(|l| l.to_string());
                if let Some(pins) = stain.pins() {
                    out.version = pins.all_version().map(|v| v.to_string());
                    out.services = pins
                        .services()
                        .map(|(s, v)| (s.to_owned(), v.to_string()))
                        .collect();
                }
                break;
            }
        }
        out
    }
}

fn lane(at: &At<'_>, field: &str, s: &str, names: &mut Names) -> Result<Lane, RulesError> {
    let lane = Lane::new(s).map_err(|e| {
        at.expected(
            field,
            "a lane name (ASCII letters, digits, '.', '_', '-'; at most 64 bytes)",
            Some(format!("{s:?}: {e}")),
        )
    })?;
    names.insert_lane(lane.clone());
    Ok(lane)
}

fn version(at: &At<'_>, field: &str, s: &str, names: &mut Names) -> Result<Version, RulesError> {
    let v = Version::new(s).map_err(|e| {
        at.expected(
            field,
            "a version name (ASCII letters, digits, '.', '_', '-'; at most 64 bytes)",
            Some(format!("{s:?}: {e}")),
        )
    })?;
    names.insert_version(v.clone());
    Ok(v)
}

fn fixed_stain(
    at: &At<'_>,
    prefix: &str,
    lane_name: Option<&str>,
    all: Option<&str>,
    services: &std::collections::BTreeMap<String, String>,
    names: &mut Names,
) -> Result<Stain, RulesError> {
    let lane = lane_name
        .map(|l| lane(at, &format!("{prefix}lane"), l, names))
        .transpose()?;
    let all = all
        .map(|v| version(at, &format!("{prefix}version"), v, names))
        .transpose()?;
    let mut pinned = Vec::with_capacity(services.len());
    for (svc, v) in services {
        let field = format!("{prefix}services.{svc}");
        pinned.push((svc.as_str(), version(at, &field, v, names)?));
    }
    let pins = Pins::new(all, pinned).map_err(|e| {
        at.expected(
            format!("{prefix}services"),
            "service names that are non-empty, at most 128 bytes, without control characters",
            Some(e.to_string()),
        )
    })?;
    Ok(Stain::baseline().with_lane(lane).with_pins(pins))
}

fn compile_rule(
    at: &At<'_>,
    index: usize,
    rc: &RuleConfig,
    names: &mut Names,
) -> Result<Rule, RulesError> {
    let condition = rc
        .when
        .as_ref()
        .map(|c| condition::compile(at, "when", c, 0))
        .transpose()?;
    let fixed = rc.lane.is_some() || rc.version.is_some() || !rc.services.is_empty();
    let kinds = [
        fixed,
        !rc.split.is_empty(),
        rc.version_from.is_some(),
        rc.baseline,
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if kinds != 1 {
        return Err(at.expected(
            "",
            "exactly one outcome: `lane` / `version` / `services`, `split`, `version_from`, or `baseline = true`",
            Some(if kinds == 0 { "none".into() } else { format!("{kinds} of them") }),
        ));
    }
    let outcome = if rc.baseline {
        Outcome::Fixed(Stain::baseline())
    } else if fixed {
        Outcome::Fixed(fixed_stain(
            at,
            "",
            rc.lane.as_deref(),
            rc.version.as_deref(),
            &rc.services,
            names,
        )?)
    } else if !rc.split.is_empty() {
        Outcome::Split(split::compile(at, &rc.split, names)?)
    } else {
        let vf = rc
            .version_from
            .as_ref()
            .ok_or_else(|| at.expected("version_from", "a version source", None))?;
        Outcome::VersionFrom(compile_version_from(at, vf, names)?)
    };
    Ok(Rule {
        index,
        name: rc.name.as_deref().map(Arc::from),
        enabled: rc.enabled,
        condition,
        outcome,
    })
}

fn compile_version_from(
    at: &At<'_>,
    vf: &VersionFromConfig,
    names: &mut Names,
) -> Result<VersionFrom, RulesError> {
    at.exactly_one(
        "version_from",
        &[
            ("path_segment", vf.path_segment.is_some()),
            ("query", vf.query.is_some()),
            ("header", vf.header.is_some()),
        ],
    )?;
    let source = if let Some(n) = vf.path_segment {
        VersionSource::PathSegment(n)
    } else if let Some(q) = &vf.query {
        condition::non_empty(at, "version_from.query", q, "a query parameter name")?;
        VersionSource::Query(q.as_str().into())
    } else {
        let h = vf.header.as_deref().unwrap_or_default();
        VersionSource::Header(header_name(at, "version_from.header", h)?)
    };
    let lane = vf
        .lane
        .as_deref()
        .map(|l| lane(at, "version_from.lane", l, names))
        .transpose()?;
    let mut known = HashMap::with_capacity(vf.known.len());
    for (i, k) in vf.known.iter().enumerate() {
        let v = version(at, &format!("version_from.known[{i}]"), k, names)?;
        let stain = Stain::pinned(Pins::all(v)).with_lane(lane.clone());
        known.insert(Box::<[u8]>::from(k.as_bytes()), stain);
    }
    Ok(VersionFrom {
        source,
        strip_prefix: vf.strip_prefix.as_deref().unwrap_or("").as_bytes().into(),
        lane,
        known,
    })
}

#[cfg(test)]
mod tests;
