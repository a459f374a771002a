//! Wire codecs: how a [`Stain`] travels in HTTP headers.
//!
//! Each carrier is configured by header name (or, for `baggage`, by member key):
//!
//! | carrier | example | carries |
//! |---|---|---|
//! | [`PlainHeader::flag`] | `gray: true` (seed 000; `TRUE`, `True` too) | one lane, as a lenient boolean |
//! | [`PlainHeader::lane`] | `x-gray-lane: canary-2` | a lane name |
//! | [`PlainHeader::version`] | `version: 2.0` (seed 001) | a version pinned for all services |
//! | [`RouteHeader`] | `x-gray-info: {"all":"v2","custom":{"svc-b":"v3"}}` (seed 002) | version pins |
//! | [`BaggageMember`] | `baggage: userId=42,gray.lane=canary` (W3C) | a lane, and every other member of the request ([`InheritedBaggage`]) |
//! | [`Carrier::custom`] | a header format of your own ([`CustomCarrier`]) | what its `decode` yields |
//!
//! [`Carriers`] bundles the ones a service uses. [`Carriers::default`] is `x-gray-lane` plus
//! `x-gray-info`; [`Carriers::with_baggage`] adds the `baggage` member
//! [`DEFAULT_BAGGAGE_KEY`] (`gray.lane`). Configure the same carriers on the server layer
//! and on the clients.
//!
//! # Lane names are case-insensitive
//!
//! `x-gray-lane: Gray`, `x-gray-lane: GRAY` and `gray.lane=gray` are the same lane, `gray`:
//! every lane is lowercased when it is decoded or built (from a header, a rule file or an
//! instance label `lane=Gray` alike) and interned, so no spelling falls through to baseline
//! unnoticed. Version names are case-sensitive. See [`crate::name`].
//!
//! # Reading
//!
//! Reading is lenient: a carrier that is malformed or oversized contributes no stain (the
//! request is unstained unless another carrier stains it) and a `tracing` event at debug
//! level, target `gray::codec`, says why. Nothing on this path panics or fails the request.
//!
//! **Duplicates:** a header that appears more than once is read as its first value, as the
//! seeds' `request.getHeader` does; the later values are ignored. The same holds for the
//! stain's member of `baggage`: `gray.lane=gray,gray.lane=blue` is read as `gray` (the first
//! well-formed member of that key, across every `baggage` line).
//!
//! When several carriers are present, the first one in the list that yields a lane
//! (or an explicit baseline, such as `gray: false`) decides the lane, and the first one
//! that yields version pins decides the pins.
//!
//! With a [`BaggageMember`] configured, the request's other `baggage` members travel with
//! its stain ([`Stain::baggage`]) and are written onto every outbound call; without one,
//! the `baggage` header is none of gray's business (an OpenTelemetry propagator may own it).
//!
//! # Writing: the decision wins
//!
//! [`Carriers::inject`] states the stain on every carrier, whatever the outbound request
//! already holds: a stale, duplicated, malformed or conflicting copy is replaced, and a
//! baseline stain removes every carrier (a baseline request never carries a forged
//! `x-gray-lane` onward). Other headers, and the other `baggage` members, stay.
//!
//! ```
//! use gray_core::{Carriers, Stain, Lane, codec::{BaggageMember, PlainHeader}};
//! use http::{HeaderMap, HeaderName, HeaderValue};
//!
//! let carriers = Carriers::default().with_baggage(); // x-gray-lane, x-gray-info, gray.lane
//!
//! let mut inbound = HeaderMap::new();
//! inbound.insert("baggage", HeaderValue::from_static("userId=42;ttl=5,gray.lane=Canary"));
//! let stain = carriers.extract(&inbound).unwrap_or_default();
//! assert_eq!(stain.lane().unwrap(), "canary");
//!
//! // The handler's outbound request: a stale lane header, a baggage member of its own.
//! let mut outbound = HeaderMap::new();
//! outbound.insert("x-gray-lane", HeaderValue::from_static("blue"));
//! outbound.insert("baggage", HeaderValue::from_static("tenant=acme"));
//! carriers.inject(&stain, &mut outbound);
//! assert_eq!(outbound["x-gray-lane"], "canary");
//! assert_eq!(outbound["baggage"], "tenant=acme,userId=42;ttl=5,gray.lane=canary");
//! ```

mod custom;
mod member;
mod outcome;
mod plain;
mod route;

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

use self::member::Own;
pub use self::{
    custom::CustomCarrier,
    member::{
        BaggageMember, DEFAULT_BAGGAGE_KEY, DEFAULT_MAX_MEMBERS, InheritedBaggage,
        InvalidBaggageKey, W3C_MIN_BYTES, W3C_MIN_MEMBERS,
    },
    outcome::{Decoded, Reason, Rejection},
    plain::PlainHeader,
    route::RouteHeader,
};
use crate::{name::Names, stain::Stain};

/// The default cap on a plain header value, in bytes.
pub const DEFAULT_PLAIN_MAX_LEN: usize = 256;
/// The default cap on a JSON route header value, in bytes.
pub const DEFAULT_ROUTE_MAX_LEN: usize = 4096;

/// The header a plain or route carrier lives in, and the cap on its value.
#[derive(Debug, Clone)]
struct OneHeader {
    name: HeaderName,
    max_len: usize,
}

// === impl OneHeader ===

impl OneHeader {
    fn new(name: HeaderName, max_len: usize) -> Self {
        OneHeader { name, max_len }
    }

    /// The value a carrier decodes: the **first** one when the header appears more than
    /// once (as the seeds' `request.getHeader` does), within the cap.
    fn first_value<'a>(
        &self,
        headers: &'a HeaderMap,
    ) -> Result<Option<&'a HeaderValue>, Rejection> {
        let Some(value) = headers.get(&self.name) else {
            return Ok(None);
        };
        let len = value.len();
        if len > self.max_len {
            let max = self.max_len;
            return Err(Rejection::new(&self.name, Reason::TooLong { len, max }));
        }
        if len == 0 {
            return Err(Rejection::new(&self.name, Reason::Empty));
        }
        Ok(Some(value))
    }
}

/// The member keys of the `baggage` carriers among some carriers: members no carrier
/// inherits, since they state the stain.
pub(crate) struct StainKeys<'a>(&'a [Carrier]);

// === impl StainKeys ===

impl<'a> StainKeys<'a> {
    /// No stain key at all.
    pub(crate) fn none() -> StainKeys<'static> {
        StainKeys(&[])
    }

    fn members(&self) -> impl Iterator<Item = &'a BaggageMember> + use<'a> {
        self.0.iter().filter_map(|c| match c {
            Carrier::Baggage(b) => Some(b),
            _ => None,
        })
    }

    /// `true` when `key` is one of them, in any spelling a lenient decoder reads as it
    /// ([`BaggageMember::reads_as_key`]).
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.members().any(|b| b.is_key(key))
    }
}

/// One way of carrying the stain in headers: a built-in one, or a [`CustomCarrier`] of
/// your own ([`Carrier::custom`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Carrier {
    /// A plain header: a boolean flag, a lane name or a version.
    Plain(PlainHeader),
    /// Seed 002's JSON route header.
    Route(RouteHeader),
    /// A member of the W3C `baggage` header.
    Baggage(BaggageMember),
    /// A carrier written outside this crate; see [`CustomCarrier`].
    Custom(Arc<dyn CustomCarrier>),
}

// === impl Carrier ===

impl From<PlainHeader> for Carrier {
    fn from(c: PlainHeader) -> Self {
        Carrier::Plain(c)
    }
}

impl From<RouteHeader> for Carrier {
    fn from(c: RouteHeader) -> Self {
        Carrier::Route(c)
    }
}

impl From<BaggageMember> for Carrier {
    fn from(c: BaggageMember) -> Self {
        Carrier::Baggage(c)
    }
}

impl From<Arc<dyn CustomCarrier>> for Carrier {
    fn from(c: Arc<dyn CustomCarrier>) -> Self {
        Carrier::Custom(c)
    }
}

impl Carrier {
    /// A [`CustomCarrier`] as a carrier, for [`Carriers::with`].
    pub fn custom(carrier: impl CustomCarrier) -> Self {
        Carrier::Custom(Arc::new(carrier))
    }

    /// Decodes this carrier from `headers`.
    ///
    /// `Ok(None)` means the carrier is absent; an error means it is present but unusable.
    pub fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection> {
        match self {
            Carrier::Plain(c) => c
                .header
                .first_value(headers)?
                .map_or(Ok(None), |value| c.decode_value(value, names)),
            Carrier::Route(c) => c
                .header
                .first_value(headers)?
                .map_or(Ok(None), |value| c.decode_value(value, names)),
            Carrier::Baggage(c) => c.decode(headers, names),
            Carrier::Custom(c) => c.decode(headers, names),
        }
    }

    /// Writes `stain` into `headers` (replacing this carrier's previous value).
    ///
    /// A baseline (or [unstained](Stain::unstained)) stain writes nothing; the carrier's
    /// previous value is removed. A
    /// `baggage` member also writes the stain's inherited members.
    pub fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
        match self {
            Carrier::Plain(c) => c.encode(stain, headers),
            Carrier::Route(c) => c.encode(stain, headers),
            Carrier::Baggage(c) => c.encode(stain, &StainKeys(std::slice::from_ref(self)), headers),
            Carrier::Custom(c) => c.encode(stain, headers),
        }
    }

    /// Removes this carrier from `headers` (for `baggage`: only the stain's member).
    pub fn remove(&self, headers: &mut HeaderMap) {
        match self {
            Carrier::Plain(c) => {
                headers.remove(c.header_name());
            }
            Carrier::Route(c) => {
                headers.remove(c.header_name());
            }
            Carrier::Baggage(c) => c.remove(headers),
            Carrier::Custom(c) => c.remove(headers),
        }
    }

    /// `true` when this carrier is present in `headers`, valid or not.
    pub fn is_present(&self, headers: &HeaderMap) -> bool {
        match self {
            Carrier::Plain(c) => headers.contains_key(c.header_name()),
            Carrier::Route(c) => headers.contains_key(c.header_name()),
            Carrier::Baggage(c) => c.is_present(headers),
            Carrier::Custom(c) => c.is_present(headers),
        }
    }

    /// The header this carrier lives in (for a custom carrier, the first of its
    /// [`header_names`](Self::header_names)).
    pub fn header_name(&self) -> &HeaderName {
        match self {
            Carrier::Plain(c) => c.header_name(),
            Carrier::Route(c) => c.header_name(),
            Carrier::Baggage(_) => &member::BAGGAGE,
            Carrier::Custom(c) => c.header_name(),
        }
    }

    /// Every header this carrier reads: one, except for a custom carrier that names more.
    /// (A `baggage` member reads `baggage`, which holds other members too: an edge removes
    /// only its member.)
    pub fn header_names(&self) -> &[HeaderName] {
        match self {
            Carrier::Custom(c) => c.header_names(),
            other => std::slice::from_ref(other.header_name()),
        }
    }
}

/// The set of carriers a service reads and writes, with the interner they decode into.
///
/// [`Carriers::default`] reads and writes `x-gray-lane` (a lane name) and `x-gray-info`
/// (seed 002's JSON route header); [`Carriers::with_baggage`] adds the W3C `baggage`
/// member `gray.lane`, with every other member of the request carried onward.
#[derive(Debug, Clone)]
pub struct Carriers {
    list: Vec<Carrier>,
    names: Names,
}

/// The default lane header, `x-gray-lane`.
pub const X_GRAY_LANE: HeaderName = HeaderName::from_static("x-gray-lane");
/// Seed 002's route header, `x-gray-info`.
pub const X_GRAY_INFO: HeaderName = HeaderName::from_static("x-gray-info");

// === impl Carriers ===

impl Default for Carriers {
    fn default() -> Self {
        Carriers::new()
            .with(PlainHeader::lane(X_GRAY_LANE))
            .with(RouteHeader::new(X_GRAY_INFO))
    }
}

impl Carriers {
    /// No carriers at all; add them with [`Carriers::with`].
    #[must_use]
    pub fn new() -> Self {
        Carriers {
            list: Vec::new(),
            names: Names::new(),
        }
    }

    /// Adds a carrier. Earlier carriers win when several are present.
    #[must_use]
    pub fn with(mut self, carrier: impl Into<Carrier>) -> Self {
        let carrier = carrier.into();
        if let Carrier::Plain(plain) = &carrier
            && let Some(lane) = plain.flag_lane()
        {
            self.names.insert_lane(lane.clone());
        }
        self.list.push(carrier);
        self
    }

    /// Adds the W3C `baggage` member [`DEFAULT_BAGGAGE_KEY`] (`gray.lane`):
    /// `Carriers::default().with_baggage()` reads and writes `x-gray-lane`, `x-gray-info`
    /// and `baggage`, and carries every other `baggage` member onward.
    #[must_use]
    pub fn with_baggage(self) -> Self {
        self.with(BaggageMember::default())
    }

    /// Uses `names` to intern decoded lanes and versions (no allocation for known names).
    #[must_use]
    pub fn with_names(mut self, names: Names) -> Self {
        self.names = names;
        for carrier in &self.list {
            if let Carrier::Plain(plain) = carrier
                && let Some(lane) = plain.flag_lane()
            {
                self.names.insert_lane(lane.clone());
            }
        }
        self
    }

    /// The interner used while decoding.
    #[must_use]
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The configured carriers, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Carrier> {
        self.list.iter()
    }

    /// The first `baggage` member carrier, the one whose member OpenTelemetry interop
    /// reads and whose caps bound the inherited members; `None` when baggage is off.
    #[must_use]
    pub fn baggage(&self) -> Option<&BaggageMember> {
        self.stain_keys().members().next()
    }

    fn stain_keys(&self) -> StainKeys<'_> {
        StainKeys(&self.list)
    }

    /// Reads the stain from `headers`.
    ///
    /// Returns `None` when no carrier is present at all, so the caller can apply its own
    /// default. A carrier that is present but malformed counts as present and unstained
    /// (seed 000: "anything else is false"), as does an explicit `gray: false`. With a
    /// `baggage` carrier, the stain carries the request's other members
    /// ([`Stain::baggage`]); use [`Carriers::extract_or`] to keep them when no carrier is
    /// present.
    pub fn extract(&self, headers: &HeaderMap) -> Option<Stain> {
        self.extract_with(headers, log_rejection)
    }

    /// Like [`Carriers::extract`], handing each rejection to `on_reject` instead of logging it.
    pub fn extract_with(
        &self,
        headers: &HeaderMap,
        on_reject: impl FnMut(&Rejection),
    ) -> Option<Stain> {
        let (stain, inherited) = self.read(headers, on_reject);
        stain.map(|s| s.with_baggage(inherited))
    }

    /// Reads the stain from `headers`, or takes `default` when no carrier is present;
    /// either way with the request's other `baggage` members (with a `baggage` carrier).
    /// This is what gray-tower's `ExtractStain` does for every request.
    pub fn extract_or(&self, headers: &HeaderMap, default: &Stain) -> Stain {
        match self.read(headers, log_rejection) {
            (Some(stain), inherited) => stain.with_baggage(inherited),
            (None, None) => default.clone(),
            (None, inherited) => default.clone().with_baggage(inherited),
        }
    }

    /// The request's `baggage` members other than the stain's, as [`Carriers::extract`]
    /// keeps them: for a layer that decides the stain by other means (an edge's rules) and
    /// still carries the members onward with [`Stain::with_baggage`]. `None` without a
    /// `baggage` carrier or without other members.
    #[must_use]
    pub fn inherited_baggage(&self, headers: &HeaderMap) -> Option<InheritedBaggage> {
        let carrier = self.baggage()?;
        carrier
            .read(headers, &self.names, &self.stain_keys(), true)
            .1
    }

    fn read(
        &self,
        headers: &HeaderMap,
        mut on_reject: impl FnMut(&Rejection),
    ) -> (Option<Stain>, Option<InheritedBaggage>) {
        let mut found = false;
        let mut lane_decided = false;
        let mut lane = None;
        let mut pins = None;
        let mut inherited = None;
        let mut inheriting = true;
        for carrier in &self.list {
            let decoded = match carrier {
                Carrier::Baggage(c) => {
                    let (decoded, members) =
                        c.read(headers, &self.names, &self.stain_keys(), inheriting);
                    if inheriting {
                        inheriting = false;
                        inherited = members;
                    }
                    decoded
                }
                other => other.decode(headers, &self.names),
            };
            match decoded {
                Ok(None) => {}
                Ok(Some(Decoded::Lane(l))) => {
                    found = true;
                    if !lane_decided {
                        lane_decided = true;
                        lane = Some(l);
                    }
                }
                Ok(Some(Decoded::Baseline)) => {
                    found = true;
                    lane_decided = true;
                }
                Ok(Some(Decoded::Pins(p))) => {
                    found = true;
                    if pins.is_none() {
                        pins = Some(p);
                    }
                }
                Err(rejection) => {
                    found = true;
                    on_reject(&rejection);
                }
            }
        }
        let stain = found.then(|| Stain::baseline().with_lane(lane).with_shared_pins(pins));
        (stain, inherited)
    }

    /// States `stain` on every carrier, replacing whatever they held (stale, duplicated,
    /// malformed or conflicting copies included); a baseline stain removes them. A
    /// `baggage` carrier also writes the stain's inherited members, after the members
    /// `headers` already has (which win over inherited ones of the same key).
    pub fn inject(&self, stain: &Stain, headers: &mut HeaderMap) {
        let stain_keys = self.stain_keys();
        for carrier in &self.list {
            match carrier {
                Carrier::Baggage(c) => c.encode(stain, &stain_keys, headers),
                other => other.encode(stain, headers),
            }
        }
    }

    /// Writes only the stain's inherited `baggage` members (merged as by
    /// [`Carriers::inject`]), leaving every stain carrier as `headers` has it: for a
    /// request whose pre-set stain is kept on purpose.
    pub fn merge_baggage(&self, stain: &Stain, headers: &mut HeaderMap) {
        if let Some(carrier) = self.baggage() {
            carrier.rewrite(Own::Keep, stain.baggage(), &self.stain_keys(), headers);
        }
    }

    /// Removes every carrier from `headers` (other `baggage` members stay).
    pub fn strip(&self, headers: &mut HeaderMap) {
        for carrier in &self.list {
            carrier.remove(headers);
        }
    }

    /// `true` when any carrier is present in `headers`, valid or not.
    #[must_use]
    pub fn is_present(&self, headers: &HeaderMap) -> bool {
        self.list.iter().any(|c| c.is_present(headers))
    }
}

fn log_rejection(rejection: &Rejection) {
    tracing::debug!(
        target: "gray::codec",
        header = %rejection.header(),
        reason = %rejection.reason(),
        "malformed gray carrier ignored; treated as absent",
    );
}
