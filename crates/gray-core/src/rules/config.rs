//! The serde form of a rule set, as written in TOML, YAML or JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole rule set as written in a configuration file.
///
/// ```toml
/// enabled = true            # the global switch (seed 001, 003); default true
///
/// [[rules]]
/// name = "testers"
/// lane = "gray"
/// when = { ip = ["192.168.1.100", "10.1.0.0/16"] }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesConfig {
    /// The global switch: when `false` no rule decides anything.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The rules, in priority order: the first that matches decides.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            enabled: true,
            rules: Vec::new(),
        }
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One rule: a condition and what a matching request is stained with.
///
/// The outcome is exactly one of: `lane` and/or version pins (`version`, `services`),
/// a weighted random `split`, a version taken from the request (`version_from`, seed 004),
/// or an explicit `baseline = true`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// A name for errors, logs and [`explain`](super::RuleSet::explain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A disabled rule is skipped. Default `true`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// The condition; without one the rule matches every request (a default rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<ConditionConfig>,
    /// The lane a matching request is put in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// One version pinned for every service (seed 002's `all`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Per-service version pins (seed 002's `custom`); they win over `version`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, String>,
    /// A weighted random split between outcomes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<SplitArmConfig>,
    /// Pins the version named by the request itself (seed 004).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_from: Option<VersionFromConfig>,
    /// The rule explicitly decides baseline (for example: keep bots out of every lane).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
}

/// One arm of a weighted random split. An arm without `lane`, `version` or `services`
/// is baseline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitArmConfig {
    /// The relative weight of this arm (an integer; arms with weight 0 never win).
    pub weight: u32,
    /// The lane of this arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// The version pinned for every service in this arm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Per-service version pins of this arm.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, String>,
}

/// Where [`RuleConfig::version_from`] reads the version (exactly one source).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionFromConfig {
    /// The 0-based path segment holding the version, such as `0` for `/v1/users`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_segment: Option<usize>,
    /// A query parameter holding the version, such as `v` for `?v=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// A header holding the version, such as `x-api-version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A prefix removed from the value (`v` turns `v1` into `1`); values without it do
    /// not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strip_prefix: Option<String>,
    /// The accepted versions. When set, other values do not match, and every accepted
    /// version's context is built once at load time. When empty, any valid version
    /// matches and its context is built per request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known: Vec<String>,
    /// A lane to put the request in as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
}

/// A condition. Every key that is set must hold (an implicit `all`); at least one is
/// required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionConfig {
    /// A request header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<FieldMatchConfig>,
    /// A cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<FieldMatchConfig>,
    /// A query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<FieldMatchConfig>,
    /// The request path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatchConfig>,
    /// The client IP is in one of these CIDRs or addresses (seed 003's whitelist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Vec<String>>,
    /// A sticky percentage of users, by a hash of a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky: Option<StickyConfig>,
    /// A random percentage of requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random: Option<RandomConfig>,
    /// Every condition holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<Vec<ConditionConfig>>,
    /// At least one condition holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub any: Option<Vec<ConditionConfig>>,
    /// The condition does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not: Option<Box<ConditionConfig>>,
}

/// How a header, cookie or query parameter value is matched: exactly one of `exact`,
/// `one_of`, `prefix`, `regex` or `present`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldMatchConfig {
    /// The header, cookie or parameter name.
    pub name: String,
    /// The value equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// The value equals one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// The value starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The value matches this regular expression (unanchored unless it says `^…$`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// `true`: the field is present, whatever its value; `false`: it is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
    /// Compare `exact`, `one_of` and `prefix` ignoring ASCII case (seed 000's `TRUE`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_case: bool,
}

/// How the path is matched: exactly one of `exact`, `prefix`, `segment` or `regex`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathMatchConfig {
    /// The path equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    /// The path starts with this (`/api/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// One `/`-separated segment equals this (`v1` matches `/v1/users` and `/api/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<String>,
    /// The path matches this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// A sticky percentage: users whose key hashes below the threshold are in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StickyConfig {
    /// The key that identifies a user.
    pub by: KeyConfig,
    /// The share of users that match, from 0 to 100, in steps of 0.01.
    pub percent: f64,
    /// Mixed into the hash. Rules with the same key and salt select nested sets of
    /// users; a different salt selects an independent set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub salt: String,
}

/// The key of a sticky percentage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyConfig {
    /// A request header (`by = { header = "x-user-id" }`).
    Header(String),
    /// A cookie (`by = { cookie = "uid" }`).
    Cookie(String),
    /// A query parameter (`by = { query = "uid" }`).
    Query(String),
    /// The client IP (`by = "client_ip"`).
    ClientIp,
}

/// A random percentage of requests (not sticky).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomConfig {
    /// The share of requests that match, from 0 to 100, in steps of 0.01.
    pub percent: f64,
}
