//! Matching: which instances may serve a request, and what happens when none fits.
//!
//! A [`Policy`] holds the whole routing semantics of one outbound target, with no I/O:
//!
//! - **Instance side** ([`Policy::classify`]): the registry labels of an instance give it a
//!   [`Class`], an optional lane plus the versions it serves. The lane comes from the label
//!   `lane=<name>` and/or a boolean flag `gray=true|false` (the flag puts the instance in
//!   the *flag lane*, `gray` by default; when both are present, the `lane` label wins). The
//!   flag is read [leniently](FlagValues::Lenient) (`TRUE`, `True`; anything else is false,
//!   as in seed 000) or [exactly](FlagValues::Exact) (only `true`, as in seed 003). Versions
//!   come from `version=2.0` and the list `versions=1.0,2.0`. Every label key is
//!   configurable and can be switched off. A label value that is not a valid name counts as
//!   absent (a `tracing` event at debug level, target `gray::matching`, says so).
//! - **Unlabelled instances** ([`Unlabelled`]): an instance without a lane is *baseline*;
//!   with [`Unlabelled::Wildcard`] it also serves every lane. An instance without versions
//!   serves only requests that pin no version; with `Wildcard` it serves every version.
//! - **Request side** ([`Policy::key`]): the [`Key`] of a request for a service is its lane
//!   and the version it pins *for that service* (a per-service pin wins over `all`). A
//!   request that carries no [`Stain`] at all (a background job, a message consumer)
//!   takes the calling instance's own lane ([`Policy::with_own_lane`], seed 000); a request
//!   that carries a baseline context stays baseline. When the policy reads no lane label
//!   the request's lane is ignored, and when it reads no version label its pins are
//!   ignored; a [disabled](Policy::with_enabled) policy treats every request as unstained.
//! - **Lane and pin together**: the pin is the more specific stain, so it decides first.
//!   The request is served by the instances of the pinned version, whatever their lane;
//!   its lane matters only when falling back ([`Policy::chain`]).
//! - **Unstained requests** go to the [`Subset::Baseline`] instances: every instance
//!   without a lane. When no instance has a lane (a version-only policy such as seeds 001,
//!   002 and 004) that is every instance: a request without a version matches anything.
//! - **Fallback** ([`Fallback`]), tried in order ([`Chain`]): first the primary subset
//!   (the pinned version, else the lane, else baseline), then with `baseline` the lane
//!   (for a pinned request) and the baseline instances, then with `any` every instance. A
//!   baseline request never falls back to gray instances unless the fallback is `any`.
//! - **Readiness** ([`OnUnready`]): a subset that has instances but none ready either fails
//!   the request (`fail`, the default) or counts as absent so the fallback goes on
//!   (`fallback`). Ejected (unhealthy) instances always count as absent.
//!
//! [`Policy::decide`] runs all of this over a plain instance list and returns the whole
//! [`Decision`] as a value, which is what a gateway shows on its admin endpoint;
//! `gray-balance` runs the same [`Policy::walk`] over its index on every request.
//!
//! One preset per seed reproduces its table row: [`Policy::seed_000`] to
//! [`Policy::seed_004`].
//!
//! ```
//! use gray_core::{Stain, Labels, Lane};
//! use gray_core::matching::{Availability, Candidate, Fallback, Policy};
//!
//! let policy = Policy::new().with_fallback(Fallback::Baseline);
//! let base = Labels::from_iter([("zone", "a")]);
//! let gray = Labels::from_iter([("gray", "TRUE")]);
//! let instances = [
//!     Candidate::new("b1", &base, Availability::Ready),
//!     Candidate::new("g1", &gray, Availability::Ready),
//! ];
//!
//! // A gray request goes to the gray instance...
//! let ctx = Stain::in_lane(Lane::new("gray")?);
//! let decision = policy.decide("svc-b", Some(&ctx), instances.clone());
//! assert_eq!(decision.candidates(), Some(&["g1"][..]));
//!
//! // ...a baseline one never does...
//! let decision = policy.decide("svc-b", Some(&Stain::baseline()), instances.clone());
//! assert_eq!(decision.candidates(), Some(&["b1"][..]));
//!
//! // ...and a gray request falls back to baseline when no gray instance is left.
//! let decision = policy.decide("svc-b", Some(&ctx), instances[..1].to_vec());
//! assert_eq!(decision.candidates(), Some(&["b1"][..]));
//! assert!(decision.fallback_taken());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::{
    labels::Labels,
    name::{Lane, Version},
    stain::Stain,
};

/// The default label that names an instance's lane.
pub const DEFAULT_LANE_KEY: &str = "lane";
/// The default boolean label that puts an instance in the flag lane.
pub const DEFAULT_FLAG_KEY: &str = "gray";
/// The default flag lane.
pub const DEFAULT_FLAG_LANE: &str = "gray";
/// The default label that names the one version an instance serves.
pub const DEFAULT_VERSION_KEY: &str = "version";
/// The default label that lists the versions an instance serves, comma-separated.
pub const DEFAULT_VERSIONS_KEY: &str = "versions";
/// The default policy name.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// What an instance without a label means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
pub enum Fallback {
    /// Nowhere: the request fails with [`Unroutable`] (a gateway answers 503).
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
pub enum OnUnready {
    /// The request fails at once with [`Unroutable`] (reason [`Miss::Unready`]); the
    /// balancer never waits for one subset inside `call`.
    #[default]
    Fail,
    /// The subset counts as absent and the fallback goes on (a thing Envoy's subset
    /// load balancer does not do).
    Fallback,
}

/// How the boolean flag label is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlagValues {
    /// `true` in any case (`TRUE`, `True`) is gray; anything else is false (seed 000).
    #[default]
    Lenient,
    /// Only exactly `true` is gray (seed 003).
    Exact,
}

/// The routing semantics for one outbound target; see the [module docs](self).
///
/// Cloning is cheap enough for configuration time; the request path borrows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: Arc<str>,
    lane_key: Option<Box<str>>,
    flag_key: Option<Box<str>>,
    flag_lane: Lane,
    flag_values: FlagValues,
    version_key: Option<Box<str>>,
    versions_key: Option<Box<str>>,
    unlabelled: Unlabelled,
    fallback: Fallback,
    on_unready: OnUnready,
    own_lane: Option<Lane>,
    enabled: bool,
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

impl Policy {
    /// The default policy, named `default`: lanes from `lane` and the lenient flag `gray`,
    /// versions from `version` and `versions`, unlabelled instances are baseline, no
    /// fallback, an unready subset fails, no own lane.
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

    /// Seed 000 (gray-transition component): the flag `gray`, lenient on both sides;
    /// missing or invalid = baseline; a gray request uses gray instances, else baseline
    /// ones; a baseline request uses baseline instances only, none = error. An unstained
    /// request made by a gray instance itself uses that instance's own flag: pass the
    /// instance's lane to [`with_own_lane`](Self::with_own_lane).
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | header `gray: true/false`, case-insensitive, anything else = false; when absent, the calling instance's own gray flag | `gray` metadata, missing/invalid = baseline | gray→gray, else baseline; baseline→baseline only, none = error |
    pub fn seed_000() -> Self {
        Policy::new()
            .with_name("seed-000")
            .with_lane_key(None)
            .with_version_keys(None, None)
            .with_fallback(Fallback::Baseline)
    }

    /// Seed 001 (metadata canary rule): the request's `version` against the instance's
    /// `version`; an instance without one matches anything; a request without one
    /// matches anything. The global on/off switch is [`with_enabled`](Self::with_enabled).
    /// A pinned version that no instance serves is an error.
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | header `version`; global on/off switch | `version`; instance without it matches anything | request without version matches anything |
    pub fn seed_001() -> Self {
        Policy::new()
            .with_name("seed-001")
            .with_lane_key(None)
            .with_flag_key(None)
            .with_version_keys(Some(DEFAULT_VERSION_KEY), None)
            .with_unlabelled(Unlabelled::Wildcard)
    }

    /// Seed 002 (route rule header): version pins from the JSON route header (`custom`
    /// wins over `all`) against the instance's `version`; when nothing matches, every
    /// instance, round-robin (select round-robin in the balancer).
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | header `x-gray-info` = JSON `{"all": "v2", "custom": {"svc-b": "v3"}}`, custom wins; default rule from config when absent | `version` | no match → all instances, round-robin |
    pub fn seed_002() -> Self {
        Policy::new()
            .with_name("seed-002")
            .with_lane_key(None)
            .with_flag_key(None)
            .with_version_keys(Some(DEFAULT_VERSION_KEY), None)
            .with_fallback(Fallback::Any)
    }

    /// Seed 003 (IP whitelist): the flag `gray`, exactly `true`; a gray request uses gray
    /// instances, a baseline one the others; when nothing matches, every instance.
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | client IP in a whitelist; edge writes `X-Gray-Flag` and `X-Gray-Ip` | `gray=true` | no match → all instances; propagates through nested calls A→B→C |
    pub fn seed_003() -> Self {
        Policy::new()
            .with_name("seed-003")
            .with_lane_key(None)
            .with_flag_values(FlagValues::Exact)
            .with_version_keys(None, None)
            .with_fallback(Fallback::Any)
    }

    /// Seed 004 (multi-version): the request's API version against the instance's
    /// `versions` list (`1.0,2.0`); a request without a version goes anywhere; a version
    /// that no instance serves is an error.
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | API version from path (`/v1/…`), query (`?v=1`) or header, pluggable | `versions` list, e.g. `1.0,2.0` | request without version → any |
    pub fn seed_004() -> Self {
        Policy::new()
            .with_name("seed-004")
            .with_lane_key(None)
            .with_flag_key(None)
            .with_version_keys(None, Some(DEFAULT_VERSIONS_KEY))
    }

    /// The preset named `seed-000` … `seed-004`, if any.
    pub fn preset(name: &str) -> Option<Self> {
        Some(match name {
            "seed-000" => Self::seed_000(),
            "seed-001" => Self::seed_001(),
            "seed-002" => Self::seed_002(),
            "seed-003" => Self::seed_003(),
            "seed-004" => Self::seed_004(),
            _ => return None,
        })
    }

    /// Names the policy (errors and decisions quote it).
    pub fn with_name(mut self, name: impl AsRef<str>) -> Self {
        self.name = name.as_ref().into();
        self
    }

    /// The label that names an instance's lane (`None` to ignore lane labels).
    pub fn with_lane_key(mut self, key: Option<&str>) -> Self {
        self.lane_key = key.map(Into::into);
        self
    }

    /// The boolean label that puts an instance in the flag lane (`None` to ignore it).
    pub fn with_flag_key(mut self, key: Option<&str>) -> Self {
        self.flag_key = key.map(Into::into);
        self
    }

    /// The lane that the flag label puts an instance in (default `gray`).
    pub fn with_flag_lane(mut self, lane: Lane) -> Self {
        self.flag_lane = lane;
        self
    }

    /// How the flag label is read.
    pub fn with_flag_values(mut self, values: FlagValues) -> Self {
        self.flag_values = values;
        self
    }

    /// The labels for one version and for a version list (`None` to ignore either).
    pub fn with_version_keys(mut self, version: Option<&str>, versions: Option<&str>) -> Self {
        self.version_key = version.map(Into::into);
        self.versions_key = versions.map(Into::into);
        self
    }

    /// What an instance without a label means.
    pub fn with_unlabelled(mut self, unlabelled: Unlabelled) -> Self {
        self.unlabelled = unlabelled;
        self
    }

    /// Where a request goes when its primary subset has no available instance.
    pub fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// What a subset with instances but none ready means.
    pub fn with_on_unready(mut self, on_unready: OnUnready) -> Self {
        self.on_unready = on_unready;
        self
    }

    /// The lane of the calling instance itself, used for requests that carry no context
    /// at all (seed 000).
    pub fn with_own_lane(mut self, lane: Option<Lane>) -> Self {
        self.own_lane = lane;
        self
    }

    /// Switches gray routing on or off (seed 001's global switch). Off, every request is
    /// routed as unstained.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fallback.
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// What an unlabelled instance means.
    pub fn unlabelled(&self) -> Unlabelled {
        self.unlabelled
    }

    /// What an unready subset means.
    pub fn on_unready(&self) -> OnUnready {
        self.on_unready
    }

    /// The calling instance's own lane.
    pub fn own_lane(&self) -> Option<&Lane> {
        self.own_lane.as_ref()
    }

    /// Whether gray routing is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// `true` when the policy reads instance lanes (so request lanes matter).
    pub fn reads_lanes(&self) -> bool {
        self.lane_key.is_some() || self.flag_key.is_some()
    }

    /// `true` when the policy reads instance versions (so request pins matter).
    pub fn reads_versions(&self) -> bool {
        self.version_key.is_some() || self.versions_key.is_some()
    }

    /// The [`Class`] of an instance with these labels.
    pub fn classify(&self, labels: &Labels) -> Class {
        let mut lane = None;
        if let Some(value) = self.lane_key.as_deref().and_then(|k| labels.get(k)) {
            match Lane::new(value) {
                Ok(l) => lane = Some(l),
                Err(e) => tracing::debug!(
                    target: "gray::matching",
                    label = self.lane_key.as_deref(),
                    value,
                    error = %e,
                    "ignoring lane label",
                ),
            }
        }
        if lane.is_none() {
            if let Some(value) = self.flag_key.as_deref().and_then(|k| labels.get(k)) {
                let gray = match self.flag_values {
                    FlagValues::Lenient => value.eq_ignore_ascii_case("true"),
                    FlagValues::Exact => value == "true",
                };
                if gray {
                    lane = Some(self.flag_lane.clone());
                }
            }
        }
        let mut versions: Vec<Version> = Vec::new();
        let single = self.version_key.as_deref().and_then(|k| labels.get(k));
        let list = self.versions_key.as_deref().and_then(|k| labels.get(k));
        for value in single
            .into_iter()
            .chain(list.into_iter().flat_map(|l| l.split(',')))
        {
            let value = value.trim();
            if value.is_empty() {
                continue;
            }
            match Version::new(value) {
                Ok(v) if !versions.contains(&v) => versions.push(v),
                Ok(_) => {}
                Err(e) => tracing::debug!(
                    target: "gray::matching",
                    value,
                    error = %e,
                    "ignoring version label",
                ),
            }
        }
        Class { lane, versions }
    }

    /// `true` when an instance of class `class` belongs to `subset`.
    pub fn serves(&self, class: &Class, subset: Subset<'_>) -> bool {
        let wildcard = self.unlabelled == Unlabelled::Wildcard;
        match subset {
            Subset::All => true,
            Subset::Baseline => class.lane.is_none(),
            Subset::Lane(l) => match &class.lane {
                Some(own) => own == l,
                None => wildcard,
            },
            Subset::Version(v) => {
                class.versions.contains(v) || (wildcard && class.versions.is_empty())
            }
        }
    }

    /// The key of a request for `service`: its lane and its pin for that service.
    ///
    /// `ctx` is `None` when the request carries no context at all; the policy's own
    /// lane then applies.
    pub fn key<'a>(&'a self, service: &str, ctx: Option<&'a Stain>) -> Key<'a> {
        if !self.enabled {
            return Key::default();
        }
        let (lane, own) = match ctx {
            Some(ctx) => (ctx.lane(), false),
            None => (self.own_lane.as_ref(), self.own_lane.is_some()),
        };
        let lane = lane.filter(|_| self.reads_lanes());
        let pin = ctx
            .and_then(|c| c.version_for(service))
            .filter(|_| self.reads_versions());
        Key {
            lane,
            pin,
            own_lane: own && lane.is_some(),
        }
    }

    /// The subsets a request with `key` may use, in order.
    pub fn chain<'a>(&self, key: &Key<'a>) -> Chain<'a> {
        let mut chain = Chain::default();
        let primary = match (key.pin, key.lane) {
            (Some(v), _) => Subset::Version(v),
            (None, Some(l)) => Subset::Lane(l),
            (None, None) => Subset::Baseline,
        };
        chain.push(primary);
        if self.fallback != Fallback::None {
            if let (Some(_), Some(l)) = (key.pin, key.lane) {
                chain.push(Subset::Lane(l));
            }
            if primary != Subset::Baseline {
                chain.push(Subset::Baseline);
            }
            if self.fallback == Fallback::Any {
                chain.push(Subset::All);
            }
        }
        chain
    }

    /// Walks the [`chain`](Self::chain) of `key`, asking `counts` how many instances of
    /// each subset are present (not ejected) and ready, and returns the subset to pick
    /// from, or why there is none.
    pub fn walk<'a>(
        &self,
        key: &Key<'a>,
        mut counts: impl FnMut(Subset<'a>) -> Counts,
    ) -> Result<Route<'a>, Miss<'a>> {
        let mut unready: Option<(Subset<'a>, usize)> = None;
        for (i, subset) in self.chain(key).iter().enumerate() {
            let c = counts(subset);
            if c.ready > 0 {
                return Ok(Route {
                    subset,
                    fallback: i > 0,
                    counts: c,
                });
            }
            if c.present > 0 {
                if self.on_unready == OnUnready::Fail {
                    return Err(Miss::Unready {
                        subset,
                        present: c.present,
                    });
                }
                unready.get_or_insert((subset, c.present));
            }
        }
        Err(match unready {
            Some((subset, present)) => Miss::Unready { subset, present },
            None => Miss::NoMatch,
        })
    }

    /// The typed error for a request to `service` with `key` that `miss`ed.
    pub fn unroutable(&self, service: &str, key: &Key<'_>, miss: &Miss<'_>) -> Unroutable {
        Unroutable {
            service: service.into(),
            policy: self.name.clone(),
            lane: key.lane.cloned(),
            pin: key.pin.cloned(),
            fallback: self.fallback,
            reason: match *miss {
                Miss::NoMatch => UnroutableReason::NoMatch,
                Miss::Unready { subset, present } => UnroutableReason::Unready {
                    subset: subset.to_owned(),
                    present,
                },
            },
        }
    }

    /// Decides, for a request to `service` carrying `ctx` (`None`: no context at all),
    /// which of `instances` may serve it; the same walk the balancer does per request, as
    /// a value (a gateway shows it on its admin endpoint). The balancer then picks one
    /// of the [candidates](Decision::candidates) by load.
    pub fn decide<'i, Id: Clone + 'i>(
        &self,
        service: &str,
        ctx: Option<&Stain>,
        instances: impl IntoIterator<Item = Candidate<'i, Id>>,
    ) -> Decision<Id> {
        let key = self.key(service, ctx);
        let classed: Vec<(Id, Class, Availability)> = instances
            .into_iter()
            .map(|c| (c.id, self.classify(c.labels), c.availability))
            .collect();
        let mut steps = Vec::new();
        let walked = self.walk(&key, |subset| {
            let mut counts = Counts::default();
            for (_, class, availability) in &classed {
                if *availability != Availability::Ejected && self.serves(class, subset) {
                    counts.present += 1;
                    counts.ready += usize::from(*availability == Availability::Ready);
                }
            }
            steps.push(Step {
                subset: subset.to_owned(),
                present: counts.present,
                ready: counts.ready,
            });
            counts
        });
        let outcome = match walked {
            Ok(route) => Outcome::Routed {
                subset: route.subset.to_owned(),
                fallback: route.fallback,
                candidates: classed
                    .iter()
                    .filter(|(_, class, a)| {
                        *a == Availability::Ready && self.serves(class, route.subset)
                    })
                    .map(|(id, _, _)| id.clone())
                    .collect(),
            },
            Err(miss) => Outcome::Unroutable(self.unroutable(service, &key, &miss)),
        };
        Decision {
            service: service.to_owned(),
            policy: self.name.to_string(),
            lane: key.lane.cloned(),
            pin: key.pin.cloned(),
            own_lane: key.own_lane,
            steps,
            outcome,
        }
    }
}

/// What an instance's labels mean to a [`Policy`]: its lane and the versions it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Class {
    lane: Option<Lane>,
    versions: Vec<Version>,
}

impl Class {
    /// A class with this lane and these versions.
    pub fn new(lane: Option<Lane>, versions: impl IntoIterator<Item = Version>) -> Self {
        let mut v: Vec<Version> = Vec::new();
        for version in versions {
            if !v.contains(&version) {
                v.push(version);
            }
        }
        Class { lane, versions: v }
    }

    /// The instance's lane; `None` for baseline.
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The versions the instance serves, without duplicates.
    pub fn versions(&self) -> &[Version] {
        &self.versions
    }
}

/// A request's routing key for one service; see [`Policy::key`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Key<'a> {
    lane: Option<&'a Lane>,
    pin: Option<&'a Version>,
    own_lane: bool,
}

impl<'a> Key<'a> {
    /// The request's lane, `None` for baseline.
    pub fn lane(&self) -> Option<&'a Lane> {
        self.lane
    }

    /// The version the request pins for the service.
    pub fn pin(&self) -> Option<&'a Version> {
        self.pin
    }

    /// `true` when the lane is the calling instance's own (the request had no context).
    pub fn is_own_lane(&self) -> bool {
        self.own_lane
    }
}

/// A set of instances a request may be served by, borrowed from the request's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subset<'a> {
    /// The instances serving this version (and, with [`Unlabelled::Wildcard`], those
    /// without versions).
    Version(&'a Version),
    /// The instances in this lane (and, with [`Unlabelled::Wildcard`], those without a
    /// lane).
    Lane(&'a Lane),
    /// The instances without a lane.
    Baseline,
    /// Every instance.
    All,
}

impl Subset<'_> {
    /// The owned form, for reports and errors.
    pub fn to_owned(&self) -> OwnedSubset {
        match *self {
            Subset::Version(v) => OwnedSubset::Version(v.clone()),
            Subset::Lane(l) => OwnedSubset::Lane(l.clone()),
            Subset::Baseline => OwnedSubset::Baseline,
            Subset::All => OwnedSubset::All,
        }
    }
}

impl fmt::Display for Subset<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subset::Version(v) => write!(f, "version `{v}`"),
            Subset::Lane(l) => write!(f, "lane `{l}`"),
            Subset::Baseline => f.write_str("baseline"),
            Subset::All => f.write_str("all instances"),
        }
    }
}

/// A [`Subset`] that owns its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnedSubset {
    /// See [`Subset::Version`].
    Version(Version),
    /// See [`Subset::Lane`].
    Lane(Lane),
    /// See [`Subset::Baseline`].
    Baseline,
    /// See [`Subset::All`].
    All,
}

impl OwnedSubset {
    /// The borrowed form.
    pub fn as_subset(&self) -> Subset<'_> {
        match self {
            OwnedSubset::Version(v) => Subset::Version(v),
            OwnedSubset::Lane(l) => Subset::Lane(l),
            OwnedSubset::Baseline => Subset::Baseline,
            OwnedSubset::All => Subset::All,
        }
    }
}

impl fmt::Display for OwnedSubset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.as_subset(), f)
    }
}

/// The subsets a request may use, in order: at most four, no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chain<'a> {
    subsets: [Option<Subset<'a>>; 4],
    len: usize,
}

impl<'a> Chain<'a> {
    fn push(&mut self, subset: Subset<'a>) {
        if let Some(slot) = self.subsets.get_mut(self.len) {
            *slot = Some(subset);
            self.len += 1;
        }
    }

    /// The subsets, primary first.
    pub fn iter(&self) -> impl Iterator<Item = Subset<'a>> + '_ {
        self.subsets[..self.len].iter().flatten().copied()
    }

    /// The number of subsets.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the chain is empty (never, for a chain from [`Policy::chain`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How many instances of a subset are present (not ejected) and ready.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Instances present: known and not ejected, ready or not.
    pub present: usize,
    /// Instances ready to take a request now.
    pub ready: usize,
}

/// Where [`Policy::walk`] sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'a> {
    /// The subset to pick from.
    pub subset: Subset<'a>,
    /// `true` when it is not the primary subset.
    pub fallback: bool,
    /// Its counts.
    pub counts: Counts,
}

/// Why [`Policy::walk`] found no subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss<'a> {
    /// No subset the policy allows has an instance.
    NoMatch,
    /// `subset` has `present` instances, none of them ready.
    Unready {
        /// The first allowed subset that had instances.
        subset: Subset<'a>,
        /// How many it had.
        present: usize,
    },
}

/// The availability of one instance handed to [`Policy::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Availability {
    /// Ready to take a request.
    Ready,
    /// Known, but not ready yet.
    Unready,
    /// Ejected by passive health checking: counts as absent.
    Ejected,
}

/// One instance handed to [`Policy::decide`].
#[derive(Debug, Clone)]
pub struct Candidate<'a, Id> {
    id: Id,
    labels: &'a Labels,
    availability: Availability,
}

impl<'a, Id> Candidate<'a, Id> {
    /// An instance named `id`, with its labels and availability.
    pub fn new(id: Id, labels: &'a Labels, availability: Availability) -> Self {
        Candidate {
            id,
            labels,
            availability,
        }
    }
}

/// One subset [`Policy::decide`] looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// The subset.
    pub subset: OwnedSubset,
    /// Instances present in it.
    pub present: usize,
    /// Instances ready in it.
    pub ready: usize,
}

/// The end of a [`Decision`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome<Id> {
    /// The request goes to one of `candidates`, all ready, in `subset`.
    Routed {
        /// The subset picked from.
        subset: OwnedSubset,
        /// `true` when it is a fallback subset.
        fallback: bool,
        /// The ready instances of the subset, in input order.
        candidates: Vec<Id>,
    },
    /// The request fails with this error.
    Unroutable(Unroutable),
}

/// A routing decision as a value; see [`Policy::decide`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision<Id> {
    /// The target service.
    pub service: String,
    /// The policy's name.
    pub policy: String,
    /// The request's lane (`None`: baseline).
    pub lane: Option<Lane>,
    /// The version pinned for the service.
    pub pin: Option<Version>,
    /// `true` when the lane is the calling instance's own (the request had no context).
    pub own_lane: bool,
    /// The subsets looked at, in order.
    pub steps: Vec<Step>,
    /// Where the request goes.
    pub outcome: Outcome<Id>,
}

impl<Id> Decision<Id> {
    /// The ready instances the request may go to, or `None` when it is unroutable.
    pub fn candidates(&self) -> Option<&[Id]> {
        match &self.outcome {
            Outcome::Routed { candidates, .. } => Some(candidates),
            Outcome::Unroutable(_) => None,
        }
    }

    /// `true` when the request goes to a fallback subset.
    pub fn fallback_taken(&self) -> bool {
        matches!(self.outcome, Outcome::Routed { fallback: true, .. })
    }

    /// The error, when the request is unroutable.
    pub fn error(&self) -> Option<&Unroutable> {
        match &self.outcome {
            Outcome::Unroutable(e) => Some(e),
            Outcome::Routed { .. } => None,
        }
    }
}

/// No instance may serve the request: the typed error a gateway turns into a 503.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unroutable {
    #[serde(serialize_with = "ser_str")]
    service: Arc<str>,
    #[serde(serialize_with = "ser_str")]
    policy: Arc<str>,
    lane: Option<Lane>,
    pin: Option<Version>,
    fallback: Fallback,
    reason: UnroutableReason,
}

fn ser_str<S: serde::Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s)
}

/// Why a request is [`Unroutable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnroutableReason {
    /// No subset the policy allows has an instance (ejected ones count as absent).
    NoMatch,
    /// `subset` has instances but none is ready, and the policy does not fall back.
    Unready {
        /// The subset.
        subset: OwnedSubset,
        /// How many instances it has.
        present: usize,
    },
}

impl Unroutable {
    /// The target service.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The request's lane (`None`: baseline).
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The version the request pinned for the service.
    pub fn pin(&self) -> Option<&Version> {
        self.pin.as_ref()
    }

    /// The policy's fallback.
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// Why.
    pub fn reason(&self) -> &UnroutableReason {
        &self.reason
    }
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

impl fmt::Display for Unroutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            UnroutableReason::NoMatch => write!(f, "no instance of `{}` fits", self.service)?,
            UnroutableReason::Unready { subset, present } => write!(
                f,
                "no instance of `{}` is ready for the request: {subset} has {present}, none ready,",
                self.service
            )?,
        }
        match &self.lane {
            Some(lane) => write!(f, " lane `{lane}`")?,
            None => f.write_str(" baseline")?,
        }
        if let Some(pin) = &self.pin {
            write!(f, " pinned to version `{pin}`")?;
        }
        write!(
            f,
            " (policy `{}`, fallback `{}`)",
            self.policy, self.fallback
        )
    }
}

impl std::error::Error for Unroutable {}

/// A policy setting that does not validate: names the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    expected: &'static str,
    found: String,
}

impl ConfigError {
    fn new(field: &'static str, expected: &'static str, found: impl Into<String>) -> Self {
        ConfigError {
            field,
            expected,
            found: found.into(),
        }
    }

    /// The field at fault.
    pub fn field(&self) -> &str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid matching policy: field `{}` expected {}, found {:?}",
            self.field, self.expected, self.found
        )
    }
}

impl std::error::Error for ConfigError {}

fn some<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The serde form of a [`Policy`]. Every field is optional: a missing one keeps the
/// value of the `preset` (or of [`Policy::new`]); a label key set to `null` is ignored.
///
/// ```
/// use gray_core::matching::{Fallback, Policy, PolicyConfig};
///
/// let policy: Policy = serde_json::from_str(
///     r#"{"preset": "seed-000", "own_lane": "gray", "fallback": "any"}"#,
/// )?;
/// assert_eq!(policy.name(), "seed-000");
/// assert_eq!(policy.fallback(), Fallback::Any);
/// assert_eq!(policy.own_lane().unwrap(), "gray");
///
/// let err = serde_json::from_str::<Policy>(r#"{"fallback": "sometimes"}"#).unwrap_err();
/// assert!(err.to_string().contains("field `fallback`"), "{err}");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy's name (default: the preset's, else `default`).
    pub name: Option<String>,
    /// Start from this preset: `seed-000` … `seed-004`.
    pub preset: Option<String>,
    /// The lane label; `null` to ignore lane labels.
    #[serde(deserialize_with = "some", skip_serializing_if = "Option::is_none")]
    pub lane_key: Option<Option<String>>,
    /// The boolean flag label; `null` to ignore it.
    #[serde(deserialize_with = "some", skip_serializing_if = "Option::is_none")]
    pub flag_key: Option<Option<String>>,
    /// The lane the flag puts an instance in.
    pub flag_lane: Option<String>,
    /// `lenient` or `exact`.
    pub flag_values: Option<String>,
    /// The one-version label; `null` to ignore it.
    #[serde(deserialize_with = "some", skip_serializing_if = "Option::is_none")]
    pub version_key: Option<Option<String>>,
    /// The version-list label; `null` to ignore it.
    #[serde(deserialize_with = "some", skip_serializing_if = "Option::is_none")]
    pub versions_key: Option<Option<String>>,
    /// `baseline` or `wildcard`.
    pub unlabelled: Option<String>,
    /// `none`, `baseline` or `any`.
    pub fallback: Option<String>,
    /// `fail` or `fallback`.
    pub on_unready: Option<String>,
    /// The calling instance's own lane, for requests without a context.
    #[serde(deserialize_with = "some", skip_serializing_if = "Option::is_none")]
    pub own_lane: Option<Option<String>>,
    /// Whether gray routing is on.
    pub enabled: Option<bool>,
}

fn label_key(field: &'static str, key: Option<String>) -> Result<Option<String>, ConfigError> {
    match key {
        Some(k) if k.is_empty() || k.len() > 256 || k.chars().any(char::is_control) => {
            Err(ConfigError::new(
                field,
                "a label key of 1 to 256 printable characters, or null",
                k,
            ))
        }
        other => Ok(other),
    }
}

fn choice<T: Copy>(
    field: &'static str,
    expected: &'static str,
    value: &str,
    options: &[(&str, T)],
) -> Result<T, ConfigError> {
    options
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| ConfigError::new(field, expected, value))
}

impl TryFrom<PolicyConfig> for Policy {
    type Error = ConfigError;

    fn try_from(c: PolicyConfig) -> Result<Self, ConfigError> {
        let mut p = match c.preset.as_deref() {
            Some(name) => Policy::preset(name).ok_or_else(|| {
                ConfigError::new(
                    "preset",
                    "one of `seed-000`, `seed-001`, `seed-002`, `seed-003`, `seed-004`",
                    name,
                )
            })?,
            None => Policy::new(),
        };
        if let Some(name) = c.name {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    "name",
                    "a name of 1 to 128 printable characters",
                    name,
                ));
            }
            p.name = name.into();
        }
        if let Some(k) = c.lane_key {
            p.lane_key = label_key("lane_key", k)?.map(Into::into);
        }
        if let Some(k) = c.flag_key {
            p.flag_key = label_key("flag_key", k)?.map(Into::into);
        }
        if let Some(k) = c.version_key {
            p.version_key = label_key("version_key", k)?.map(Into::into);
        }
        if let Some(k) = c.versions_key {
            p.versions_key = label_key("versions_key", k)?.map(Into::into);
        }
        if p.lane_key.is_some() && p.lane_key == p.flag_key {
            let found = p.flag_key.as_deref().unwrap_or_default();
            return Err(ConfigError::new(
                "flag_key",
                "a label key different from `lane_key`",
                found,
            ));
        }
        if p.version_key.is_some() && p.version_key == p.versions_key {
            let found = p.versions_key.as_deref().unwrap_or_default();
            return Err(ConfigError::new(
                "versions_key",
                "a label key different from `version_key`",
                found,
            ));
        }
        if let Some(lane) = c.flag_lane {
            p.flag_lane = Lane::new(&lane).map_err(|_| {
                ConfigError::new(
                    "flag_lane",
                    "a lane name (ASCII letters, digits, '.', '_', '-', at most 64 bytes)",
                    lane,
                )
            })?;
        }
        if let Some(lane) = c.own_lane {
            p.own_lane = match lane {
                Some(lane) => Some(Lane::new(&lane).map_err(|_| {
                    ConfigError::new(
                        "own_lane",
                        "a lane name (ASCII letters, digits, '.', '_', '-', at most 64 bytes) or null",
                        lane,
                    )
                })?),
                None => None,
            };
        }
        if let Some(v) = c.flag_values {
            p.flag_values = choice(
                "flag_values",
                "one of `lenient`, `exact`",
                &v,
                &[
                    ("lenient", FlagValues::Lenient),
                    ("exact", FlagValues::Exact),
                ],
            )?;
        }
        if let Some(v) = c.unlabelled {
            p.unlabelled = choice(
                "unlabelled",
                "one of `baseline`, `wildcard`",
                &v,
                &[
                    ("baseline", Unlabelled::Baseline),
                    ("wildcard", Unlabelled::Wildcard),
                ],
            )?;
        }
        if let Some(v) = c.fallback {
            p.fallback = choice(
                "fallback",
                "one of `none`, `baseline`, `any`",
                &v,
                &[
                    ("none", Fallback::None),
                    ("baseline", Fallback::Baseline),
                    ("any", Fallback::Any),
                ],
            )?;
        }
        if let Some(v) = c.on_unready {
            p.on_unready = choice(
                "on_unready",
                "one of `fail`, `fallback`",
                &v,
                &[("fail", OnUnready::Fail), ("fallback", OnUnready::Fallback)],
            )?;
        }
        if let Some(enabled) = c.enabled {
            p.enabled = enabled;
        }
        Ok(p)
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let config = PolicyConfig::deserialize(d)?;
        Policy::try_from(config).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Carriers, Pins,
        codec::{PlainHeader, RouteHeader},
    };
    use http::{HeaderMap, HeaderName, HeaderValue};

    fn lane(s: &str) -> Lane {
        Lane::new(s).unwrap()
    }

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::from_iter(pairs.iter().copied())
    }

    /// Decides over `(id, labels)` instances, all ready, and returns the candidates.
    fn route<'a>(
        policy: &Policy,
        ctx: Option<&Stain>,
        instances: &'a [(&'a str, Labels)],
    ) -> Option<Vec<&'a str>> {
        let cands = instances
            .iter()
            .map(|(id, l)| Candidate::new(*id, l, Availability::Ready));
        policy
            .decide("svc-b", ctx, cands)
            .candidates()
            .map(<[_]>::to_vec)
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, val) in pairs {
            h.append(*k, HeaderValue::from_static(val));
        }
        h
    }

    #[test]
    fn classify_reads_lane_flag_and_versions() {
        let p = Policy::new();
        let c = p.classify(&labels(&[("gray", "True"), ("versions", " 1.0, 2.0,,1.0")]));
        assert_eq!(c.lane().unwrap(), "gray");
        assert_eq!(c.versions(), &[v("1.0"), v("2.0")]);
        let c = p.classify(&labels(&[("gray", "true"), ("lane", "canary")]));
        assert_eq!(c.lane().unwrap(), "canary", "the lane label wins");
        let c = p.classify(&labels(&[("gray", "yes"), ("lane", "bad name")]));
        assert_eq!(c.lane(), None, "invalid values count as absent");
        let c = p.classify(&labels(&[("version", "3"), ("versions", "3,4")]));
        assert_eq!(c.versions(), &[v("3"), v("4")]);
        let exact = Policy::seed_003();
        assert_eq!(exact.classify(&labels(&[("gray", "TRUE")])).lane(), None);
        assert_eq!(
            exact.classify(&labels(&[("gray", "true")])).lane().unwrap(),
            "gray"
        );
    }

    #[test]
    fn pin_decides_first_and_lane_is_the_next_fallback() {
        let p = Policy::new().with_fallback(Fallback::Baseline);
        let pins = Pins::new(None, [("svc-b", v("2"))]).unwrap();
        let ctx = Stain::in_lane(lane("gray")).with_pins(pins);
        let key = p.key("svc-b", Some(&ctx));
        let chain: Vec<_> = p.chain(&key).iter().collect();
        let (g, two) = (lane("gray"), v("2"));
        assert_eq!(
            chain,
            [Subset::Version(&two), Subset::Lane(&g), Subset::Baseline]
        );
        // The pin is for svc-b only: svc-c sees the lane.
        let key_c = p.key("svc-c", Some(&ctx));
        assert_eq!(key_c.pin(), None);
        let inst = [
            ("gray-v1", labels(&[("gray", "true"), ("version", "1")])),
            ("base-v2", labels(&[("version", "2")])),
            ("base-v1", labels(&[("version", "1")])),
        ];
        assert_eq!(route(&p, Some(&ctx), &inst).unwrap(), ["base-v2"]);
        assert_eq!(route(&p, Some(&ctx), &inst[..1]).unwrap(), ["gray-v1"]);
        assert_eq!(
            route(&p, Some(&ctx), &[inst[0].clone(), inst[2].clone()]).unwrap(),
            ["gray-v1"]
        );
        assert_eq!(route(&p, Some(&ctx), &inst[2..]).unwrap(), ["base-v1"]);
    }

    #[test]
    fn own_lane_applies_only_without_a_context() {
        let p = Policy::seed_000().with_own_lane(Some(lane("gray")));
        let inst = [("b", labels(&[])), ("g", labels(&[("gray", "true")]))];
        assert_eq!(route(&p, None, &inst).unwrap(), ["g"]);
        assert_eq!(route(&p, Some(&Stain::baseline()), &inst).unwrap(), ["b"]);
        let d = p.decide(
            "svc-b",
            None,
            inst.iter()
                .map(|(i, l)| Candidate::new(*i, l, Availability::Ready)),
        );
        assert!(d.own_lane);
    }

    #[test]
    fn unready_subset_fails_or_falls_back() {
        let inst_labels = [labels(&[("gray", "true")]), labels(&[])];
        let cands = |a: Availability| {
            vec![
                Candidate::new("g", &inst_labels[0], a),
                Candidate::new("b", &inst_labels[1], Availability::Ready),
            ]
        };
        let ctx = Stain::in_lane(lane("gray"));
        let p = Policy::seed_000();
        let d = p.decide("svc-b", Some(&ctx), cands(Availability::Unready));
        let err = d.error().unwrap();
        assert!(matches!(
            err.reason(),
            UnroutableReason::Unready { present: 1, .. }
        ));
        assert_eq!(
            err.to_string(),
            "no instance of `svc-b` is ready for the request: lane `gray` has 1, none ready, \
             lane `gray` (policy `seed-000`, fallback `baseline`)"
        );
        let p = p.with_on_unready(OnUnready::Fallback);
        let d = p.decide("svc-b", Some(&ctx), cands(Availability::Unready));
        assert_eq!(d.candidates().unwrap(), ["b"]);
        // Ejected instances are absent: the fallback applies whatever `on_unready` says.
        let d = Policy::seed_000().decide("svc-b", Some(&ctx), cands(Availability::Ejected));
        assert_eq!(d.candidates().unwrap(), ["b"]);
    }

    #[test]
    fn no_match_error_names_service_lane_and_policy() {
        let p = Policy::new();
        let ctx = Stain::in_lane(lane("canary"));
        let l = labels(&[]);
        let d = p.decide(
            "svc-b",
            Some(&ctx),
            [Candidate::new(1, &l, Availability::Ready)],
        );
        let err = d.error().unwrap();
        assert_eq!(
            err.to_string(),
            "no instance of `svc-b` fits lane `canary` (policy `default`, fallback `none`)"
        );
        assert_eq!(err.service(), "svc-b");
        assert_eq!(err.lane().unwrap(), "canary");
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["outcome"]["unroutable"]["reason"], "nomatch");
    }

    #[test]
    fn seed_000_table_row() {
        let p = Policy::seed_000().with_own_lane(Some(lane("gray")));
        let carriers = Carriers::new().with(PlainHeader::flag(
            HeaderName::from_static("gray"),
            lane("gray"),
        ));
        let both = [
            ("base", labels(&[("gray", "false")])),
            ("bad", labels(&[("gray", "maybe")])),
            ("none", labels(&[])),
            ("gray", labels(&[("gray", "TRUE")])),
        ];
        let ctx = |h: &[(&'static str, &'static str)]| carriers.extract(&headers(h));
        // gray → gray
        let gray = ctx(&[("gray", "True")]);
        assert_eq!(route(&p, gray.as_ref(), &both).unwrap(), ["gray"]);
        // gray, no gray instance → baseline
        assert_eq!(
            route(&p, gray.as_ref(), &both[..3]).unwrap(),
            ["base", "bad", "none"]
        );
        // false / garbage → baseline only
        for h in [[("gray", "false")], [("gray", "FALSE")], [("gray", "yes")]] {
            let c = ctx(&h).unwrap_or_default();
            assert_eq!(route(&p, Some(&c), &both).unwrap(), ["base", "bad", "none"]);
        }
        // baseline with only gray instances → error
        assert!(route(&p, Some(&Stain::baseline()), &both[3..]).is_none());
        // absent → the caller's own flag
        assert_eq!(route(&p, None, &both).unwrap(), ["gray"]);
        let base_caller = Policy::seed_000();
        assert_eq!(
            route(&base_caller, None, &both).unwrap(),
            ["base", "bad", "none"]
        );
    }

    #[test]
    fn seed_001_table_row() {
        let p = Policy::seed_001();
        let carriers =
            Carriers::new().with(PlainHeader::version(HeaderName::from_static("version")));
        let inst = [
            ("v1", labels(&[("version", "1.0")])),
            ("v2", labels(&[("version", "2.0")])),
            ("any", labels(&[])),
        ];
        let c = carriers.extract(&headers(&[("version", "2.0")]));
        assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v2", "any"]);
        let c = carriers.extract(&headers(&[]));
        assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v1", "v2", "any"]);
        let c = carriers.extract(&headers(&[("version", "3.0")]));
        assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["any"]);
        assert!(route(&p, c.as_ref(), &inst[..2]).is_none());
        // The global switch.
        let off = Policy::seed_001().with_enabled(false);
        let c = carriers.extract(&headers(&[("version", "2.0")]));
        assert_eq!(route(&off, c.as_ref(), &inst).unwrap(), ["v1", "v2", "any"]);
    }

    #[test]
    fn seed_002_table_row() {
        let p = Policy::seed_002();
        let carriers =
            Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
        let inst = [
            ("v2", labels(&[("version", "v2")])),
            ("v3", labels(&[("version", "v3")])),
            ("plain", labels(&[])),
        ];
        let h = headers(&[("x-gray-info", r#"{"all":"v2","custom":{"svc-b":"v3"}}"#)]);
        let c = carriers.extract(&h);
        assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v3"], "custom wins");
        let h = headers(&[("x-gray-info", r#"{"all":"v2"}"#)]);
        let c = carriers.extract(&h);
        assert_eq!(route(&p, c.as_ref(), &inst).unwrap(), ["v2"]);
        let h = headers(&[("x-gray-info", r#"{"all":"v9"}"#)]);
        let c = carriers.extract(&h);
        assert_eq!(
            route(&p, c.as_ref(), &inst).unwrap(),
            ["v2", "v3", "plain"],
            "no match → all"
        );
        // Absent header: the default rule from config is a context the caller supplies.
        let default_rule = Stain::pinned(Pins::all(v("v2")));
        assert_eq!(route(&p, Some(&default_rule), &inst).unwrap(), ["v2"]);
        assert_eq!(route(&p, None, &inst).unwrap(), ["v2", "v3", "plain"]);
    }

    #[test]
    fn seed_003_table_row() {
        let p = Policy::seed_003();
        let carriers = Carriers::new().with(PlainHeader::flag(
            HeaderName::from_static("x-gray-flag"),
            lane("gray"),
        ));
        let inst = [
            ("g", labels(&[("gray", "true")])),
            ("b", labels(&[("gray", "false")])),
            ("n", labels(&[])),
        ];
        let gray = carriers.extract(&headers(&[("x-gray-flag", "true")]));
        let base = carriers.extract(&headers(&[("x-gray-flag", "false")]));
        assert_eq!(route(&p, gray.as_ref(), &inst).unwrap(), ["g"]);
        assert_eq!(route(&p, base.as_ref(), &inst).unwrap(), ["b", "n"]);
        assert_eq!(route(&p, gray.as_ref(), &inst[1..]).unwrap(), ["b", "n"]);
        assert_eq!(
            route(&p, base.as_ref(), &inst[..1]).unwrap(),
            ["g"],
            "→ all"
        );
    }

    #[test]
    fn seed_004_table_row() {
        let p = Policy::seed_004();
        let inst = [
            ("a", labels(&[("versions", "1.0,2.0")])),
            ("b", labels(&[("versions", "2.0")])),
            ("c", labels(&[])),
        ];
        let pinned = |s| Stain::pinned(Pins::all(v(s)));
        assert_eq!(route(&p, Some(&pinned("1.0")), &inst).unwrap(), ["a"]);
        assert_eq!(route(&p, Some(&pinned("2.0")), &inst).unwrap(), ["a", "b"]);
        assert!(route(&p, Some(&pinned("3.0")), &inst).is_none());
        assert_eq!(
            route(&p, Some(&Stain::baseline()), &inst).unwrap(),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn wildcard_instances_serve_every_lane() {
        let p = Policy::new().with_unlabelled(Unlabelled::Wildcard);
        let inst = [
            ("blue", labels(&[("lane", "blue")])),
            ("plain", labels(&[])),
        ];
        let ctx = Stain::in_lane(lane("green"));
        assert_eq!(route(&p, Some(&ctx), &inst).unwrap(), ["plain"]);
        let ctx = Stain::in_lane(lane("blue"));
        assert_eq!(route(&p, Some(&ctx), &inst).unwrap(), ["blue", "plain"]);
        assert_eq!(
            route(&p, Some(&Stain::baseline()), &inst).unwrap(),
            ["plain"]
        );
    }

    #[test]
    fn config_validation_names_the_field() {
        let err = |json: &str| {
            serde_json::from_str::<Policy>(json)
                .unwrap_err()
                .to_string()
        };
        assert!(err(r#"{"preset":"seed-9"}"#).contains("field `preset`"));
        assert!(err(r#"{"lane_key":""}"#).contains("field `lane_key`"));
        assert!(err(r#"{"flag_lane":"a b"}"#).contains("field `flag_lane`"));
        assert!(err(r#"{"own_lane":"a/b"}"#).contains("field `own_lane`"));
        assert!(err(r#"{"unlabelled":"x"}"#).contains("field `unlabelled`"));
        assert!(err(r#"{"on_unready":"x"}"#).contains("field `on_unready`"));
        assert!(err(r#"{"flag_values":"x"}"#).contains("field `flag_values`"));
        assert!(err(r#"{"lane_key":"k","flag_key":"k"}"#).contains("field `flag_key`"));
        assert!(err(r#"{"version_key":"k","versions_key":"k"}"#).contains("field `versions_key`"));
        assert!(err(r#"{"fallbak":"any"}"#).contains("unknown field `fallbak`"));
        let p: Policy = serde_json::from_str(
            r#"{"preset":"seed-003","name":"edge","lane_key":"lane","version_key":null,"unlabelled":"wildcard","on_unready":"fallback","enabled":false}"#,
        )
        .unwrap();
        assert_eq!(p.name(), "edge");
        assert_eq!(p.unlabelled(), Unlabelled::Wildcard);
        assert_eq!(p.on_unready(), OnUnready::Fallback);
        assert!(!p.is_enabled());
        assert!(p.reads_lanes() && !p.reads_versions());
        let p: Policy = serde_json::from_str("{}").unwrap();
        assert_eq!(p, Policy::new());
    }
}
