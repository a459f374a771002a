//! [`Policy`], its settings and its builder.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use gray_core::Lane;

/// The default label that names an instance's lane.
pub(super) const DEFAULT_LANE_KEY: &str = "lane";
/// The default boolean label that puts an instance in the flag lane.
pub(super) const DEFAULT_FLAG_KEY: &str = "gray";
/// The default flag lane.
const DEFAULT_FLAG_LANE: &str = "gray";
/// The default label that names the one version an instance serves.
pub(super) const DEFAULT_VERSION_KEY: &str = "version";
/// The default label that lists the versions an instance serves, comma-separated.
pub(super) const DEFAULT_VERSIONS_KEY: &str = "versions";
/// The default policy name.
const DEFAULT_POLICY_NAME: &str = "default";

/// What an instance without a label means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Unlabelled {
    /// It serves only unstained traffic: no lane means baseline, no version means it
    /// serves only requests without a version pin.
    #[default]
    Baseline,
    /// It serves anything: every lane and every version.
    Wildcard,
}

/// Where a request goes when no instance of its primary subset is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Fallback {
    /// Nowhere: the request fails with [`Unroutable`](super::Unroutable) (a gateway
    /// answers 503).
    #[default]
    None,
    /// A stained request may use baseline instances (a pinned request first tries its
    /// lane); a baseline request never uses gray ones.
    Baseline,
    /// As `baseline`, then any instance at all.
    Any,
}

/// What a subset that has instances, none of them ready, means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OnUnready {
    /// The request fails at once with [`Unroutable`](super::Unroutable) (reason
    /// [`UnroutableReason::Unready`](super::UnroutableReason::Unready)); the balancer never
    /// waits for one subset inside `call`.
    #[default]
    Fail,
    /// The subset counts as absent and the fallback goes on (a thing Envoy's subset
    /// load balancer does not do).
    Fallback,
}

/// How the boolean flag label is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FlagValues {
    /// `true` in any case (`TRUE`, `True`) is gray; anything else is false (seed 000).
    #[default]
    Lenient,
    /// Only exactly `true` is gray (seed 003).
    Exact,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fallback::None => "none",
            Fallback::Baseline => "baseline",
            Fallback::Any => "any",
        })
    }
}

/// The routing semantics for one outbound target; see the [module docs](super).
///
/// Built with [`Policy::new`] (or a preset) and the `with_*` setters, in any order, or
/// from a [`PolicyConfig`](super::PolicyConfig). Cloning is cheap enough for
/// configuration time; the request path borrows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub(super) name: Arc<str>,
    pub(super) lane_key: Option<Box<str>>,
    pub(super) flag_key: Option<Box<str>>,
    pub(super) flag_lane: Lane,
    pub(super) flag_values: FlagValues,
    pub(super) version_key: Option<Box<str>>,
    pub(super) versions_key: Option<Box<str>>,
    pub(super) unlabelled: Unlabelled,
    pub(super) fallback: Fallback,
    pub(super) on_unready: OnUnready,
    pub(super) own_lane: Option<Lane>,
    pub(super) enabled: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self::new()
    }
}

fn default_flag_lane() -> Lane {
    // A literal that satisfies the name rules.
    Lane::new(DEFAULT_FLAG_LANE).unwrap_or_else(|_| unreachable!("`gray` is a valid lane"))
}

// === impl Policy ===

impl Policy {
    /// The default policy, named `default`: lanes from the label `lane` and the lenient
    /// flag `gray` (flag lane `gray`), versions from `version` and `versions`, unlabelled
    /// instances are baseline, no fallback, an unready subset fails, no own lane.
    #[must_use]
    pub fn new() -> Self {
        Policy {
            name: DEFAULT_POLICY_NAME.into(),
            lane_key: Some(DEFAULT_LANE_KEY.into()),
            flag_key: Some(DEFAULT_FLAG_KEY.into()),
            flag_lane: default_flag_lane(),
            flag_values: FlagValues::Lenient,
            version_key: Some(DEFAULT_VERSION_KEY.into()),
            versions_key: Some(DEFAULT_VERSIONS_KEY.into()),
            unlabelled: Unlabelled::Baseline,
            fallback: Fallback::None,
            on_unready: OnUnready::Fail,
            own_lane: None,
            enabled: true,
        }
    }

    /// Names the policy (errors and decisions quote it).
    #[must_use]
    pub fn with_name(mut self, name: impl AsRef<str>) -> Self {
        self.name = name.as_ref().into();
        self
    }

    /// The label that names an instance's lane (`None` to ignore lane labels).
    #[must_use]
    pub fn with_lane_key(mut self, key: Option<&str>) -> Self {
        self.lane_key = key.map(Into::into);
        self
    }

    /// The boolean label that puts an instance in the flag lane (`None` to ignore it).
    #[must_use]
    pub fn with_flag_key(mut self, key: Option<&str>) -> Self {
        self.flag_key = key.map(Into::into);
        self
    }

    /// The lane that the flag label puts an instance in (default `gray`).
    #[must_use]
    pub fn with_flag_lane(mut self, lane: Lane) -> Self {
        self.flag_lane = lane;
        self
    }

    /// How the flag label is read.
    #[must_use]
    pub fn with_flag_values(mut self, values: FlagValues) -> Self {
        self.flag_values = values;
        self
    }

    /// The labels for one version and for a version list (`None` to ignore either).
    #[must_use]
    pub fn with_version_keys(mut self, version: Option<&str>, versions: Option<&str>) -> Self {
        self.version_key = version.map(Into::into);
        self.versions_key = versions.map(Into::into);
        self
    }

    /// What an instance without a label means.
    #[must_use]
    pub fn with_unlabelled(mut self, unlabelled: Unlabelled) -> Self {
        self.unlabelled = unlabelled;
        self
    }

    /// Where a request goes when its primary subset has no available instance.
    #[must_use]
    pub fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// What a subset with instances but none ready means.
    #[must_use]
    pub fn with_on_unready(mut self, on_unready: OnUnready) -> Self {
        self.on_unready = on_unready;
        self
    }

    /// The lane of the calling instance itself, used for requests that carry no stain at
    /// all (seed 000): no [`Stain`](gray_core::Stain) anywhere, or the
    /// [unstained](gray_core::Stain::unstained) one that gray-tower's `ExtractStainLayer`
    /// gives a request without any carrier. An explicit baseline (`gray: false`) is not
    /// affected.
    #[must_use]
    pub fn with_own_lane(mut self, lane: Option<Lane>) -> Self {
        self.own_lane = lane;
        self
    }

    /// Switches gray routing on or off (seed 001's global switch). Off, every request is
    /// routed as unstained.
    #[must_use]
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The policy's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fallback.
    #[must_use]
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// What an unlabelled instance means.
    #[must_use]
    pub fn unlabelled(&self) -> Unlabelled {
        self.unlabelled
    }

    /// What an unready subset means.
    #[must_use]
    pub fn on_unready(&self) -> OnUnready {
        self.on_unready
    }

    /// The calling instance's own lane.
    #[must_use]
    pub fn own_lane(&self) -> Option<&Lane> {
        self.own_lane.as_ref()
    }

    /// Whether gray routing is on.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// `true` when the policy reads instance lanes (so request lanes matter).
    #[must_use]
    pub fn reads_lanes(&self) -> bool {
        self.lane_key.is_some() || self.flag_key.is_some()
    }

    /// `true` when the policy reads instance versions (so request pins matter).
    #[must_use]
    pub fn reads_versions(&self) -> bool {
        self.version_key.is_some() || self.versions_key.is_some()
    }
}
