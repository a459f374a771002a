//! The forwarding chain of a request: the entries of its forwarding header, parsed, then
//! the peer; only the right-most [`MAX_HOPS`] are kept.

use std::net::{IpAddr, SocketAddr};

use gray_rules::canonical_ip;

use super::MAX_HOPS;

/// One entry of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hop {
    Ip(IpAddr),
    Unknown,
}

/// The right-most [`MAX_HOPS`] entries, kept on the stack.
pub(super) struct Chain {
    ring: [Hop; MAX_HOPS],
    len: usize,
}

impl Chain {
    pub(super) fn new() -> Self {
        Chain {
            ring: [Hop::Unknown; MAX_HOPS],
            len: 0,
        }
    }

    pub(super) fn push(&mut self, hop: Hop) {
        self.ring[self.len % MAX_HOPS] = hop;
        self.len += 1;
    }

    /// The entry `n` places left of the right-most one, if it is still kept.
    pub(super) fn nth_from_right(&self, n: usize) -> Option<Hop> {
        (n < self.len.min(MAX_HOPS)).then(|| self.ring[(self.len - 1 - n) % MAX_HOPS])
    }

    pub(super) fn kept(&self) -> usize {
        self.len.min(MAX_HOPS)
    }

    /// `true` when entries were dropped on the left.
    pub(super) fn truncated(&self) -> bool {
        self.len > MAX_HOPS
    }
}

/// Parses a node: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`. Anything else is unknown.
pub(super) fn parse_node(raw: &[u8]) -> Hop {
    let Ok(s) = std::str::from_utf8(raw) else {
        return Hop::Unknown;
    };
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Hop::Ip(canonical_ip(ip));
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Hop::Ip(canonical_ip(addr.ip()));
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'))
        && let Ok(ip) = inner.parse::<std::net::Ipv6Addr>()
    {
        return Hop::Ip(canonical_ip(IpAddr::V6(ip)));
    }
    Hop::Unknown
}

/// Walks the elements of one `Forwarded` line (RFC 7239), calling `f` with each element's
/// `for` node (unknown when absent or not an address). Quoted strings may hold `,` and `;`.
pub(super) fn for_each_forwarded_element(line: &[u8], mut f: impl FnMut(Hop)) {
    let mut i = 0;
    let mut element_for: Option<Hop> = None;
    let mut element_has_content = false;
    while i <= line.len() {
        // One pair: token '=' (token | quoted-string), up to ';' or ',' or the end.
        let start = i;
        let mut in_quotes = false;
        let mut escaped = false;
        while i < line.len() {
            let b = line[i];
            if in_quotes {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_quotes = false;
                }
            } else if b == b'"' {
                in_quotes = true;
            } else if b == b';' || b == b',' {
                break;
            }
            i += 1;
        }
        let pair = line[start..i].trim_ascii();
        if !pair.is_empty() {
            element_has_content = true;
            if let Some(eq) = pair.iter().position(|&b| b == b'=') {
                let key = pair[..eq].trim_ascii();
                if key.eq_ignore_ascii_case(b"for") {
                    let value = pair[eq + 1..].trim_ascii();
                    let hop = match unquote(value) {
                        Some(v) => parse_node(v),
                        None => Hop::Unknown,
                    };
                    // A second `for` in one element is malformed: the element is unknown.
                    element_for = Some(if element_for.is_some() {
                        Hop::Unknown
                    } else {
                        hop
                    });
                }
            }
        }
        let end_of_element = i >= line.len() || line[i] == b',';
        if end_of_element {
            if element_has_content {
                f(element_for.unwrap_or(Hop::Unknown));
            }
            element_for = None;
            element_has_content = false;
        }
        i += 1;
    }
}

/// A token as is, or a quoted string without its quotes; escapes make it unusable as a
/// node (no address contains them). `None` for an unterminated quote.
fn unquote(v: &[u8]) -> Option<&[u8]> {
    match v.first() {
        Some(b'"') => {
            let inner = v.get(1..v.len().checked_sub(1)?)?;
            (v.len() >= 2 && v[v.len() - 1] == b'"' && !inner.contains(&b'\\')).then_some(inner)
        }
        _ => Some(v),
    }
}
