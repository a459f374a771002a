//! The `baggage` header of a request, member by member, and a capped list under
//! construction.

use http::{HeaderMap, HeaderValue};

use super::BAGGAGE;
use crate::w3c::grammar::{Member, Scan};

/// The members of every `baggage` line, in order (malformed ones as `Err`).
pub(super) fn scan_all(headers: &HeaderMap) -> impl Iterator<Item = Result<Member<'_>, &[u8]>> {
    headers
        .get_all(&BAGGAGE)
        .iter()
        .flat_map(|v| Scan::new(v.as_bytes()))
}

pub(super) fn total_len(headers: &HeaderMap) -> usize {
    headers.get_all(&BAGGAGE).iter().map(HeaderValue::len).sum()
}

/// A `baggage` value under construction, within the member and byte caps.
pub(super) struct Builder {
    pub(super) out: Vec<u8>,
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
