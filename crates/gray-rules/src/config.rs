//! The serde form of a rule set, as written in TOML, YAML or JSON.
//!
//! Every table rejects the keys it does not know, so that a typo is an error with its line
//! and field, never a setting silently ignored.

use std::{collections::BTreeMap, fmt};

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, EnumAccess, IgnoredAny, MapAccess, VariantAccess, Visitor},
};

use super::{Format, RulesError};

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
#[non_exhaustive]
pub struct RulesConfig {
    /// The global switch: when `false` no rule decides anything.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The rules, in priority order: the first that matches decides.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

impl RulesConfig {
    /// Deserializes `text` in `format`; `source` names it in errors (with the line, the
    /// rule and the field). [`RuleSet::parse`](super::RuleSet::parse) also compiles it.
    ///
    /// ```
    /// use gray_rules::{Format, RulesConfig};
    ///
    /// let config = RulesConfig::parse(r#"{"rules":[{"lane":"gray"}]}"#, Format::Json, "inline")?;
    /// assert_eq!(config.rules[0].lane.as_deref(), Some("gray"));
    ///
    /// let err = RulesConfig::parse("{\"rules\": [\n  {\"lane\": \"gray\", \"wehn\": {}}\n]}", Format::Json, "rules.json")
    ///     .unwrap_err();
    /// assert_eq!((err.line(), err.rule_index(), err.field()), (Some(2), Some(0), "wehn"));
    /// assert!(err.to_string().starts_with("rules.json:2:"), "{err}");
    /// # Ok::<(), gray_rules::RulesError>(())
    /// ```
    pub fn parse(text: &str, format: Format, source: &str) -> Result<Self, RulesError> {
        let document = gray_config::Document::new(text, format, source);
        document
            .parse()
            .map_err(|e| RulesError::from_document(e, &document))
    }
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
#[non_exhaustive]
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
    /// A weighted split between outcomes: random per request (a list of arms), or sticky
    /// per user (a table with `by` and `arms`).
    #[serde(default, skip_serializing_if = "SplitConfig::is_empty")]
    pub split: SplitConfig,
    /// Pins the version named by the request itself (seed 004).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_from: Option<VersionFromConfig>,
    /// The rule explicitly decides baseline (for example: keep bots out of every lane).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
}

/// A weighted split, written as a list of arms (a fresh random choice per request) or as
/// a table `{ by, salt?, arms }` (a sticky choice per user, by weighted rendezvous hashing
/// of the `by` key; see [`sticky_split_arm`](crate::sticky_split_arm)). The table needs
/// `by`: a random split is written as a list.
///
/// ```
/// use gray_rules::{Format, KeyConfig, RulesConfig};
///
/// let random = r#"{"rules":[{"split":[{"weight":9},{"weight":1,"lane":"gray"}]}]}"#;
/// let split = &RulesConfig::parse(random, Format::Json, "inline")?.rules[0].split;
/// assert_eq!((split.by.as_ref(), split.arms.len()), (None, 2));
///
/// let sticky = r#"{"rules":[{"split":{"by":{"header":"x-user-id"},"salt":"checkout",
///     "arms":[{"weight":9},{"weight":1,"lane":"gray"}]}}]}"#;
/// let split = &RulesConfig::parse(sticky, Format::Json, "inline")?.rules[0].split;
/// assert_eq!(split.by, Some(KeyConfig::Header("x-user-id".into())));
/// assert_eq!((split.salt.as_str(), split.arms[1].weight), ("checkout", 1));
/// # Ok::<(), gray_rules::RulesError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SplitConfig {
    /// The key that identifies a user (as a sticky condition's `by`); `None`: a random
    /// choice per request.
    pub by: Option<KeyConfig>,
    /// Mixed into the hash of a sticky split: splits with the same key and salt place a
    /// user alike; another salt places users independently.
    pub salt: String,
    /// The arms.
    pub arms: Vec<SplitArmConfig>,
}

impl SplitConfig {
    /// A random split between `arms`.
    #[must_use]
    pub fn random(arms: Vec<SplitArmConfig>) -> Self {
        SplitConfig {
            by: None,
            salt: String::new(),
            arms,
        }
    }

    /// A sticky split between `arms` by the key `by`, without salt.
    #[must_use]
    pub fn sticky(by: KeyConfig, arms: Vec<SplitArmConfig>) -> Self {
        SplitConfig {
            by: Some(by),
            salt: String::new(),
            arms,
        }
    }

    /// `true` when nothing is set: the rule has no split.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by.is_none() && self.salt.is_empty() && self.arms.is_empty()
    }
}

/// The table form of a split, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitTable {
    by: KeyConfig,
    #[serde(default)]
    salt: String,
    #[serde(default)]
    arms: Vec<SplitArmConfig>,
}

// Written by hand: a list of arms, or a table, in every format, with the field of each
// error (`split[1].lnae`, `split.arms[1].lnae`).
impl<'de> Deserialize<'de> for SplitConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SplitVisitor;

        impl<'de> Visitor<'de> for SplitVisitor {
            type Value = SplitConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of arms, or a table with `by`, `salt` and `arms`")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<SplitConfig, A::Error> {
                let arms = Vec::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(SplitConfig::random(arms))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SplitConfig, A::Error> {
                let t = SplitTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(SplitConfig {
                    by: Some(t.by),
                    salt: t.salt,
                    arms: t.arms,
                })
            }
        }

        d.deserialize_any(SplitVisitor)
    }
}

// The form it was read from: a list for a random split, else a table.
impl Serialize for SplitConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if self.by.is_none() && self.salt.is_empty() {
            return self.arms.serialize(s);
        }
        let mut table = s.serialize_struct("SplitConfig", 3)?;
        match &self.by {
            Some(by) => table.serialize_field("by", by)?,
            None => table.skip_field("by")?,
        }
        if !self.salt.is_empty() {
            table.serialize_field("salt", &self.salt)?;
        } else {
            table.skip_field("salt")?;
        }
        table.serialize_field("arms", &self.arms)?;
        table.end()
    }
}

/// One arm of a weighted split. An arm without `lane`, `version` or `services` is
/// baseline: an arm like the others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SplitArmConfig {
    /// The relative weight of this arm (an integer; arms with weight 0 never win).
    pub weight: u32,
    /// What identifies the arm in a sticky split's hash; default: its position (`"0"`,
    /// `"1"`, …). Name the arms to reorder them, or to insert one, without moving users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
#[non_exhaustive]
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
    /// version's stain is built once at load time. When empty, any valid version
    /// matches and its stain is built per request.
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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

impl StickyConfig {
    /// Users whose `by` key hashes below `percent` (from 0 to 100), without salt.
    #[must_use]
    pub fn new(by: KeyConfig, percent: f64) -> Self {
        StickyConfig {
            by,
            percent,
            salt: String::new(),
        }
    }
}

/// The key of a sticky percentage: `"client_ip"`, or a one-key table naming a header, a
/// cookie or a query parameter. YAML also takes the tagged form (`!header x-user-id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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

/// The kinds of [`KeyConfig`], as written.
const KEY_KINDS: &[&str] = &["header", "cookie", "query", "client_ip"];

#[derive(Clone, Copy)]
enum KeyKind {
    Header,
    Cookie,
    Query,
    ClientIp,
}

impl KeyKind {
    fn named<E: de::Error>(name: &str) -> Result<KeyKind, E> {
        Ok(match name {
            "header" => KeyKind::Header,
            "cookie" => KeyKind::Cookie,
            "query" => KeyKind::Query,
            "client_ip" => KeyKind::ClientIp,
            _ => return Err(E::unknown_variant(name, KEY_KINDS)),
        })
    }

    fn with(self, name: String) -> KeyConfig {
        match self {
            KeyKind::Header => KeyConfig::Header(name),
            KeyKind::Cookie => KeyConfig::Cookie(name),
            KeyKind::Query => KeyConfig::Query(name),
            KeyKind::ClientIp => KeyConfig::ClientIp,
        }
    }
}

impl<'de> Deserialize<'de> for KeyKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KindVisitor;

        impl Visitor<'_> for KindVisitor {
            type Value = KeyKind;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`header`, `cookie`, `query` or `client_ip`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyKind, E> {
                KeyKind::named(v)
            }
        }

        d.deserialize_identifier(KindVisitor)
    }
}

// Written by hand: serde_norway reads the derived (externally tagged) form only from YAML
// tags, and `by: { header: x-user-id }` must read the same in every format.
impl<'de> Deserialize<'de> for KeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "`client_ip`, or a table with one of `header`, `cookie` or `query` and its name",
                )
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyConfig, E> {
                match KeyKind::named(v)? {
                    KeyKind::ClientIp => Ok(KeyConfig::ClientIp),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeyConfig, A::Error> {
                let Some(kind) = map.next_key::<KeyKind>()? else {
                    return Err(de::Error::invalid_length(0, &self));
                };
                let key = match kind {
                    KeyKind::ClientIp => {
                        map.next_value::<IgnoredAny>()?;
                        KeyConfig::ClientIp
                    }
                    kind => kind.with(map.next_value()?),
                };
                if map.next_key::<IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(2, &self));
                }
                Ok(key)
            }

            fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<KeyConfig, A::Error> {
                match data.variant::<KeyKind>()? {
                    (KeyKind::ClientIp, variant) => {
                        variant.unit_variant()?;
                        Ok(KeyConfig::ClientIp)
                    }
                    (kind, variant) => Ok(kind.with(variant.newtype_variant()?)),
                }
            }
        }

        d.deserialize_any(KeyVisitor)
    }
}

/// A random percentage of requests (not sticky).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RandomConfig {
    /// The share of requests that match, from 0 to 100, in steps of 0.01.
    pub percent: f64,
}

impl RandomConfig {
    /// `percent` of requests, from 0 to 100.
    #[must_use]
    pub fn new(percent: f64) -> Self {
        RandomConfig { percent }
    }
}
