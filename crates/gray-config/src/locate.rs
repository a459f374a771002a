//! Finding the position of a field in a document, for errors found after parsing.
//!
//! The document is deserialized again with a seed that follows the field's path and, at
//! the value, fails with a marker error. Every format attaches the position of the value
//! it was deserializing to such an error, so the marker comes back with the line and
//! column, whatever the format.

use std::{cell::Cell, fmt};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The message of the marker error.
pub(super) const FOUND: &str = "\u{0}gray-config: found";

/// One step of a field path: a map key or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Segment {
    Key(String),
    Index(usize),
}

impl Segment {
    /// Parses `services.orders[1].address` (serde_path_to_error's form); `None` when an
    /// index is not a number.
    pub(super) fn parse(path: &str) -> Option<Vec<Segment>> {
        let mut out = Vec::new();
        if path.is_empty() || path == "." {
            return Some(out);
        }
        for part in path.split('.') {
            let (key, mut indices) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !key.is_empty() {
                out.push(Segment::Key(key.to_owned()));
            }
            while let Some(rest) = indices.strip_prefix('[') {
                let end = rest.find(']')?;
                out.push(Segment::Index(rest[..end].parse().ok()?));
                indices = &rest[end + 1..];
            }
            if !indices.is_empty() {
                return None;
            }
        }
        Some(out)
    }
}

/// Follows a path and fails with [`FOUND`] at its end, keeping the value there in
/// `text` when it is a string.
pub(super) struct Seek<'p> {
    path: &'p [Segment],
    text: &'p Cell<Option<String>>,
}

impl<'p> Seek<'p> {
    pub(super) fn new(path: &'p [Segment], text: &'p Cell<Option<String>>) -> Self {
        Seek { path, text }
    }

    fn to(&self, path: &'p [Segment]) -> Self {
        Seek {
            path,
            text: self.text,
        }
    }

    fn found<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! scalars {
    ($($method:ident: $ty:ty),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, _: $ty) -> Result<(), E> {
                self.found()
            }
        )*
    };
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    scalars! {
        visit_bool: bool, visit_i64: i64, visit_i128: i128, visit_u64: u64, visit_u128: u128,
        visit_f64: f64, visit_char: char, visit_bytes: &[u8],
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if self.path.is_empty() {
            self.text.set(Some(v.to_owned()));
        }
        self.found()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.found()
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.found()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.found()?;
        if let Some((Segment::Index(n), rest)) = self.path.split_first() {
            for _ in 0..*n {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    return Ok(());
                }
            }
            if seq.next_element_seed(self.to(rest))?.is_none() {
                return Ok(());
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.found()?;
        let (wanted, rest) = match self.path.split_first() {
            Some((Segment::Key(key), rest)) => (Some(key.as_str()), rest),
            _ => (None, self.path),
        };
        while let Some(key) = map.next_key::<AnyKey>()? {
            if wanted.is_some() && key.0.as_deref() == wanted {
                map.next_value_seed(self.to(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// A map key as text when it is a string or a number (YAML allows both).
struct AnyKey(Option<String>);

impl<'de> serde::Deserialize<'de> for AnyKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;

        impl Visitor<'_> for KeyVisitor {
            type Value = AnyKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map key")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<AnyKey, E> {
                Ok(AnyKey(Some(v.to_owned())))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<AnyKey, E> {
                Ok(AnyKey(Some(v.to_string())))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<AnyKey, E> {
                Ok(AnyKey(Some(v.to_string())))
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<AnyKey, E> {
                Ok(AnyKey(Some(v.to_string())))
            }

            fn visit_unit<E: de::Error>(self) -> Result<AnyKey, E> {
                Ok(AnyKey(None))
            }
        }

        d.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::Segment::{self, Index, Key};

    fn key(s: &str) -> Segment {
        Key(s.to_owned())
    }

    #[test]
    fn paths_parse() {
        assert_eq!(Segment::parse("."), Some(vec![]));
        assert_eq!(
            Segment::parse("rules[1].when.ip[0]"),
            Some(vec![
                key("rules"),
                Index(1),
                key("when"),
                key("ip"),
                Index(0)
            ])
        );
        assert_eq!(
            Segment::parse("a[1][2]"),
            Some(vec![key("a"), Index(1), Index(2)])
        );
        assert_eq!(Segment::parse("a[x]"), None);
        assert_eq!(Segment::parse("a[1]b"), None);
    }
}
