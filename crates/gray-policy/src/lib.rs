//! Matching: which instances may serve a request, and what happens when none fits.
//!
//! A [`Policy`] holds the whole routing semantics of one outbound target, with no I/O:
//!
//! - **Instance side**: the registry labels of an instance give it a lane and the versions
//!   it serves. The lane comes from the label `lane=<name>` and/or a boolean flag
//!   `gray=true|false` (the flag puts the instance in the *flag lane*, `gray` by default;
//!   when both are present, the `lane` label wins). The flag is read
//!   [leniently](FlagValues::Lenient) (`TRUE`, `True`; anything else is false, as in seed
//!   000) or [exactly](FlagValues::Exact) (only `true`, as in seed 003). Versions come from
//!   `version=2.0` and the list `versions=1.0,2.0`. Every label key is configurable and can
//!   be switched off. A label value that is not a valid name counts as absent (a `tracing`
//!   event at debug level, target `gray::matching`, says so).
//! - **Unlabelled instances** ([`Unlabelled`]): an instance without a lane is *baseline*;
//!   with [`Unlabelled::Wildcard`] it also serves every lane. An instance without versions
//!   serves only requests that pin no version; with `Wildcard` it serves every version.
//! - **Request side**: what counts of a request's [`Stain`](gray_core::Stain) for a service is
//!   its lane and the version it pins *for that service* (a per-service pin wins over
//!   `all`). A request that carries no stain at all (a background job, a message consumer)
//!   or an [unstained](gray_core::Stain::unstained) one (no carrier on the inbound request,
//!   as gray-tower's `ExtractStainLayer` marks it) takes the calling instance's own lane
//!   ([`Policy::with_own_lane`], seed 000); a request whose stain is an explicit baseline
//!   (`gray: false`) stays baseline. When the policy reads no lane label the request's lane
//!   is ignored, and when it reads no version label its pins are ignored; a
//!   [disabled](Policy::with_enabled) policy routes every request as baseline.
//! - **Lane and pin together**: the pin is the more specific stain, so it decides first.
//!   The request is served by the instances of the pinned version, whatever their lane;
//!   its lane matters only when falling back.
//! - **Unstained requests** go to the baseline instances: every instance without a lane.
//!   When no instance has a lane (a version-only policy such as seeds 001, 002 and 004)
//!   that is every instance: a request without a version matches anything.
//! - **Fallback** ([`Fallback`]), tried in order: first the primary subset (the pinned
//!   version, else the lane, else baseline), then with `baseline` the lane (for a pinned
//!   request) and the baseline instances, then with `any` every instance. A baseline
//!   request never falls back to gray instances unless the fallback is `any`.
//! - **Readiness** ([`OnUnready`]): a subset that has instances but none ready either fails
//!   the request (`fail`, the default) or counts as absent so the fallback goes on
//!   (`fallback`). Ejected (unhealthy) instances always count as absent.
//!
//! [`Policy::decide`] runs all of this over a plain instance list and returns the whole
//! [`Decision`] as a value, which is what a gateway shows on its admin endpoint;
//! `gray-balance` runs the same walk over its index on every request.
//!
//! One preset per seed reproduces its table row: [`Policy::seed_000`] to
//! [`Policy::seed_004`], also by name ([`Policy::preset`]).
//!
//! A policy is configured in code (the `with_*` setters) or in a file, through
//! [`PolicyConfig`] (read by gray-config's loader; see [`WithPolicy`] for the
//! strict table that puts a policy's keys next to a program's own).
//!
//! ```
//! use gray_core::{Stain, Labels, Lane};
//! use gray_policy::{Availability, Candidate, Fallback, Policy};
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
//! let stain = Stain::in_lane(Lane::new("gray")?);
//! let decision = policy.decide("svc-b", Some(&stain), instances.clone());
//! assert_eq!(decision.candidates(), Some(&["g1"][..]));
//!
//! // ...a baseline one never does...
//! let decision = policy.decide("svc-b", Some(&Stain::baseline()), instances.clone());
//! assert_eq!(decision.candidates(), Some(&["b1"][..]));
//!
//! // ...and a gray request falls back to baseline when no gray instance is left.
//! let decision = policy.decide("svc-b", Some(&stain), instances[..1].to_vec());
//! assert_eq!(decision.candidates(), Some(&["b1"][..]));
//! assert!(decision.fallback_taken());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod config;
mod decision;
mod error;
mod policy;
mod presets;
pub mod route;
mod subset;
mod table;

pub use self::{
    config::PolicyConfig,
    decision::{Availability, Candidate, Decision, Outcome, Step},
    error::{PolicyError, Unroutable, UnroutableReason},
    policy::{Fallback, FlagValues, OnUnready, Policy, Unlabelled},
    subset::OwnedSubset,
    table::WithPolicy,
};

#[cfg(test)]
mod tests;
