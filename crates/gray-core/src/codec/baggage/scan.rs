//! The `baggage` member grammar, scanned in one pass, and the builder of a capped list.

use http::{HeaderMap, HeaderValue};

use super::BAGGAGE;
use crate::name::MAX_NAME_LEN;

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

pub(super) fn is_token_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & TOKEN != 0
}

pub(super) fn is_value_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & VALUE != 0
}

/// What the properties after a value may hold: value bytes, `;` and whitespace.
pub(super) fn is_property_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & PROPERTY != 0
}

pub(super) fn is_ows(b: u8) -> bool {
    CLASS[usize::from(b)] & OWS != 0
}

pub(super) fn trim_ows(s: &[u8]) -> &[u8] {
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
pub(super) struct Member<'a> {
    pub(super) text: &'a [u8],
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
}

/// The key of a member already known to be well-formed (an inherited one).
pub(super) fn key_of(text: &[u8]) -> &[u8] {
    let eq = text.iter().position(|&b| b == b'=').unwrap_or(text.len());
    trim_ows(&text[..eq])
}

/// The members of one `baggage` line, in one pass: `Ok` for a well-formed member, `Err`
/// with its trimmed text for a malformed one; empty members are skipped.
///
/// A member is a key (a token), optional whitespace, `=`, optional whitespace, a value
/// (baggage octets), optional whitespace, then properties (`;`-separated, each a token or
/// `token=value`) that hold no byte which could not be propagated as it is.
pub(super) struct Scan<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Scan<'a> {
    pub(super) fn new(line: &'a [u8]) -> Self {
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
pub(super) fn scan_all(headers: &HeaderMap) -> impl Iterator<Item = Result<Member<'_>, &[u8]>> {
    headers
        .get_all(&BAGGAGE)
        .iter()
        .flat_map(|v| Scan::new(v.as_bytes()))
}

/// The well-formed members of every `baggage` line, in order.
pub(super) fn members(headers: &HeaderMap) -> impl Iterator<Item = Member<'_>> {
    scan_all(headers).filter_map(Result::ok)
}

pub(super) fn total_len(headers: &HeaderMap) -> usize {
    headers.get_all(&BAGGAGE).iter().map(HeaderValue::len).sum()
}

/// The debug event for a member dropped because it is malformed.
pub(super) fn malformed(raw: &[u8]) {
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
pub(super) fn percent_decode<'b>(
    value: &[u8],
    buf: &'b mut [u8; MAX_NAME_LEN],
) -> Option<&'b [u8]> {
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

/// A `baggage` value under construction, within the member and byte caps.
pub(super) struct Builder {
    pub(super) out: Vec<u8>,
    pub(super) kept: usize,
    pub(super) max_members: usize,
    pub(super) max_bytes: usize,
    /// Bytes kept free for the stain's own member (`,key=lane`).
    pub(super) reserved: usize,
    pub(super) dropped: usize,
    /// The capacity to allocate at the first member (one allocation, none without members).
    pub(super) hint: usize,
}

impl Builder {
    /// An empty list that keeps at most `max_members` members and `max_bytes` bytes, of
    /// which `reserved` stay free.
    pub(super) fn new(max_members: usize, max_bytes: usize, reserved: usize) -> Self {
        Builder {
            out: Vec::new(),
            kept: 0,
            max_members,
            max_bytes,
            reserved,
            dropped: 0,
            hint: 0,
        }
    }

    /// Allocates `hint` bytes at the first member (one allocation, none without members).
    pub(super) fn with_hint(mut self, hint: usize) -> Self {
        self.hint = hint;
        self
    }

    pub(super) fn push(&mut self, text: &[u8]) {
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

    pub(super) fn report_dropped(&self) {
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
