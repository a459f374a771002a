use std::{collections::HashMap, fmt, sync::Arc};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{Decoded, Reason, Rejection, StainKeys};
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

/// The inbound `baggage` members a request carries besides the stain's own, kept with its
/// [`Stain`] and written onto every outbound call (see [`BaggageMember`]).
///
/// The members are kept as they arrived, in order: properties (`;ttl=5`) and
/// percent-encoded values are not decoded. Cloning is an `Arc` increment. `Debug` shows the
/// keys, never the values.
///
/// ```
/// use gray_core::codec::InheritedBaggage;
///
/// let baggage = InheritedBaggage::parse("userId=42;ttl=5, name=J%C3%BCrgen ,bad member").unwrap();
/// assert_eq!(baggage.len(), 2);
/// assert_eq!(baggage.get("name"), Some("J%C3%BCrgen"));
/// assert_eq!(baggage.as_str(), "userId=42;ttl=5,name=J%C3%BCrgen");
/// assert!(InheritedBaggage::parse("=,;").is_none());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct InheritedBaggage {
    members: Arc<str>,
}

impl InheritedBaggage {
    /// Parses a W3C baggage list (`k=v;prop,k2=v2`): malformed members are dropped (with a
    /// debug event), well-formed ones kept byte for byte. `None` when no member is left.
    pub fn parse(list: &str) -> Option<Self> {
        let mut out = Vec::with_capacity(list.len());
        for member in Scan::new(list.as_bytes()) {
            match member {
                Ok(member) => {
                    if !out.is_empty() {
                        out.push(b',');
                    }
                    out.extend_from_slice(member.text);
                }
                Err(raw) => malformed(raw),
            }
        }
        Self::from_list(out)
    }

    /// Builds from a joined list of well-formed members (ASCII by construction).
    fn from_list(list: Vec<u8>) -> Option<Self> {
        let list = String::from_utf8(list).ok().filter(|s| !s.is_empty())?;
        Some(InheritedBaggage {
            members: list.into(),
        })
    }

    /// The members, joined by `,`, as they arrived.
    pub fn as_str(&self) -> &str {
        &self.members
    }

    /// Each member's text (`userId=42;ttl=5`), in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.members.split(',')
    }

    /// The raw (still percent-encoded) value of the first member named `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let member = Scan::new(self.members.as_bytes())
            .filter_map(Result::ok)
            .find(|m| m.key == key.as_bytes())?;
        std::str::from_utf8(member.value).ok()
    }

    /// How many members there are (at least one).
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Always `false`: an `InheritedBaggage` holds at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

impl fmt::Debug for InheritedBaggage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self
            .iter()
            .map(|text| text.split_once('=').map_or(text, |(k, _)| k.trim()));
        f.debug_tuple("InheritedBaggage")
            .field(&format_args!("keys: {:?}", keys.collect::<Vec<_>>()))
            .finish()
    }
}

/// What a byte may be in a `baggage` member, one table lookup per byte.
const TOKEN: u8 = 1;
const VALUE: u8 = 2;
const PROPERTY: u8 = 4;
const OWS: u8 = 8;
static CLASS: [u8; 256] = {
    let mut class = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        // tchar (RFC 9110): the key of a member.
        if byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            )
        {
            class[b] |= TOKEN;
        }
        // baggage-octet: %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E
        if matches!(byte, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E) {
            class[b] |= VALUE | PROPERTY;
        }
        if matches!(byte, b' ' | b'\t') {
            class[b] |= OWS | PROPERTY;
        }
        if byte == b';' {
            class[b] |= PROPERTY;
        }
        b += 1;
    }
    class
};

fn is_token_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & TOKEN != 0
}

fn is_value_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & VALUE != 0
}

/// What the properties after a value may hold: value bytes, `;` and whitespace.
fn is_property_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & PROPERTY != 0
}

fn is_ows(b: u8) -> bool {
    CLASS[usize::from(b)] & OWS != 0
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

/// One well-formed member: its trimmed text, key and value.
struct Member<'a> {
    text: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

/// The key of a member already known to be well-formed (an inherited one).
fn key_of(text: &[u8]) -> &[u8] {
    let eq = text.iter().position(|&b| b == b'=').unwrap_or(text.len());
    trim_ows(&text[..eq])
}

/// The members of one `baggage` line, in one pass: `Ok` for a well-formed member, `Err`
/// with its trimmed text for a malformed one; empty members are skipped.
///
/// A member is a key (a token), optional whitespace, `=`, optional whitespace, a value
/// (baggage octets), optional whitespace, then properties (`;`-separated, each a token or
/// `token=value`) that hold no byte which could not be propagated as it is.
struct Scan<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Scan<'a> {
    fn new(line: &'a [u8]) -> Self {
        Scan { line, pos: 0 }
    }

    /// Skips to the next `,` after a malformed member that starts at `start`.
    fn malformed(&mut self, start: usize, from: usize) -> Result<Member<'a>, &'a [u8]> {
        let line = self.line;
        let end = line[from..]
            .iter()
            .position(|&b| b == b',')
            .map_or(line.len(), |i| from + i);
        self.pos = end + 1;
        Err(trim_ows(&line[start..end]))
    }
}

impl<'a> Iterator for Scan<'a> {
    type Item = Result<Member<'a>, &'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        let line = self.line;
        let n = line.len();
        loop {
            let mut i = self.pos;
            while i < n && is_ows(line[i]) {
                i += 1;
            }
            if i >= n {
                self.pos = n;
                return None;
            }
            if line[i] == b',' {
                self.pos = i + 1;
                continue;
            }
            let start = i;
            while i < n && is_token_byte(line[i]) {
                i += 1;
            }
            let key_end = i;
            while i < n && is_ows(line[i]) {
                i += 1;
            }
            if key_end == start || i == n || line[i] != b'=' {
                return Some(self.malformed(start, i));
            }
            i += 1;
            while i < n && is_ows(line[i]) {
                i += 1;
            }
            let value_start = i;
            while i < n && is_value_byte(line[i]) {
                i += 1;
            }
            let value_end = i;
            while i < n && is_ows(line[i]) {
                i += 1;
            }
            if i < n && !matches!(line[i], b';' | b',') {
                return Some(self.malformed(start, i));
            }
            while i < n && line[i] != b',' {
                if !is_property_byte(line[i]) {
                    return Some(self.malformed(start, i));
                }
                i += 1;
            }
            self.pos = i + 1;
            return Some(Ok(Member {
                text: trim_ows(&line[start..i]),
                key: &line[start..key_end],
                value: &line[value_start..value_end],
            }));
        }
    }
}

/// The members of every `baggage` line, in order (malformed ones as `Err`).
fn scan_all(headers: &HeaderMap) -> impl Iterator<Item = Result<Member<'_>, &[u8]>> {
    headers
        .get_all(&BAGGAGE)
        .iter()
        .flat_map(|v| Scan::new(v.as_bytes()))
}

/// The well-formed members of every `baggage` line, in order.
fn members(headers: &HeaderMap) -> impl Iterator<Item = Member<'_>> {
    scan_all(headers).filter_map(Result::ok)
}

fn total_len(headers: &HeaderMap) -> usize {
    headers.get_all(&BAGGAGE).iter().map(HeaderValue::len).sum()
}

/// The debug event for a member dropped because it is malformed.
fn malformed(raw: &[u8]) {
    let raw = trim_ows(raw);
    if !raw.is_empty() {
        tracing::debug!(
            target: "gray::codec",
            member = %String::from_utf8_lossy(raw),
            "malformed baggage member dropped",
        );
    }
}

/// Percent-decodes `value` into `buf`; `None` when it is malformed or does not fit.
fn percent_decode<'b>(value: &[u8], buf: &'b mut [u8; MAX_NAME_LEN]) -> Option<&'b [u8]> {
    let mut out = 0;
    let mut i = 0;
    while i < value.len() {
        let b = if value[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            let s = std::str::from_utf8(hex).ok()?;
            i += 3;
            u8::from_str_radix(s, 16).ok()?
        } else {
            i += 1;
            value[i - 1]
        };
        *buf.get_mut(out)? = b;
        out += 1;
    }
    Some(&buf[..out])
}

/// What a rewrite does with the stain's own member.
#[derive(Clone, Copy)]
pub(super) enum Own<'a> {
    /// Write `key=lane`, removing every earlier copy.
    Write(&'a Lane),
    /// Remove every copy (a baseline decision).
    Remove,
    /// Leave the copies the request has (an explicit opt-in to keep a pre-set stain).
    Keep,
}

/// A `baggage` value under construction, within the member and byte caps.
struct Builder {
    out: Vec<u8>,
    kept: usize,
    max_members: usize,
    max_bytes: usize,
    /// Bytes kept free for the stain's own member (`,key=lane`).
    reserved: usize,
    dropped: usize,
    /// The capacity to allocate at the first member (one allocation, none without members).
    hint: usize,
}

impl Builder {
    fn push(&mut self, text: &[u8]) {
        let sep = usize::from(!self.out.is_empty());
        // Whole members only, within both caps; once one is dropped, every later one is.
        if self.dropped > 0
            || self.kept == self.max_members
            || self.out.len() + sep + text.len() + self.reserved > self.max_bytes
        {
            self.dropped += 1;
            return;
        }
        if self.out.capacity() == 0 {
            self.out.reserve(self.hint.max(text.len()));
        }
        if sep == 1 {
            self.out.push(b',');
        }
        self.out.extend_from_slice(text);
        self.kept += 1;
    }

    fn report_dropped(&self) {
        if self.dropped > 0 {
            tracing::debug!(
                target: "gray::codec",
                dropped = self.dropped,
                max_members = self.max_members,
                max_bytes = self.max_bytes,
                "baggage members beyond the caps dropped",
            );
        }
    }
}

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
    pub fn with_max_members(mut self, max: usize) -> Self {
        self.max_members = max.max(W3C_MIN_MEMBERS);
        self
    }

    /// Caps the bytes read and written, never below the W3C minimum of 8192.
    pub fn with_max_bytes(mut self, max: usize) -> Self {
        self.max_bytes = max.max(W3C_MIN_BYTES);
        self
    }

    /// The member key.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub(super) fn is_key(&self, key: &[u8]) -> bool {
        self.key.as_bytes() == key
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
        let mut found: Option<&[u8]> = None;
        let mut others = Builder {
            out: Vec::new(),
            kept: 0,
            max_members: self.max_members,
            max_bytes: self.max_bytes,
            reserved: 0,
            dropped: 0,
            hint: total.min(self.max_bytes),
        };
        for member in scan_all(headers) {
            let member = match member {
                Ok(member) => member,
                Err(raw) => {
                    if inherit {
                        malformed(raw);
                    }
                    continue;
                }
            };
            if self.is_key(member.key) {
                // The first member decides, as the first value of a duplicated header does.
                found = found.or(Some(member.value));
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
            found.map_or(Ok(None), |value| self.decode_value(value, names))
        };
        (decoded, inherited)
    }

    fn decode_value(&self, value: &[u8], names: &Names) -> Result<Option<Decoded>, Rejection> {
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
        members(headers).any(|m| self.is_key(m.key))
    }

    pub(super) fn remove(&self, headers: &mut HeaderMap) {
        self.rewrite(Own::Remove, None, &StainKeys::none(), headers);
    }

    pub(super) fn encode(&self, ctx: &Stain, stain_keys: &StainKeys<'_>, headers: &mut HeaderMap) {
        let own = match ctx.lane() {
            Some(lane) => Own::Write(lane),
            None => Own::Remove,
        };
        self.rewrite(own, ctx.baggage(), stain_keys, headers);
    }

    /// `key=lane`, encoded once per lane (under a cap), so that cloning it is all a lane
    /// stain costs on a request without `baggage`.
    fn member_value(&self, lane: &Lane) -> Option<HeaderValue> {
        if let Some(value) = self.encoded.0.load().get(lane.as_str()) {
            return Some(value.clone());
        }
        let mut text = Vec::with_capacity(self.key.len() + 1 + lane.as_str().len());
        text.extend_from_slice(self.key.as_bytes());
        text.push(b'=');
        text.extend_from_slice(lane.as_str().as_bytes());
        // Key and lane are tokens: always a valid header value.
        let value = HeaderValue::from_maybe_shared(Bytes::from(text)).ok()?;
        if self.encoded.0.load().len() < ENCODED_CAP {
            self.encoded.0.rcu(|map| {
                let mut map = HashMap::clone(map);
                if map.len() < ENCODED_CAP {
                    map.entry(lane.as_str().into())
                        .or_insert_with(|| value.clone());
                }
                map
            });
        }
        Some(value)
    }

    /// The common case of an outbound request without `baggage`, whose inherited members
    /// fit the caps and name no stain key: the inherited list as it is, then ours. `false`
    /// when the general rewrite is needed.
    fn write_inherited(
        &self,
        own: Own<'_>,
        inherited: &InheritedBaggage,
        stain_keys: &StainKeys<'_>,
        headers: &mut HeaderMap,
    ) -> bool {
        let list = inherited.as_str();
        let lane = match own {
            Own::Write(lane) => Some(lane),
            Own::Remove | Own::Keep => None,
        };
        let ours = lane.map_or(0, |l| 1 + self.key.len() + 1 + l.as_str().len());
        let members = list.bytes().filter(|&b| b == b',').count() + 1;
        // A list kept by `read` holds no stain key; one built otherwise might. Only when a
        // key occurs in the text at all are the members' keys looked at.
        let may_hold_stain_key = stain_keys.occur_in(list)
            && inherited
                .iter()
                .any(|text| stain_keys.contains(key_of(text.as_bytes())));
        if headers.contains_key(&BAGGAGE)
            || members + usize::from(lane.is_some()) > self.max_members
            || list.len() + ours > self.max_bytes
            || may_hold_stain_key
        {
            return false;
        }
        let mut out = Vec::with_capacity(list.len() + ours);
        out.extend_from_slice(list.as_bytes());
        if let Some(lane) = lane {
            out.push(b',');
            out.extend_from_slice(self.key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(lane.as_str().as_bytes());
        }
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(out)) {
            headers.insert(&BAGGAGE, value);
        }
        true
    }

    /// Re-emits the outbound request's well-formed members (ours per `own`), then the
    /// inherited members whose keys it does not have, then ours, within the caps.
    pub(super) fn rewrite(
        &self,
        own: Own<'_>,
        inherited: Option<&InheritedBaggage>,
        stain_keys: &StainKeys<'_>,
        headers: &mut HeaderMap,
    ) {
        if let Some(inherited) = inherited {
            if !headers.contains_key(&BAGGAGE)
                && self.write_inherited(own, inherited, stain_keys, headers)
            {
                return;
            }
        } else {
            match own {
                Own::Keep => return,
                // Nothing to remove: the request stays as it is, malformed members included.
                Own::Remove if !self.is_present(headers) => return,
                Own::Write(lane) if !headers.contains_key(&BAGGAGE) => {
                    if let Some(value) = self.member_value(lane) {
                        headers.insert(&BAGGAGE, value);
                    }
                    return;
                }
                Own::Write(_) | Own::Remove => {}
            }
        }
        let lane = match own {
            Own::Write(lane) => Some(lane),
            Own::Remove | Own::Keep => None,
        };
        let reserved = lane.map_or(0, |l| 1 + self.key.len() + 1 + l.as_str().len());
        // Exact when the request has no `baggage` yet: `Bytes` then takes the buffer as
        // it is, without another allocation.
        let outbound_len = total_len(headers);
        let inherited_len =
            inherited.map_or(0, |b| b.as_str().len() + usize::from(outbound_len > 0));
        let mut built = Builder {
            out: Vec::with_capacity((outbound_len + inherited_len + reserved).min(self.max_bytes)),
            kept: 0,
            max_members: self.max_members - usize::from(lane.is_some()),
            max_bytes: self.max_bytes,
            reserved,
            dropped: 0,
            hint: 0,
        };
        {
            // The outbound request's own keys, which win over inherited members.
            let mut outbound_keys: Vec<&[u8]> = Vec::new();
            for member in scan_all(headers) {
                let member = match member {
                    Ok(member) => member,
                    Err(raw) => {
                        malformed(raw);
                        continue;
                    }
                };
                if self.is_key(member.key) && !matches!(own, Own::Keep) {
                    continue;
                }
                if inherited.is_some() {
                    outbound_keys.push(member.key);
                }
                built.push(member.text);
            }
            // Inherited members were validated when they were kept: only their keys matter.
            for text in inherited.into_iter().flat_map(InheritedBaggage::iter) {
                let text = text.as_bytes();
                let key = key_of(text);
                if self.is_key(key) || stain_keys.contains(key) || outbound_keys.contains(&key) {
                    continue;
                }
                built.push(text);
            }
        }
        built.report_dropped();
        let mut out = built.out;
        if let Some(lane) = lane {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(self.key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(lane.as_str().as_bytes());
        }
        headers.remove(&BAGGAGE);
        if out.is_empty() {
            return;
        }
        // Every byte kept came from a valid header value or is a token byte.
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(out)) {
            headers.insert(&BAGGAGE, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Carriers;

    fn carriers() -> Carriers {
        Carriers::new().with(BaggageMember::default())
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&BAGGAGE, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn lane(name: &str) -> Lane {
        Lane::new(name).unwrap()
    }

    #[test]
    fn reads_across_lines_and_skips_malformed_members() {
        let h = headers(&["a=1,=x,b", "c=%20;prop, gray.lane = canary-2 ;p=1"]);
        let stain = carriers().extract(&h).unwrap();
        assert_eq!(stain.lane().unwrap(), "canary-2");
        assert_eq!(stain.baggage().unwrap().as_str(), "a=1,c=%20;prop");
        let h = headers(&["gray.lane=c%61nary"]);
        let stain = carriers().extract(&h).unwrap();
        assert_eq!(stain.lane().unwrap(), "canary");
        assert_eq!(stain.baggage(), None);
        // Lanes are case-insensitive on the wire too.
        let h = headers(&["gray.lane=Canary"]);
        assert_eq!(carriers().extract(&h).unwrap().lane().unwrap(), "canary");
    }

    #[test]
    fn a_duplicated_member_is_read_as_its_first_one() {
        let lane_of = |values: &[&str]| {
            let stain = carriers().extract(&headers(values)).unwrap();
            stain.lane().map(ToString::to_string)
        };
        assert_eq!(lane_of(&["gray.lane=a,gray.lane=b"]).as_deref(), Some("a"));
        assert_eq!(
            lane_of(&["gray.lane=a", "gray.lane=b"]).as_deref(),
            Some("a")
        );
        assert_eq!(
            lane_of(&["x=1,gray.lane=a,gray.lane=a"]).as_deref(),
            Some("a")
        );
        // The first one decides even when it is bad and a later one is good.
        assert_eq!(lane_of(&["gray.lane=%%,gray.lane=b"]), None);
        // Members are read after the malformed ones are skipped.
        assert_eq!(lane_of(&["gray.lane,gray.lane=b"]).as_deref(), Some("b"));
    }

    #[test]
    fn a_bad_member_is_unstained() {
        let unstained = |values: &[&str]| {
            let ctx = carriers().extract(&headers(values));
            ctx.is_some_and(|c| c.is_baseline())
        };
        assert!(unstained(&["gray.lane=a%2"]));
        assert!(unstained(&["gray.lane=%%"]));
        assert!(unstained(&["gray.lane="]));
        assert!(unstained(&["gray.lane=a%20b"]));
        let huge = format!("k={}", "v".repeat(W3C_MIN_BYTES));
        assert!(unstained(&[&huge, "gray.lane=a"]));
        assert_eq!(carriers().extract(&headers(&["other=1"])), None);
    }

    #[test]
    fn inherited_members_are_kept_byte_for_byte() {
        let h = headers(&[
            "userId=42;ttl=5, name=J%C3%BCrgen;p ,gray.lane=gray",
            "bad member,k=v;a=1;b",
        ]);
        let stain = carriers().extract(&h).unwrap();
        let baggage = stain.baggage().unwrap();
        assert_eq!(
            baggage.as_str(),
            "userId=42;ttl=5,name=J%C3%BCrgen;p,k=v;a=1;b"
        );
        assert_eq!(baggage.len(), 3);
        assert_eq!(baggage.get("userId"), Some("42"));
        assert_eq!(baggage.get("gray.lane"), None);
        assert_eq!(
            format!("{baggage:?}"),
            r#"InheritedBaggage(keys: ["userId", "name", "k"])"#
        );

        // Members of the stain's other baggage carriers are not inherited.
        let two = carriers().with(BaggageMember::new("gray.other").unwrap());
        let h = headers(&["a=1,gray.other=x,gray.lane=b"]);
        assert_eq!(two.extract(&h).unwrap().baggage().unwrap().as_str(), "a=1");
    }

    #[test]
    fn a_request_without_members_besides_ours_inherits_nothing() {
        let stain = carriers().extract(&headers(&["gray.lane=gray"])).unwrap();
        assert_eq!(stain.baggage(), None);
        let default = Stain::in_lane(lane("own"));
        assert_eq!(carriers().extract_or(&HeaderMap::new(), &default), default);
        // Without the stain's member, the default decides and the members still travel.
        let stain = carriers().extract_or(&headers(&["userId=42"]), &default);
        assert_eq!(stain.lane().unwrap(), "own");
        assert_eq!(stain.baggage().unwrap().as_str(), "userId=42");
    }

    #[test]
    fn writing_merges_outbound_inherited_and_ours() {
        let c = carriers();
        let inbound = headers(&["userId=42;ttl=5,tenant=acme,gray.lane=gray"]);
        let stain = c.extract(&inbound).unwrap();

        // No baggage on the outbound request: the inherited members, then ours.
        let mut out = HeaderMap::new();
        c.inject(&stain, &mut out);
        assert_eq!(out["baggage"], "userId=42;ttl=5,tenant=acme,gray.lane=gray");

        // Members the outbound request has win; stale, duplicated and malformed copies of
        // ours go.
        let mut out = headers(&["tenant=other,gray.lane=blue", "gray.lane=%%,gray.lane=gray"]);
        c.inject(&stain, &mut out);
        assert_eq!(
            out["baggage"],
            "tenant=other,userId=42;ttl=5,gray.lane=gray"
        );
        assert_eq!(out.get_all("baggage").iter().count(), 1);

        // A baseline decision removes ours and still carries the members.
        let mut out = headers(&["gray.lane=gray"]);
        c.inject(
            &Stain::baseline().with_baggage(stain.baggage().cloned()),
            &mut out,
        );
        assert_eq!(out["baggage"], "userId=42;ttl=5,tenant=acme");

        // Members built by hand may name the stain's key: the decision still wins.
        let by_hand = InheritedBaggage::parse("a=1,gray.lane=blue,b=gray.lane").unwrap();
        let mut out = HeaderMap::new();
        c.inject(
            &Stain::in_lane(lane("gray")).with_baggage(Some(by_hand)),
            &mut out,
        );
        assert_eq!(out["baggage"], "a=1,b=gray.lane,gray.lane=gray");
        let by_hand = InheritedBaggage::parse("a=1,b=gray.lane").unwrap();
        let mut out = HeaderMap::new();
        c.inject(&Stain::baseline().with_baggage(Some(by_hand)), &mut out);
        assert_eq!(out["baggage"], "a=1,b=gray.lane");

        // The opt-in that keeps a pre-set stain still merges the members.
        let mut out = headers(&["gray.lane=blue"]);
        c.merge_baggage(&stain, &mut out);
        assert_eq!(out["baggage"], "gray.lane=blue,userId=42;ttl=5,tenant=acme");
    }

    #[test]
    fn rewrite_keeps_other_members_and_removes_ours_for_baseline() {
        let c = carriers();
        let mut h = headers(&["userId=42;p=1", "gray.lane=old,tenant=acme"]);
        c.inject(&Stain::in_lane(lane("new")), &mut h);
        assert_eq!(h["baggage"], "userId=42;p=1,tenant=acme,gray.lane=new");
        c.inject(&Stain::baseline(), &mut h);
        assert_eq!(h["baggage"], "userId=42;p=1,tenant=acme");
        let mut only = headers(&["gray.lane=x"]);
        c.strip(&mut only);
        assert!(only.get("baggage").is_none());
        let mut untouched = headers(&["a=1, ,=broken"]);
        c.inject(&Stain::baseline(), &mut untouched);
        assert_eq!(untouched["baggage"], "a=1, ,=broken");
    }

    /// The member grammar, written plainly: the one-pass scanner must agree with it.
    fn parse_plainly(raw: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let text = trim_ows(raw);
        let kv_end = text.iter().position(|&b| b == b';').unwrap_or(text.len());
        let kv = &text[..kv_end];
        let eq = kv.iter().position(|&b| b == b'=')?;
        let key = trim_ows(&kv[..eq]);
        let value = trim_ows(&kv[eq + 1..]);
        let props_ok = text[kv_end..]
            .iter()
            .all(|&b| is_value_byte(b) || matches!(b, b';' | b' ' | b'\t'));
        let ok = !key.is_empty()
            && key.iter().copied().all(is_token_byte)
            && value.iter().copied().all(is_value_byte)
            && props_ok;
        ok.then_some((text, key, value))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        #[test]
        fn the_one_pass_scanner_agrees_with_the_grammar(
            line in proptest::collection::vec(
                proptest::sample::select(&b"ab.=%;, \t\"\\\x80"[..]),
                0..24,
            )
        ) {
            let scanned: Vec<_> = Scan::new(&line)
                .map(|m| m.map(|m| (m.text, m.key, m.value)))
                .collect();
            let split: Vec<_> = line
                .split(|&b| b == b',')
                .filter(|raw| !trim_ows(raw).is_empty())
                .map(|raw| parse_plainly(raw).ok_or(trim_ows(raw)))
                .collect();
            proptest::prop_assert_eq!(scanned, split);
        }
    }

    #[test]
    fn a_lane_member_is_encoded_once() {
        let c = BaggageMember::default();
        let gray = lane("gray");
        let first = c.member_value(&gray).unwrap();
        assert_eq!(first, "gray.lane=gray");
        assert_eq!(c.encoded.0.load().len(), 1);
        assert_eq!(c.member_value(&gray).unwrap(), first);
        assert_eq!(c.encoded.0.load().len(), 1);
    }

    #[test]
    fn propagates_at_least_the_w3c_minimum() {
        let c = carriers();
        let many: Vec<String> = (0..W3C_MIN_MEMBERS).map(|i| format!("k{i}=v{i}")).collect();
        let stain = c.extract_or(&headers(&[&many.join(",")]), &Stain::baseline());
        assert_eq!(stain.baggage().unwrap().len(), W3C_MIN_MEMBERS);
        let mut h = HeaderMap::new();
        c.inject(&stain.clone().with_lane(Some(lane("gray"))), &mut h);
        let out = h["baggage"].to_str().unwrap();
        assert_eq!(out.split(',').count(), W3C_MIN_MEMBERS + 1);
        assert!(out.ends_with(",gray.lane=gray"));

        // 8192 bytes with our member: all of it travels.
        let ours = ",gray.lane=gray".len();
        let filler = W3C_MIN_BYTES - ours - "k=".len();
        let exact = format!("k={}", "x".repeat(filler));
        let stain = c.extract_or(&headers(&[&exact]), &Stain::baseline());
        let mut h = HeaderMap::new();
        c.inject(&stain.with_lane(Some(lane("gray"))), &mut h);
        assert_eq!(h["baggage"].len(), W3C_MIN_BYTES);

        // Members beyond the byte cap are dropped whole; ours always stays.
        let big: Vec<String> = (0..100)
            .map(|i| format!("k{i}={}", "x".repeat(100)))
            .collect();
        let mut h = headers(&[&big.join(",")]);
        c.inject(&Stain::in_lane(lane("gray")), &mut h);
        let out = h["baggage"].to_str().unwrap();
        assert!(out.len() <= W3C_MIN_BYTES, "{}", out.len());
        assert!(out.ends_with(",gray.lane=gray"));
        assert!(
            out.split(',')
                .all(|m| m.starts_with('k') && m.len() > 100 || m == "gray.lane=gray")
        );
    }
}
