//! The W3C `baggage` carrier: [`BaggageMember`] (reading, in this file), the members of a
//! request's `baggage` lines and a capped list (`list.rs`), and the rewrite of an outbound
//! `baggage` header (`write.rs`). The member grammar and [`InheritedBaggage`] sit below,
//! in `crate::baggage`, since the stain holds the members.

mod list;
#[cfg(test)]
mod tests;
mod write;

use std::{collections::HashMap, fmt, sync::Arc};

use arc_swap::ArcSwap;
use http::{HeaderMap, HeaderName, HeaderValue};

use self::list::{Builder, scan_all, total_len};
pub(super) use self::write::Own;
use super::{Decoded, Reason, Rejection, StainKeys};
pub use crate::w3c::InheritedBaggage;
use crate::w3c::{
    grammar::{is_token_byte, key_of, malformed, percent_decode},
    lenient,
};
use crate::{
    name::{Lane, MAX_NAME_LEN, Names},
    stain::Stain,
};

pub(super) static BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// The W3C minimum number of members a platform must propagate.
pub const W3C_MIN_MEMBERS: usize = 64;
/// The W3C minimum number of bytes a platform must propagate.
pub const W3C_MIN_BYTES: usize = 8192;
/// The member key [`BaggageMember::default`] and [`Carriers::with_baggage`] use: `gray.lane`.
///
/// [`Carriers::with_baggage`]: crate::Carriers::with_baggage
pub const DEFAULT_BAGGAGE_KEY: &str = "gray.lane";
/// How many members [`BaggageMember`] propagates by default (the W3C minimum is 64).
pub const DEFAULT_MAX_MEMBERS: usize = 180;
/// How many `key=lane` member values a [`BaggageMember`] keeps encoded, so that writing a
/// lane stain onto a request without `baggage` allocates nothing.
const ENCODED_CAP: usize = 1024;

/// A key that cannot name a `baggage` member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBaggageKey;

impl fmt::Display for InvalidBaggageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid baggage key: expected a non-empty HTTP token")
    }
}

impl std::error::Error for InvalidBaggageKey {}

/// The lane carried as one member of the W3C `baggage` header, beside other members.
///
/// **The key, in every spelling.** A member is the stain's when a lenient decoder reads its
/// key as this carrier's key ([`reads_as_key`](Self::reads_as_key): `gray%2Elane`,
/// `gray.lane+`, `Gray.Lane` are `gray.lane`), so that what gray reads, replaces and strips
/// is what OpenTelemetry's Python, JS and .NET decoders read. Gray writes the key as it is.
///
/// **Reading** scans every `baggage` header line (the W3C format allows several). The
/// stain's member decides the lane; when it appears more than once, the first one decides
/// (as the first value of a duplicated header does, see [the codec docs](super)); when it is
/// empty or is not a valid lane (`gray.lane=%%`), the carrier yields no lane. Every *other* well-formed member is kept,
/// byte for byte (properties such as `;ttl=5` and percent-encoded values untouched), as
/// the stain's [`InheritedBaggage`]; malformed members are dropped with a debug event
/// (target `gray::codec`).
///
/// **Writing** states the stain's decision and carries the inherited members onward: the
/// members the outbound request already has come first (they win over inherited ones of
/// the same key), then the inherited members, then the stain's own member (none for
/// baseline); every earlier copy of the stain's member, valid or not, is removed. The
/// result is one `baggage` line. At least [`W3C_MIN_MEMBERS`] members and [`W3C_MIN_BYTES`]
/// bytes are propagated (defaults: [`DEFAULT_MAX_MEMBERS`], 8192 bytes); beyond the caps,
/// whole members are dropped from the end, never the stain's own.
///
/// ```
/// use gray_core::{Carriers, Stain, Lane, codec::BaggageMember};
/// use http::{HeaderMap, HeaderValue};
///
/// let carriers = Carriers::new().with(BaggageMember::default()); // `gray.lane`
/// let mut inbound = HeaderMap::new();
/// inbound.insert("baggage", HeaderValue::from_static("userId=42;ttl=5, gray.lane=blue , =bad"));
/// let stain = carriers.extract(&inbound).unwrap();
/// assert_eq!(stain.lane().unwrap(), "blue");
/// assert_eq!(stain.baggage().unwrap().as_str(), "userId=42;ttl=5");
///
/// // An outbound request of the handler: its own member wins, the inherited ones follow,
/// // the stain's decision comes last.
/// let mut outbound = HeaderMap::new();
/// outbound.insert("baggage", HeaderValue::from_static("tenant=acme,gray.lane=stale"));
/// carriers.inject(&stain.with_lane(Some(Lane::new("green")?)), &mut outbound);
/// assert_eq!(outbound["baggage"], "tenant=acme,userId=42;ttl=5,gray.lane=green");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct BaggageMember {
    key: Box<str>,
    max_members: usize,
    max_bytes: usize,
    encoded: Arc<EncodedMembers>,
}

/// `key=lane` values already encoded, learned up to [`ENCODED_CAP`].
#[derive(Debug, Default)]
struct EncodedMembers(ArcSwap<HashMap<Box<str>, HeaderValue>>);

impl Default for BaggageMember {
    /// The member [`DEFAULT_BAGGAGE_KEY`] (`gray.lane`).
    fn default() -> Self {
        BaggageMember::with_key(DEFAULT_BAGGAGE_KEY.into())
    }
}

// === impl BaggageMember: reading ===

impl BaggageMember {
    /// The member named `key` (an HTTP token, for example [`DEFAULT_BAGGAGE_KEY`]).
    pub fn new(key: &str) -> Result<Self, InvalidBaggageKey> {
        if key.is_empty() || !key.bytes().all(is_token_byte) {
            return Err(InvalidBaggageKey);
        }
        Ok(BaggageMember::with_key(key.into()))
    }

    fn with_key(key: Box<str>) -> Self {
        BaggageMember {
            key,
            max_members: DEFAULT_MAX_MEMBERS,
            max_bytes: W3C_MIN_BYTES,
            encoded: Arc::default(),
        }
    }

    /// Caps the members kept and written, never below the W3C minimum of 64.
    #[must_use]
    pub fn with_max_members(mut self, max: usize) -> Self {
        self.max_members = max.max(W3C_MIN_MEMBERS);
        self
    }

    /// Caps the bytes read and written, never below the W3C minimum of 8192.
    #[must_use]
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max.max(W3C_MIN_BYTES);
        self
    }

    /// The member key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `true` when a lenient `baggage` decoder reads `raw`, a member key as sent (up to its
    /// `=`), as this member's key: percent-decoded (up to 8 rounds, any byte), `+` as a
    /// space, trimmed of whitespace, compared without case (OpenTelemetry Python reads
    /// `gray%2Elane`, `gray.lane+` and `%20gray.lane` as `gray.lane`; OpenTelemetry .NET
    /// compares keys without case). Such a member is this member, however it is spelled:
    /// it is read as the stain (the first one decides), replaced when the stain is
    /// written, and stripped by the edge.
    ///
    /// ```
    /// use gray_core::codec::BaggageMember;
    ///
    /// let member = BaggageMember::default(); // gray.lane
    /// for raw in ["gray.lane", "Gray.Lane", "gray%2Elane", "%67ray.lane", "gray.lane+", "gray%252elane"] {
    ///     assert!(member.reads_as_key(raw), "{raw}");
    /// }
    /// assert!(!member.reads_as_key("gray-lane"));
    /// assert!(!member.reads_as_key("gray+lane"));
    /// ```
    #[must_use]
    pub fn reads_as_key(&self, raw: &str) -> bool {
        self.is_key(raw.as_bytes())
    }

    pub(super) fn is_key(&self, key: &[u8]) -> bool {
        lenient::reads_as(key, self.key.as_bytes())
    }

    /// `true` when a member that does not parse still names this member's key to a lenient
    /// decoder (`gray.lane\u{a0}=gray`, `gray%2Elane =a b`): it has an `=`, and the text
    /// before it reads as the key.
    pub(super) fn is_malformed_key(&self, raw: &[u8]) -> bool {
        raw.contains(&b'=') && self.is_key(key_of(raw))
    }

    /// Decodes the stain's member and, with `inherit`, collects every other well-formed
    /// member whose key is not one of `stain_keys`.
    pub(super) fn read(
        &self,
        headers: &HeaderMap,
        names: &Names,
        stain_keys: &StainKeys<'_>,
        inherit: bool,
    ) -> (Result<Option<Decoded>, Rejection>, Option<InheritedBaggage>) {
        let total = total_len(headers);
        if total == 0 {
            return (Ok(None), None);
        }
        // The first member of the stain's key decides; `Err` when it does not parse.
        let mut found: Option<Result<&[u8], &[u8]>> = None;
        let mut others =
            Builder::new(self.max_members, self.max_bytes, 0).with_hint(total.min(self.max_bytes));
        for member in scan_all(headers) {
            let member = match member {
                Ok(member) => member,
                Err(raw) => {
                    if self.is_malformed_key(raw) {
                        found = found.or(Some(Err(raw)));
                    } else if inherit {
                        malformed(raw);
                    }
                    continue;
                }
            };
            if self.is_key(member.key) {
                // The first member decides, as the first value of a duplicated header does.
                found = found.or(Some(Ok(member.value)));
            } else if inherit && !stain_keys.contains(member.key) {
                others.push(member.text);
            }
        }
        others.report_dropped();
        let inherited = InheritedBaggage::from_list(others.out);
        let decoded = if total > self.max_bytes {
            Err(Rejection::new(
                &BAGGAGE,
                Reason::TooLong {
                    len: total,
                    max: self.max_bytes,
                },
            ))
        } else {
            match found {
                None => Ok(None),
                Some(Ok(value)) => Self::decode_value(value, names),
                Some(Err(raw)) => Err(Rejection::new(
                    &BAGGAGE,
                    Reason::Other(
                        format!(
                            "the member `{}` does not parse",
                            String::from_utf8_lossy(raw)
                        )
                        .into(),
                    ),
                )),
            }
        };
        (decoded, inherited)
    }

    fn decode_value(value: &[u8], names: &Names) -> Result<Option<Decoded>, Rejection> {
        if value.is_empty() {
            return Err(Rejection::new(&BAGGAGE, Reason::Empty));
        }
        let mut buf = [0u8; MAX_NAME_LEN];
        let lane = match percent_decode(value, &mut buf) {
            Some(decoded) => names.lane(decoded),
            None => Lane::from_bytes(value),
        }
        .map_err(|e| Rejection::new(&BAGGAGE, Reason::InvalidName(e)))?;
        Ok(Some(Decoded::Lane(lane)))
    }

    pub(super) fn decode(
        &self,
        headers: &HeaderMap,
        names: &Names,
    ) -> Result<Option<Decoded>, Rejection> {
        self.read(headers, names, &StainKeys::none(), false).0
    }

    pub(super) fn is_present(&self, headers: &HeaderMap) -> bool {
        scan_all(headers).any(|m| match m {
            Ok(member) => self.is_key(member.key),
            Err(raw) => self.is_malformed_key(raw),
        })
    }

    pub(super) fn remove(&self, headers: &mut HeaderMap) {
        self.rewrite(Own::Remove, None, &StainKeys::none(), headers);
    }

    pub(super) fn encode(
        &self,
        stain: &Stain,
        stain_keys: &StainKeys<'_>,
        headers: &mut HeaderMap,
    ) {
        let own = match stain.lane() {
            Some(lane) => Own::Write(lane),
            None => Own::Remove,
        };
        self.rewrite(own, stain.baggage(), stain_keys, headers);
    }
}
