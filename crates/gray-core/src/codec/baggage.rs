use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::{Decoded, Reason, Rejection};
use crate::{
    name::{Lane, MAX_NAME_LEN, Names},
    stain::Stain,
};

pub(super) static BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// The W3C minimum number of members a platform must propagate.
pub const W3C_MIN_MEMBERS: usize = 64;
/// The W3C minimum number of bytes a platform must propagate.
pub const W3C_MIN_BYTES: usize = 8192;

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
/// Reading scans every `baggage` header line (the W3C format allows several), skips
/// malformed members, and ignores the stain when its member appears twice. Writing keeps
/// every other well-formed member, in order, replaces the stain's member, and emits one
/// `baggage` line; malformed members are dropped. At least [`W3C_MIN_MEMBERS`] members and
/// [`W3C_MIN_BYTES`] bytes are propagated (the defaults are 180 members, 8192 bytes); beyond
/// the caps whole members are dropped from the end, never the stain's own.
///
/// ```
/// use gray_core::{Carriers, Stain, Lane, codec::BaggageMember};
/// use http::{HeaderMap, HeaderValue};
///
/// let carriers = Carriers::new().with(BaggageMember::new("gray.lane").unwrap());
/// let mut headers = HeaderMap::new();
/// headers.insert("baggage", HeaderValue::from_static("a=1;p=x, gray.lane=blue , =bad"));
/// let ctx = carriers.extract(&headers).unwrap();
/// assert_eq!(ctx.lane().unwrap(), "blue");
///
/// carriers.inject(&Stain::in_lane(Lane::new("green").unwrap()), &mut headers);
/// assert_eq!(headers["baggage"], "a=1;p=x,gray.lane=green");
/// ```
#[derive(Debug, Clone)]
pub struct BaggageMember {
    key: Box<str>,
    max_members: usize,
    max_bytes: usize,
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
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
}

fn is_value_byte(b: u8) -> bool {
    // baggage-octet: %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
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

fn parse_member(raw: &[u8]) -> Option<Member<'_>> {
    let text = trim_ows(raw);
    let kv_end = text.iter().position(|&b| b == b';').unwrap_or(text.len());
    let kv = &text[..kv_end];
    let eq = kv.iter().position(|&b| b == b'=')?;
    let key = trim_ows(&kv[..eq]);
    let value = trim_ows(&kv[eq + 1..]);
    if key.is_empty() || !key.iter().copied().all(is_token_byte) {
        return None;
    }
    if !value.iter().copied().all(is_value_byte) {
        return None;
    }
    Some(Member { text, key, value })
}

/// Iterates the members of every `baggage` line (malformed ones as `None`).
fn members(headers: &HeaderMap) -> impl Iterator<Item = Option<Member<'_>>> {
    headers
        .get_all(&BAGGAGE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter(|raw| !trim_ows(raw).is_empty())
        .map(parse_member)
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

impl BaggageMember {
    /// The member named `key` (an HTTP token, for example `gray.lane`).
    pub fn new(key: &str) -> Result<Self, InvalidBaggageKey> {
        if key.is_empty() || !key.bytes().all(is_token_byte) {
            return Err(InvalidBaggageKey);
        }
        Ok(BaggageMember {
            key: key.into(),
            max_members: 180,
            max_bytes: W3C_MIN_BYTES,
        })
    }

    /// Caps the members written, never below the W3C minimum of 64.
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

    fn total_len(&self, headers: &HeaderMap) -> usize {
        headers.get_all(&BAGGAGE).iter().map(HeaderValue::len).sum()
    }

    pub(super) fn decode(
        &self,
        headers: &HeaderMap,
        names: &Names,
    ) -> Result<Option<Decoded>, Rejection> {
        let total = self.total_len(headers);
        if total == 0 {
            return Ok(None);
        }
        if total > self.max_bytes {
            return Err(Rejection::new(
                &BAGGAGE,
                Reason::TooLong {
                    len: total,
                    max: self.max_bytes,
                },
            ));
        }
        let mut found: Option<&[u8]> = None;
        for member in members(headers).flatten() {
            if member.key == self.key.as_bytes() {
                if found.is_some() {
                    return Err(Rejection::new(&BAGGAGE, Reason::DuplicatedMember));
                }
                found = Some(member.value);
            }
        }
        let Some(value) = found else {
            return Ok(None);
        };
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

    pub(super) fn is_present(&self, headers: &HeaderMap) -> bool {
        members(headers)
            .flatten()
            .any(|m| m.key == self.key.as_bytes())
    }

    pub(super) fn remove(&self, headers: &mut HeaderMap) {
        if self.is_present(headers) {
            self.rewrite(None, headers);
        }
    }

    pub(super) fn encode(&self, ctx: &Stain, headers: &mut HeaderMap) {
        match ctx.lane() {
            Some(lane) => self.rewrite(Some(lane), headers),
            None => self.remove(headers),
        }
    }

    /// Re-emits the well-formed members other than ours, then ours (if any), within caps.
    fn rewrite(&self, lane: Option<&Lane>, headers: &mut HeaderMap) {
        // Room reserved for `,key=lane`, so that our member is never the one dropped.
        let ours = lane.map_or(0, |l| 1 + self.key.len() + 1 + l.as_str().len());
        let max_others = self.max_members - usize::from(lane.is_some());
        let mut out: Vec<u8> = Vec::with_capacity(self.total_len(headers) + ours);
        let mut kept = 0;
        for member in members(headers).flatten() {
            if member.key == self.key.as_bytes() {
                continue;
            }
            let sep = usize::from(!out.is_empty());
            // Whole members only, within both caps.
            if kept == max_others || out.len() + sep + member.text.len() + ours > self.max_bytes {
                break;
            }
            if sep == 1 {
                out.push(b',');
            }
            out.extend_from_slice(member.text);
            kept += 1;
        }
        if let Some(lane) = lane {
            if !out.is_empty() {
                out.push(b',');
            }
            out.extend_from_slice(self.key.as_bytes());
            out.push(b'=');
            out.extend_from_slice(lane.as_str().as_bytes());
        }
        headers.remove(&BAGGAGE);
        // Every byte kept came from a valid header value or is a token byte.
        if let Ok(value) = HeaderValue::from_bytes(&out) {
            if !out.is_empty() {
                headers.insert(&BAGGAGE, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Carriers;

    fn carriers() -> Carriers {
        Carriers::new().with(BaggageMember::new("gray.lane").unwrap())
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&BAGGAGE, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn reads_across_lines_and_skips_malformed_members() {
        let h = headers(&["a=1,=x,b", "c=%20;prop, gray.lane = canary-2 ;p=1"]);
        assert_eq!(carriers().extract(&h).unwrap().lane().unwrap(), "canary-2");
        let h = headers(&["gray.lane=c%61nary"]);
        assert_eq!(carriers().extract(&h).unwrap().lane().unwrap(), "canary");
    }

    #[test]
    fn duplicate_or_bad_member_is_unstained() {
        let unstained = |values: &[&str]| {
            let ctx = carriers().extract(&headers(values));
            ctx.is_some_and(|c| c.is_baseline())
        };
        assert!(unstained(&["gray.lane=a,gray.lane=b"]));
        assert!(unstained(&["gray.lane=a%2"]));
        assert!(unstained(&["gray.lane="]));
        assert!(unstained(&["gray.lane=a%20b"]));
        let huge = format!("k={}", "v".repeat(W3C_MIN_BYTES));
        assert!(unstained(&[&huge, "gray.lane=a"]));
        assert_eq!(carriers().extract(&headers(&["other=1"])), None);
    }

    #[test]
    fn rewrite_keeps_other_members_and_removes_ours_for_baseline() {
        let c = carriers();
        let mut h = headers(&["userId=42;p=1", "gray.lane=old,tenant=acme"]);
        c.inject(&Stain::in_lane(Lane::new("new").unwrap()), &mut h);
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

    #[test]
    fn propagates_at_least_the_w3c_minimum() {
        let c = carriers();
        let many: Vec<String> = (0..W3C_MIN_MEMBERS).map(|i| format!("k{i}=v{i}")).collect();
        let mut h = headers(&[&many.join(",")]);
        c.inject(&Stain::in_lane(Lane::new("gray").unwrap()), &mut h);
        let out = h["baggage"].to_str().unwrap();
        assert_eq!(out.split(',').count(), W3C_MIN_MEMBERS + 1);
        assert!(out.ends_with(",gray.lane=gray"));

        // Members beyond the byte cap are dropped whole; ours always stays.
        let big: Vec<String> = (0..100)
            .map(|i| format!("k{i}={}", "x".repeat(100)))
            .collect();
        let mut h = headers(&[&big.join(",")]);
        c.inject(&Stain::in_lane(Lane::new("gray").unwrap()), &mut h);
        let out = h["baggage"].to_str().unwrap();
        assert!(out.len() <= W3C_MIN_BYTES, "{}", out.len());
        assert!(out.ends_with(",gray.lane=gray"));
        assert!(
            out.split(',')
                .all(|m| m.starts_with('k') && m.len() > 100 || m == "gray.lane=gray")
        );
    }
}
