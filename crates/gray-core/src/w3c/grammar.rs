//! The W3C baggage grammar (a member: `key=value;properties`), scanned in one pass.

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

pub(crate) fn is_token_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & TOKEN != 0
}

pub(crate) fn is_value_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & VALUE != 0
}

/// What the properties after a value may hold: value bytes, `;` and whitespace.
pub(crate) fn is_property_byte(b: u8) -> bool {
    CLASS[usize::from(b)] & PROPERTY != 0
}

pub(crate) fn is_ows(b: u8) -> bool {
    CLASS[usize::from(b)] & OWS != 0
}

pub(crate) fn trim_ows(s: &[u8]) -> &[u8] {
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
pub(crate) struct Member<'a> {
    pub(crate) text: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

/// The key of a member already known to be well-formed (an inherited one).
pub(crate) fn key_of(text: &[u8]) -> &[u8] {
    let eq = text.iter().position(|&b| b == b'=').unwrap_or(text.len());
    trim_ows(&text[..eq])
}

/// The members of one `baggage` line, in one pass: `Ok` for a well-formed member, `Err`
/// with its trimmed text for a malformed one; empty members are skipped.
///
/// A member is a key (a token), optional whitespace, `=`, optional whitespace, a value
/// (baggage octets), optional whitespace, then properties (`;`-separated, each a token or
/// `token=value`) that hold no byte which could not be propagated as it is.
pub(crate) struct Scan<'a> {
    line: &'a [u8],
    pos: usize,
}

impl<'a> Scan<'a> {
    pub(crate) fn new(line: &'a [u8]) -> Self {
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

/// The debug event for a member dropped because it is malformed.
pub(crate) fn malformed(raw: &[u8]) {
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
pub(crate) fn percent_decode<'b>(
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
