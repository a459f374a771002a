//! The presets: one per seed, each reproducing its table row.

use super::policy::{
    DEFAULT_VERSION_KEY, DEFAULT_VERSIONS_KEY, Fallback, FlagValues, Policy, Unlabelled,
};

/// The presets' names, in order; what [`Policy::preset`] accepts.
pub(super) const PRESETS: &[&str] = &["seed-000", "seed-001", "seed-002", "seed-003", "seed-004"];

/// What a `preset` key expects, for errors (a test checks that it names every preset).
pub(super) const EXPECTED_PRESET: &str =
    "one of `seed-000`, `seed-001`, `seed-002`, `seed-003`, `seed-004`";

// === impl Policy ===

impl Policy {
    /// Seed 000 (gray-transition component): the flag `gray`, lenient on both sides;
    /// missing or invalid = baseline; a gray request uses gray instances, else baseline
    /// ones; a baseline request uses baseline instances only, none = error. A request
    /// without the header (no stain, or the [unstained](gray_core::Stain::unstained) one
    /// that gray-tower's `ExtractStainLayer` gives it) uses the calling instance's own
    /// flag: pass the instance's lane to [`with_own_lane`](Self::with_own_lane) on a gray
    /// instance. `gray: false`, or any value other than `true`/`false`, is baseline.
    ///
    /// | stain | instance label | fallback |
    /// |---|---|---|
    /// | header `gray: true/false`, case-insensitive, anything else = false; when absent, the calling instance's own gray flag | `gray` metadata, missing/invalid = baseline | gray→gray, else baseline; baseline→baseline only, none = error |
    #[must_use]
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
    #[must_use]
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
    #[must_use]
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
    #[must_use]
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
    #[must_use]
    pub fn seed_004() -> Self {
        Policy::new()
            .with_name("seed-004")
            .with_lane_key(None)
            .with_flag_key(None)
            .with_version_keys(None, Some(DEFAULT_VERSIONS_KEY))
    }

    /// The preset named `seed-000` … `seed-004` (the seed functions above), if any. A
    /// [`PolicyConfig`](super::PolicyConfig) names one in its `preset` key.
    ///
    /// ```
    /// use gray_policy::Policy;
    ///
    /// assert_eq!(Policy::preset("seed-003"), Some(Policy::seed_003()));
    /// assert_eq!(Policy::preset("seed-3"), None);
    /// ```
    #[must_use]
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
}
