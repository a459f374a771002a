//! Writing: the stain's member, the inherited members and the outbound request's own, in
//! one `baggage` line within the caps.

use std::collections::HashMap;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use super::{
    BAGGAGE, BaggageMember, ENCODED_CAP, InheritedBaggage,
    list::{Builder, scan_all, total_len},
};
use crate::{
    codec::StainKeys,
    name::Lane,
    w3c::grammar::{key_of, malformed},
};

/// What a rewrite does with the stain's own member.
#[derive(Clone, Copy)]
pub(in crate::codec) enum Own<'a> {
    /// Write `key=lane`, removing every earlier copy.
    Write(&'a Lane),
    /// Remove every copy (a baseline decision).
    Remove,
    /// Leave the copies the request has (an explicit opt-in to keep a pre-set stain).
    Keep,
}

impl<'a> Own<'a> {
    /// The lane written, if any.
    fn lane(self) -> Option<&'a Lane> {
        match self {
            Own::Write(lane) => Some(lane),
            Own::Remove | Own::Keep => None,
        }
    }
}

// === impl BaggageMember: writing ===

impl BaggageMember {
    /// The length of `key=lane`.
    fn member_len(&self, lane: &Lane) -> usize {
        self.key.len() + 1 + lane.as_str().len()
    }

    /// Appends `key=lane` to `out`, after a `,` unless `out` is empty.
    fn push_member(&self, out: &mut Vec<u8>, lane: &Lane) {
        if !out.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(self.key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(lane.as_str().as_bytes());
    }

    /// `key=lane`, encoded once per lane (under a cap), so that cloning it is all a lane
    /// stain costs on a request without `baggage`.
    pub(super) fn member_value(&self, lane: &Lane) -> Option<HeaderValue> {
        if let Some(value) = self.encoded.0.load().get(lane.as_str()) {
            return Some(value.clone());
        }
        let mut text = Vec::with_capacity(self.member_len(lane));
        self.push_member(&mut text, lane);
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
        let lane = own.lane();
        let ours = lane.map_or(0, |l| 1 + self.member_len(l));
        let members = list.bytes().filter(|&b| b == b',').count() + 1;
        // A list kept by `read` holds no stain key (in any spelling); one built otherwise
        // might. A key gray writes is compared in place, without decoding.
        let may_hold_stain_key = inherited
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
            self.push_member(&mut out, lane);
        }
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(out)) {
            headers.insert(&BAGGAGE, value);
        }
        true
    }

    /// Re-emits the outbound request's well-formed members (ours per `own`), then the
    /// inherited members whose keys it does not have, then ours, within the caps.
    pub(in crate::codec) fn rewrite(
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
        let lane = own.lane();
        let reserved = lane.map_or(0, |l| 1 + self.member_len(l));
        // Exact when the request has no `baggage` yet: `Bytes` then takes the buffer as
        // it is, without another allocation.
        let outbound_len = total_len(headers);
        let inherited_len =
            inherited.map_or(0, |b| b.as_str().len() + usize::from(outbound_len > 0));
        let mut built = Builder::new(
            self.max_members - usize::from(lane.is_some()),
            self.max_bytes,
            reserved,
        );
        built.out =
            Vec::with_capacity((outbound_len + inherited_len + reserved).min(self.max_bytes));
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
            self.push_member(&mut out, lane);
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
