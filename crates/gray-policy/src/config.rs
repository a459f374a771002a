//! [`PolicyConfig`]: a policy as a configuration file writes it, checked as it is read.

use std::fmt;

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, DeserializeSeed, MapAccess, Unexpected, Visitor},
};

use super::{
    error::PolicyError,
    policy::{Fallback, FlagValues, OnUnready, Policy, Unlabelled},
    presets::{EXPECTED_PRESET, PRESETS},
};
use gray_core::Lane;

/// The serde form of a [`Policy`]: what a configuration file writes.
///
/// Every key is optional: a missing one keeps the value of the `preset` (or of
/// [`Policy::new`]). Unknown keys are rejected, and every value is checked as it is read,
/// so that gray-config's loader reports a mistake with its line and field.
///
/// | key | default | meaning |
/// |---|---|---|
/// | `preset` | none | start from `seed-000` … `seed-004` ([`Policy::preset`]); the keys below override it |
/// | `name` | the preset's, else `default` | quoted by errors and decisions |
/// | `fallback` | `none` | `none`, `baseline` or `any` ([`Fallback`]) |
/// | `unlabelled` | `baseline` | `baseline` or `wildcard` ([`Unlabelled`]) |
/// | `on_unready` | `fail` | `fail` or `fallback` ([`OnUnready`]) |
/// | `lane_key` | `lane` | the label naming an instance's lane |
/// | `flag_key` | `gray` | the boolean label putting an instance in the flag lane |
/// | `flag_lane` | `gray` | that lane |
/// | `flag_values` | `lenient` | `lenient` (`TRUE`, `True` count) or `exact` ([`FlagValues`]) |
/// | `version_key` | `version` | the label naming the one version an instance serves |
/// | `versions_key` | `versions` | the label listing them, comma-separated |
/// | `own_lane` | none | the calling instance's own lane, for requests without a stain |
/// | `enabled` | `true` | `false`: every request is routed as unstained |
///
/// A label key set to `false` (or `null` in JSON and YAML) is switched off: `lane_key =
/// false` ignores lane labels. `own_lane` takes `false` / `null` for "none" as well.
///
/// ```
/// use gray_policy::{Fallback, Policy};
///
/// let policy: Policy = serde_json::from_str(
///     r#"{"preset": "seed-000", "own_lane": "gray", "fallback": "any"}"#,
/// )?;
/// assert_eq!(policy.name(), "seed-000");
/// assert_eq!(policy.fallback(), Fallback::Any);
/// assert_eq!(policy.own_lane().unwrap(), "gray");
///
/// let err = serde_json::from_str::<Policy>(r#"{"fallback": "sometimes"}"#).unwrap_err();
/// assert!(err.to_string().starts_with("unknown variant `sometimes`, expected one of `none`, `baseline`, `any`"), "{err}");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The policy's name (default: the preset's, else `default`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Start from this preset: `seed-000` … `seed-004`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// The lane label; `Some(None)` ignores lane labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane_key: Option<Option<String>>,
    /// The boolean flag label; `Some(None)` ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag_key: Option<Option<String>>,
    /// The lane the flag puts an instance in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag_lane: Option<String>,
    /// How the flag is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag_values: Option<FlagValues>,
    /// The one-version label; `Some(None)` ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_key: Option<Option<String>>,
    /// The version-list label; `Some(None)` ignores it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions_key: Option<Option<String>>,
    /// What an unlabelled instance means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unlabelled: Option<Unlabelled>,
    /// Where a request goes when its primary subset has no available instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// What a subset with instances, none ready, means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_unready: Option<OnUnready>,
    /// The calling instance's own lane, for requests without a stain; `Some(None)`: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_lane: Option<Option<String>>,
    /// Whether gray routing is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// The keys of [`PolicyConfig`], in [`PolicyConfig::FIELDS`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Name,
    Preset,
    LaneKey,
    FlagKey,
    FlagLane,
    FlagValues,
    VersionKey,
    VersionsKey,
    Unlabelled,
    Fallback,
    OnUnready,
    OwnLane,
    Enabled,
}

const ALL_FIELDS: [Field; 13] = [
    Field::Name,
    Field::Preset,
    Field::LaneKey,
    Field::FlagKey,
    Field::FlagLane,
    Field::FlagValues,
    Field::VersionKey,
    Field::VersionsKey,
    Field::Unlabelled,
    Field::Fallback,
    Field::OnUnready,
    Field::OwnLane,
    Field::Enabled,
];

// === impl Field ===

impl Field {
    fn named(key: &str) -> Option<Field> {
        let i = PolicyConfig::FIELDS.iter().position(|f| *f == key)?;
        ALL_FIELDS.get(i).copied()
    }

    fn name(self) -> &'static str {
        PolicyConfig::FIELDS[self as usize]
    }
}

const LABEL_KEY: &str = "a label key of 1 to 256 printable characters, or false to switch it off";
const LANE: &str = "a lane name (ASCII letters, digits, '.', '_', '-', at most 64 bytes)";
const OWN_LANE: &str =
    "a lane name (ASCII letters, digits, '.', '_', '-', at most 64 bytes), or false for none";

fn check_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(PolicyError::new(
            "name",
            "a name of 1 to 128 printable characters",
            name,
        ));
    }
    Ok(())
}

fn check_preset(name: &str) -> Result<(), PolicyError> {
    if !PRESETS.contains(&name) {
        return Err(PolicyError::new("preset", EXPECTED_PRESET, name));
    }
    Ok(())
}

fn check_label_key(field: &'static str, key: &str) -> Result<(), PolicyError> {
    if key.is_empty() || key.len() > 256 || key.chars().any(char::is_control) {
        return Err(PolicyError::new(field, LABEL_KEY, key));
    }
    Ok(())
}

fn check_lane(
    field: &'static str,
    expected: &'static str,
    lane: &str,
) -> Result<Lane, PolicyError> {
    Lane::new(lane).map_err(|_| PolicyError::new(field, expected, lane))
}

// === impl PolicyConfig ===

impl PolicyConfig {
    /// The keys of a policy table, as a configuration file writes them.
    ///
    /// [`WithPolicy`](super::WithPolicy) reads these into its policy; a program that checks a table's keys
    /// itself allows them next to its own.
    pub const FIELDS: &'static [&'static str] = &[
        "name",
        "preset",
        "lane_key",
        "flag_key",
        "flag_lane",
        "flag_values",
        "version_key",
        "versions_key",
        "unlabelled",
        "fallback",
        "on_unready",
        "own_lane",
        "enabled",
    ];

    /// Whether `field` was read already (a key given twice is refused where it is read).
    fn has(&self, field: Field) -> bool {
        match field {
            Field::Name => self.name.is_some(),
            Field::Preset => self.preset.is_some(),
            Field::LaneKey => self.lane_key.is_some(),
            Field::FlagKey => self.flag_key.is_some(),
            Field::FlagLane => self.flag_lane.is_some(),
            Field::FlagValues => self.flag_values.is_some(),
            Field::VersionKey => self.version_key.is_some(),
            Field::VersionsKey => self.versions_key.is_some(),
            Field::Unlabelled => self.unlabelled.is_some(),
            Field::Fallback => self.fallback.is_some(),
            Field::OnUnready => self.on_unready.is_some(),
            Field::OwnLane => self.own_lane.is_some(),
            Field::Enabled => self.enabled.is_some(),
        }
    }

    /// The field named `key`, checked against those read already; called where the
    /// format reads the key, so that the error carries its position.
    pub(super) fn field<E: de::Error>(&self, key: &str) -> Result<Option<Field>, E> {
        match Field::named(key) {
            Some(field) if self.has(field) => Err(E::duplicate_field(field.name())),
            field => Ok(field),
        }
    }

    /// Reads the value of `field` from `map`, checked, into `self`.
    pub(super) fn set<'de, A: MapAccess<'de>>(
        &mut self,
        field: Field,
        map: &mut A,
    ) -> Result<(), A::Error> {
        let key = |name: &'static str| Text {
            expecting: LABEL_KEY,
            check: move |k: &str| check_label_key(name, k),
            optional: true,
        };
        match field {
            Field::Name => {
                let seed = Text::required("a policy name", check_name);
                self.name = map.next_value_seed(seed)?;
            }
            Field::Preset => {
                let seed = Text::required(EXPECTED_PRESET, check_preset);
                self.preset = map.next_value_seed(seed)?;
            }
            Field::LaneKey => self.lane_key = Some(map.next_value_seed(key("lane_key"))?),
            Field::FlagKey => self.flag_key = Some(map.next_value_seed(key("flag_key"))?),
            Field::VersionKey => {
                let value = map.next_value_seed(key("version_key"))?;
                self.version_key = Some(value);
            }
            Field::VersionsKey => {
                let value = map.next_value_seed(key("versions_key"))?;
                self.versions_key = Some(value);
            }
            Field::FlagLane => {
                let seed =
                    Text::required(LANE, |l: &str| check_lane("flag_lane", LANE, l).map(drop));
                self.flag_lane = map.next_value_seed(seed)?;
            }
            Field::OwnLane => {
                let seed = Text {
                    expecting: OWN_LANE,
                    check: |l: &str| check_lane("own_lane", OWN_LANE, l).map(drop),
                    optional: true,
                };
                self.own_lane = Some(map.next_value_seed(seed)?);
            }
            Field::FlagValues => self.flag_values = Some(map.next_value()?),
            Field::Unlabelled => self.unlabelled = Some(map.next_value()?),
            Field::Fallback => self.fallback = Some(map.next_value()?),
            Field::OnUnready => self.on_unready = Some(map.next_value()?),
            Field::Enabled => self.enabled = Some(map.next_value()?),
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for PolicyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ConfigVisitor;

        impl<'de> Visitor<'de> for ConfigVisitor {
            type Value = PolicyConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a matching policy table")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PolicyConfig, A::Error> {
                let mut config = PolicyConfig::default();
                while let Some(field) = map.next_key_seed(FieldSeed(&config))? {
                    config.set(field, &mut map)?;
                }
                Ok(config)
            }
        }

        // A map, not a struct: under `#[serde(flatten)]` unknown keys reach this visitor
        // and are rejected (without their line; [`WithPolicy`](super::WithPolicy) keeps it).
        d.deserialize_map(ConfigVisitor)
    }
}

/// A key of [`PolicyConfig`] not read yet; anything else is an unknown field.
struct FieldSeed<'c>(&'c PolicyConfig);

// === impl FieldSeed ===

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = Field;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for FieldSeed<'_> {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a policy key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Field, E> {
        self.0
            .field(key)?
            .ok_or_else(|| E::unknown_field(key, PolicyConfig::FIELDS))
    }
}

/// A string checked as it is read, so that the error carries the value's position.
/// `optional` also takes `false` and null for "switched off".
struct Text<F> {
    expecting: &'static str,
    check: F,
    optional: bool,
}

// === impl Text ===

impl<F> Text<F> {
    fn required(expecting: &'static str, check: F) -> Self {
        Text {
            expecting,
            check,
            optional: false,
        }
    }
}

impl<'de, F: FnOnce(&str) -> Result<(), PolicyError>> DeserializeSeed<'de> for Text<F> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        if self.optional {
            d.deserialize_any(self)
        } else {
            d.deserialize_str(self)
        }
    }
}

impl<'de, F: FnOnce(&str) -> Result<(), PolicyError>> Visitor<'de> for Text<F> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<String>, E> {
        match (self.check)(v) {
            Ok(()) => Ok(Some(v.to_owned())),
            Err(e) => Err(E::custom(e.problem())),
        }
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Option<String>, E> {
        if self.optional && !v {
            Ok(None)
        } else {
            Err(E::invalid_type(Unexpected::Bool(v), &self))
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
        if self.optional {
            Ok(None)
        } else {
            Err(E::invalid_type(Unexpected::Unit, &self))
        }
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        self.deserialize(d)
    }
}

// === impl Policy ===

impl TryFrom<PolicyConfig> for Policy {
    type Error = PolicyError;

    /// Builds the policy, checking every value and the keys that must differ
    /// (`flag_key` from `lane_key`, `versions_key` from `version_key`).
    fn try_from(c: PolicyConfig) -> Result<Self, PolicyError> {
        let mut p = match c.preset.as_deref() {
            Some(name) => Policy::preset(name)
                .ok_or_else(|| PolicyError::new("preset", EXPECTED_PRESET, name))?,
            None => Policy::new(),
        };
        if let Some(name) = c.name {
            check_name(&name)?;
            p.name = name.into();
        }
        let label_key = |field: &'static str, key: Option<String>| match key {
            Some(k) => check_label_key(field, &k).map(|()| Some(k.into_boxed_str())),
            None => Ok(None),
        };
        if let Some(k) = c.lane_key {
            p.lane_key = label_key("lane_key", k)?;
        }
        if let Some(k) = c.flag_key {
            p.flag_key = label_key("flag_key", k)?;
        }
        if let Some(k) = c.version_key {
            p.version_key = label_key("version_key", k)?;
        }
        if let Some(k) = c.versions_key {
            p.versions_key = label_key("versions_key", k)?;
        }
        if p.lane_key.is_some() && p.lane_key == p.flag_key {
            let found = p.flag_key.as_deref().unwrap_or_default();
            return Err(PolicyError::new(
                "flag_key",
                "a label key different from `lane_key`",
                found,
            ));
        }
        if p.version_key.is_some() && p.version_key == p.versions_key {
            let found = p.versions_key.as_deref().unwrap_or_default();
            return Err(PolicyError::new(
                "versions_key",
                "a label key different from `version_key`",
                found,
            ));
        }
        if let Some(lane) = c.flag_lane {
            p.flag_lane = check_lane("flag_lane", LANE, &lane)?;
        }
        if let Some(lane) = c.own_lane {
            p.own_lane = lane
                .map(|l| check_lane("own_lane", OWN_LANE, &l))
                .transpose()?;
        }
        if let Some(v) = c.flag_values {
            p.flag_values = v;
        }
        if let Some(v) = c.unlabelled {
            p.unlabelled = v;
        }
        if let Some(v) = c.fallback {
            p.fallback = v;
        }
        if let Some(v) = c.on_unready {
            p.on_unready = v;
        }
        if let Some(enabled) = c.enabled {
            p.enabled = enabled;
        }
        Ok(p)
    }
}

impl From<&Policy> for PolicyConfig {
    /// Every setting of `policy`, spelled out (no preset): what it runs with, for a
    /// configuration check to print.
    fn from(p: &Policy) -> Self {
        let key = |k: &Option<Box<str>>| Some(k.as_deref().map(str::to_owned));
        PolicyConfig {
            name: Some(p.name.to_string()),
            preset: None,
            lane_key: key(&p.lane_key),
            flag_key: key(&p.flag_key),
            flag_lane: Some(p.flag_lane.to_string()),
            flag_values: Some(p.flag_values),
            version_key: key(&p.version_key),
            versions_key: key(&p.versions_key),
            unlabelled: Some(p.unlabelled),
            fallback: Some(p.fallback),
            on_unready: Some(p.on_unready),
            own_lane: Some(p.own_lane.as_ref().map(Lane::to_string)),
            enabled: Some(p.enabled),
        }
    }
}

impl<'de> Deserialize<'de> for Policy {
    /// Through [`PolicyConfig`] and [`Policy::try_from`].
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let config = PolicyConfig::deserialize(d)?;
        Policy::try_from(config).map_err(de::Error::custom)
    }
}
