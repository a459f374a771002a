//! W3C baggage as gray's model holds it: the grammar of a member (`grammar`), and
//! [`InheritedBaggage`], the members a stain carries onward.
//!
//! It sits below both the stain ([`crate::stain`]) and the codecs ([`crate::codec`]): the
//! stain holds an `InheritedBaggage`, the `baggage` codec reads and writes it.

pub(crate) mod grammar;
pub(crate) mod lenient;

use std::{fmt, sync::Arc};

use self::grammar::{Scan, malformed};

/// The inbound `baggage` members a request carries besides the stain's own, kept with its
/// [`Stain`](crate::Stain) and written onto every outbound call (see
/// [`BaggageMember`](crate::codec::BaggageMember)).
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
    #[must_use]
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
    pub(crate) fn from_list(list: Vec<u8>) -> Option<Self> {
        let list = String::from_utf8(list).ok().filter(|s| !s.is_empty())?;
        Some(InheritedBaggage {
            members: list.into(),
        })
    }

    /// The members, joined by `,`, as they arrived.
    #[must_use]
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
    #[must_use]
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Always `false`: an `InheritedBaggage` holds at least one member.
    #[must_use]
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
