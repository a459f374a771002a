//! The gray stain a request carries: an optional lane plus optional version pins, and
//! the inbound `baggage` members it carries onward.
//!
//! No lane means *baseline*. Version pins follow seed 002's route header: `all` pins one
//! version for every service, and a per-service entry wins over `all`.
//!
//! A stain without a lane is one of two things, and routing tells them apart:
//!
//! - [`Stain::unstained`]: the request carried no stain carrier at all, and nobody decided
//!   for it. gray-tower's `ExtractStainLayer` gives it to every request without a carrier.
//!   A balancer routes it by its policy's *own lane* (seed 000: a gray instance keeps its
//!   own traffic gray; gray-policy's `Policy::with_own_lane`), and as baseline when the
//!   policy has none. It is also [`Stain::default`].
//! - [`Stain::baseline`]: an explicit baseline decision, such as `gray: false` on the
//!   request, a malformed carrier, or an edge whose rules put the request in no lane. It is
//!   routed as baseline whatever the policy's own lane.
//!
//! Both are [`is_baseline`](Stain::is_baseline) and both write no carrier onward (the
//! next service then sees an unstained request); they are not equal to each other. With a `baggage`
//! carrier configured, the stain also keeps the inbound request's other W3C `baggage`
//! members ([`InheritedBaggage`]), which every outbound call writes back: they are not part
//! of the routing decision ([`Stain::is_baseline`] ignores them), only carried with it.
//!
//! ```
//! use gray_core::{Stain, Lane, Pins, Version};
//!
//! let stain = Stain::baseline();
//! assert!(stain.is_baseline());
//! assert!(!stain.is_unstained());
//!
//! // No carrier at all: baseline too, but not decided, so an own lane may apply.
//! let unstained = Stain::default();
//! assert!(unstained.is_unstained() && unstained.is_baseline());
//! assert_ne!(unstained, Stain::baseline());
//! // Setting a lane or pins, even to none, is a decision.
//! assert_eq!(unstained.with_lane(None), Stain::baseline());
//!
//! let pins = Pins::new(Some(Version::new("v2")?), [("svc-b", Version::new("v3")?)])?;
//! let stain = Stain::in_lane(Lane::new("gray")?).with_pins(pins);
//! assert_eq!(stain.lane().map(|l| l.as_str()), Some("gray"));
//! assert_eq!(stain.version_for("svc-a").map(|v| v.as_str()), Some("v2"));
//! assert_eq!(stain.version_for("svc-b").map(|v| v.as_str()), Some("v3"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{collections::BTreeMap, fmt, sync::Arc};

use http::HeaderValue;

use crate::{
    name::{Lane, Version},
    w3c::InheritedBaggage,
};

/// The longest service name accepted in version pins, in bytes.
pub const MAX_SERVICE_LEN: usize = 128;

/// What a request is stained with. Cloning costs at most three `Arc` increments.
///
/// Two stains are equal when their lane, pins and inherited baggage are equal and both
/// or neither are [unstained](Stain::unstained): an unstained stain is not equal to an
/// explicit [baseline](Stain::baseline) one, since a balancer routes them differently
/// when its policy has an own lane. [`Stain::default`] is the unstained stain.
#[derive(Clone, PartialEq, Eq)]
pub struct Stain {
    lane: Option<Lane>,
    pins: Option<Arc<Pins>>,
    baggage: Option<InheritedBaggage>,
    /// No carrier and no decision: the request is routed by the policy's own lane.
    unstained: bool,
}

impl Default for Stain {
    /// The [unstained](Stain::unstained) stain: nothing was said about the request.
    fn default() -> Self {
        Stain::unstained()
    }
}

impl Stain {
    /// A request that carried no stain at all and that nobody decided for: baseline
    /// traffic, unless the balancer's policy has an own lane (seed 000), which then
    /// applies. What gray-tower's `ExtractStainLayer` gives a request without any carrier.
    #[must_use]
    pub const fn unstained() -> Self {
        Stain {
            lane: None,
            pins: None,
            baggage: None,
            unstained: true,
        }
    }

    /// An explicit baseline stain (`gray: false`, or an edge's decision): baseline
    /// traffic, whatever the balancer's own lane.
    #[must_use]
    pub const fn baseline() -> Self {
        Stain {
            lane: None,
            pins: None,
            baggage: None,
            unstained: false,
        }
    }

    /// A stain in `lane`, without version pins.
    #[must_use]
    pub fn in_lane(lane: Lane) -> Self {
        Stain {
            lane: Some(lane),
            pins: None,
            baggage: None,
            unstained: false,
        }
    }

    /// A stain with only version pins.
    pub fn pinned(pins: Pins) -> Self {
        Stain::baseline().with_pins(pins)
    }

    /// This stain with its lane replaced. Setting the lane, even to `None`, is a decision:
    /// the result is not [unstained](Stain::unstained).
    #[must_use]
    pub fn with_lane(mut self, lane: Option<Lane>) -> Self {
        self.lane = lane;
        self.unstained = false;
        self
    }

    /// This stain with its version pins replaced. Empty pins are dropped. The result is
    /// not [unstained](Stain::unstained).
    #[must_use]
    pub fn with_pins(mut self, pins: Pins) -> Self {
        self.pins = (!pins.is_empty()).then(|| Arc::new(pins));
        self.unstained = false;
        self
    }

    /// This stain with shared version pins replaced. The result is not
    /// [unstained](Stain::unstained).
    #[must_use]
    pub fn with_shared_pins(mut self, pins: Option<Arc<Pins>>) -> Self {
        self.pins = pins.filter(|p| !p.is_empty());
        self.unstained = false;
        self
    }

    /// This stain with its inherited `baggage` members replaced (an
    /// [unstained](Stain::unstained) stain stays unstained).
    #[must_use]
    pub fn with_baggage(mut self, baggage: Option<InheritedBaggage>) -> Self {
        self.baggage = baggage;
        self
    }

    /// The inbound `baggage` members (other than the stain's own) this stain carries
    /// onward; `None` when the request had none or no `baggage` carrier is configured.
    #[must_use]
    pub fn baggage(&self) -> Option<&InheritedBaggage> {
        self.baggage.as_ref()
    }

    /// The lane, or `None` for baseline.
    #[must_use]
    pub fn lane(&self) -> Option<&Lane> {
        self.lane.as_ref()
    }

    /// The version pins, if any.
    #[must_use]
    pub fn pins(&self) -> Option<&Pins> {
        self.pins.as_deref()
    }

    /// The version pins as the shared handle (cheap to clone).
    #[must_use]
    pub fn shared_pins(&self) -> Option<&Arc<Pins>> {
        self.pins.as_ref()
    }

    /// `true` when the stain carries neither a lane nor a version pin (inherited
    /// `baggage` members do not count): an explicit baseline or an
    /// [unstained](Stain::unstained) stain.
    #[must_use]
    pub fn is_baseline(&self) -> bool {
        self.lane.is_none() && self.pins.is_none()
    }

    /// `true` for the [unstained](Stain::unstained) stain (whatever baggage it inherits):
    /// no carrier, no decision, so a policy's own lane applies.
    #[must_use]
    pub fn is_unstained(&self) -> bool {
        self.unstained
    }

    /// The version pinned for `service`: its own entry first, else `all`.
    #[must_use]
    pub fn version_for(&self, service: &str) -> Option<&Version> {
        self.pins.as_deref().and_then(|p| p.version_for(service))
    }
}

impl fmt::Debug for Stain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Stain");
        match &self.lane {
            Some(lane) => d.field("lane", lane),
            None if self.unstained => d.field("lane", &"unstained"),
            None => d.field("lane", &"baseline"),
        };
        if let Some(pins) = &self.pins {
            d.field("pins", pins);
        }
        if let Some(baggage) = &self.baggage {
            d.field("baggage", baggage);
        }
        d.finish()
    }
}

/// A name that is not a valid service name in version pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidService {
    reason: &'static str,
}

impl fmt::Display for InvalidService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid service name in version pins: {}", self.reason)
    }
}

impl std::error::Error for InvalidService {}

pub(crate) fn validate_service(name: &str) -> Result<(), InvalidService> {
    if name.is_empty() {
        return Err(InvalidService {
            reason: "it is empty",
        });
    }
    if name.len() > MAX_SERVICE_LEN {
        return Err(InvalidService {
            reason: "it is longer than 128 bytes",
        });
    }
    if name.bytes().any(|b| b.is_ascii_control()) {
        return Err(InvalidService {
            reason: "it contains a control character",
        });
    }
    Ok(())
}

/// Version pins: one version for all services and/or one per service (custom wins).
///
/// Pins are immutable once built; they keep their encoded route-header form so that
/// re-emitting them copies nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Pins {
    all: Option<Version>,
    services: BTreeMap<Box<str>, Version>,
    encoded: HeaderValue,
}

impl Pins {
    /// Builds pins from `all` and per-service entries.
    pub fn new<S: AsRef<str>>(
        all: Option<Version>,
        services: impl IntoIterator<Item = (S, Version)>,
    ) -> Result<Self, InvalidService> {
        let mut map = BTreeMap::new();
        for (service, version) in services {
            let service = service.as_ref();
            validate_service(service)?;
            map.insert(Box::<str>::from(service), version);
        }
        Ok(Self::from_parts(all, map, None))
    }

    /// Pins one version for every service.
    pub fn all(version: Version) -> Self {
        Self::from_parts(Some(version), BTreeMap::new(), None)
    }

    pub(crate) fn from_parts(
        all: Option<Version>,
        services: BTreeMap<Box<str>, Version>,
        encoded: Option<HeaderValue>,
    ) -> Self {
        let encoded = encoded.unwrap_or_else(|| encode_route(&all, &services));
        Pins {
            all,
            services,
            encoded,
        }
    }

    /// The version pinned for every service without its own entry.
    pub fn all_version(&self) -> Option<&Version> {
        self.all.as_ref()
    }

    /// The per-service entries, sorted by service name.
    pub fn services(&self) -> impl Iterator<Item = (&str, &Version)> {
        self.services.iter().map(|(k, v)| (&**k, v))
    }

    /// The version pinned for `service`: its own entry first, else `all`.
    pub fn version_for(&self, service: &str) -> Option<&Version> {
        self.services.get(service).or(self.all.as_ref())
    }

    /// `true` when nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.all.is_none() && self.services.is_empty()
    }

    /// The pins in seed 002's JSON route-header form, `{"all":"v2","custom":{"svc-b":"v3"}}`.
    pub fn route_header_value(&self) -> &HeaderValue {
        &self.encoded
    }
}

impl fmt::Debug for Pins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pins")
            .field("all", &self.all)
            .field("custom", &self.services)
            .finish()
    }
}

fn encode_route(all: &Option<Version>, services: &BTreeMap<Box<str>, Version>) -> HeaderValue {
    #[derive(serde::Serialize)]
    struct Route<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        all: Option<&'a str>,
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        custom: BTreeMap<&'a str, &'a str>,
    }
    let route = Route {
        all: all.as_ref().map(Version::as_str),
        custom: services.iter().map(|(k, v)| (&**k, v.as_str())).collect(),
    };
    // Versions are tokens and service names have no control characters, so the JSON is
    // a valid header value; serde_json escapes everything else.
    let json = serde_json::to_vec(&route).unwrap_or_else(|_| b"{}".to_vec());
    HeaderValue::from_bytes(&json).unwrap_or_else(|_| HeaderValue::from_static("{}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    #[test]
    fn custom_wins_over_all() {
        let pins = Pins::new(Some(v("v2")), [("svc-b", v("v3"))]).unwrap();
        assert_eq!(pins.version_for("svc-b").unwrap(), "v3");
        assert_eq!(pins.version_for("svc-c").unwrap(), "v2");
        assert_eq!(
            pins.route_header_value(),
            r#"{"all":"v2","custom":{"svc-b":"v3"}}"#
        );
    }

    #[test]
    fn empty_pins_are_dropped() {
        let pins = Pins::new::<&str>(None, []).unwrap();
        assert!(Stain::pinned(pins).is_baseline());
    }

    #[test]
    fn unstained_is_baseline_but_not_a_decision() {
        let unstained = Stain::unstained();
        assert_eq!(Stain::default(), unstained);
        assert!(unstained.is_baseline() && unstained.is_unstained());
        assert!(!Stain::baseline().is_unstained());
        assert_ne!(unstained, Stain::baseline());
        // Inherited baggage is not a decision.
        assert!(unstained.clone().with_baggage(None).is_unstained());
        // A lane or pins, even none, is.
        assert_eq!(unstained.clone().with_lane(None), Stain::baseline());
        assert_eq!(unstained.clone().with_shared_pins(None), Stain::baseline());
        let pinned = unstained.with_pins(Pins::all(v("2")));
        assert!(!pinned.is_unstained() && !pinned.is_baseline());
        assert_eq!(
            format!("{:?}", Stain::unstained()),
            r#"Stain { lane: "unstained" }"#
        );
    }

    #[test]
    fn bad_service_names_are_rejected() {
        assert!(Pins::new(None, [("", v("1"))]).is_err());
        assert!(Pins::new(None, [("a\nb", v("1"))]).is_err());
    }
}
