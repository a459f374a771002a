//! The errors of matching: [`Unroutable`] (no instance may serve a request) and
//! [`PolicyError`] (a policy setting that does not validate).

use std::{fmt, sync::Arc};

use serde::Serialize;

use super::{policy::Fallback, subset::OwnedSubset};
use gray_core::{Lane, Version};

/// No instance may serve the request: the typed error a gateway turns into a 503.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unroutable {
    #[serde(serialize_with = "ser_str")]
    pub(super) service: Arc<str>,
    #[serde(serialize_with = "ser_str")]
    pub(super) policy: Arc<str>,
    pub(super) lane: Option<Lane>,
    pub(super) pin: Option<Version>,
    pub(super) fallback: Fallback,
    pub(super) reason: UnroutableReason,
}

fn ser_str<S: serde::Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s)
}

/// Why a request is [`Unroutable`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
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
    /// Every ready instance of `subset` has `limit` requests in flight already (the
    /// balancer's [`with_max_pending`]); a saturated subset does not fall back.
    ///
    /// [`with_max_pending`]: https://docs.rs/gray-balance/latest/gray_balance/struct.BalanceLayer.html#method.with_max_pending
    Saturated {
        /// The subset.
        subset: OwnedSubset,
        /// The limit per instance.
        limit: u32,
    },
}

impl Unroutable {
    /// The target service.
    #[must_use]
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The policy's name.
    #[must_use]
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The request's lane (`None`: baseline).
    #[must_use]
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The version the request pinned for the service.
    #[must_use]
    pub fn pin(&self) -> Option<&Version> {
        self.pin.as_ref()
    }

    /// The policy's fallback.
    #[must_use]
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// Why.
    #[must_use]
    pub fn reason(&self) -> &UnroutableReason {
        &self.reason
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
            UnroutableReason::Saturated { subset, limit } => write!(
                f,
                "every instance of `{}` that may serve the request is at its limit of {limit} \
                 requests in flight: {subset},",
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
///
/// `Policy::try_from(`[`PolicyConfig`](super::PolicyConfig)`)` returns it; read through
/// gray-config's loader, the same checks fail at the field's line instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    field: &'static str,
    expected: &'static str,
    found: String,
}

impl PolicyError {
    pub(super) fn new(
        field: &'static str,
        expected: &'static str,
        found: impl Into<String>,
    ) -> Self {
        PolicyError {
            field,
            expected,
            found: found.into(),
        }
    }

    /// The field at fault, as [`PolicyConfig`](super::PolicyConfig) names it.
    #[must_use]
    pub fn field(&self) -> &str {
        self.field
    }

    /// What is wrong, without the field: `expected …, found …`.
    pub(super) fn problem(&self) -> impl fmt::Display + '_ {
        struct Problem<'a>(&'a PolicyError);
        impl fmt::Display for Problem<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "expected {}, found {:?}", self.0.expected, self.0.found)
            }
        }
        Problem(self)
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid matching policy: field `{}`: {}",
            self.field,
            self.problem()
        )
    }
}

impl std::error::Error for PolicyError {}
