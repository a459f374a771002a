//! Lane and version names, interned once so the request path only clones an `Arc`.
//!
//! A [`Lane`] names a gray lane (`gray`, `canary-2`); a [`Version`] names a service version
//! (`v2`, `2.0`). Both are short tokens of ASCII letters, digits, `.`, `_` and `-`, at most
//! [`MAX_NAME_LEN`] bytes, so they can be written as a header value, a JSON string or a
//! `baggage` value without escaping. Each keeps its encoded [`HeaderValue`], so writing it
//! to an outbound request copies nothing.
//!
//! [`Names`] is the interner that codecs use while decoding: a name it already knows is
//! returned as a clone of the known one (no allocation); an unknown one is built on the spot.
//!
//! ```
//! use gray_core::{Lane, Names};
//!
//! let names = Names::new().with_lanes([Lane::new("gray").unwrap()]);
//! let lane = names.lane(b"gray").unwrap();
//! assert_eq!(lane.as_str(), "gray");
//! assert!(Lane::new("no spaces").is_err());
//! ```

use std::{borrow::Borrow, collections::HashMap, fmt, hash::Hash, sync::Arc};

use http::HeaderValue;

/// The longest lane or version name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A name that is not a valid lane or version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName {
    kind: &'static str,
    reason: &'static str,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} name: {}", self.kind, self.reason)
    }
}

impl std::error::Error for InvalidName {}

fn validate(kind: &'static str, bytes: &[u8]) -> Result<(), InvalidName> {
    if bytes.is_empty() {
        return Err(InvalidName {
            kind,
            reason: "it is empty",
        });
    }
    if bytes.len() > MAX_NAME_LEN {
        return Err(InvalidName {
            kind,
            reason: "it is longer than 64 bytes",
        });
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(InvalidName {
            kind,
            reason: "only ASCII letters, digits, '.', '_' and '-' are allowed",
        });
    }
    Ok(())
}

#[derive(Clone)]
struct Token(Arc<TokenInner>);

struct TokenInner {
    name: Box<str>,
    value: HeaderValue,
}

impl Token {
    fn new(kind: &'static str, bytes: &[u8]) -> Result<Self, InvalidName> {
        validate(kind, bytes)?;
        // Validated as ASCII above, so both conversions succeed.
        let name: Box<str> = std::str::from_utf8(bytes)
            .map_err(|_| InvalidName {
                kind,
                reason: "it is not UTF-8",
            })?
            .into();
        let value = HeaderValue::from_str(&name).map_err(|_| InvalidName {
            kind,
            reason: "it is not a valid header value",
        })?;
        Ok(Token(Arc::new(TokenInner { name, value })))
    }

    fn as_str(&self) -> &str {
        &self.0.name
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.name == other.0.name
    }
}

impl Eq for Token {}

macro_rules! name_type {
    ($(#[$meta:meta])* $ty:ident, $kind:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $ty(Token);

        impl $ty {
            #[doc = concat!("Builds a ", $kind, " name, checking that it is a valid token.")]
            pub fn new(name: impl AsRef<str>) -> Result<Self, InvalidName> {
                Token::new($kind, name.as_ref().as_bytes()).map($ty)
            }

            #[doc = concat!("Builds a ", $kind, " name from raw bytes (for example a header value).")]
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidName> {
                Token::new($kind, bytes).map($ty)
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                self.0.as_str()
            }

            /// The name, already encoded as a header value (cloning it does not copy).
            pub fn header_value(&self) -> &HeaderValue {
                &(self.0).0.value
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self.as_str(), f)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Hash for $ty {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.as_str().hash(state)
            }
        }

        impl Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                self.as_str()
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl std::str::FromStr for $ty {
            type Err = InvalidName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = InvalidName;
            fn try_from(s: &str) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = InvalidName;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                Self::new(s)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(&*s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// The name of a gray lane (`gray`, `canary-2`). A request without a lane is baseline.
    ///
    /// Cloning is an `Arc` increment; equality compares names.
    Lane,
    "lane"
);

name_type!(
    /// The name of a service version (`v2`, `2.0`), as used by version pins and the
    /// `version` / `versions` instance labels.
    ///
    /// Cloning is an `Arc` increment; equality compares names.
    Version,
    "version"
);

/// The interner codecs use while decoding: known names come back as clones, without
/// allocating; unknown names are built on the spot.
///
/// Fill it at configuration time with every lane and version your rules and registry use.
#[derive(Debug, Clone, Default)]
pub struct Names {
    lanes: HashMap<Box<str>, Lane>,
    versions: HashMap<Box<str>, Version>,
}

impl Names {
    /// An empty interner: every decoded name is built on the spot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds lanes that decode without allocating.
    pub fn with_lanes(mut self, lanes: impl IntoIterator<Item = Lane>) -> Self {
        for lane in lanes {
            self.lanes.insert(lane.as_str().into(), lane);
        }
        self
    }

    /// Adds versions that decode without allocating.
    pub fn with_versions(mut self, versions: impl IntoIterator<Item = Version>) -> Self {
        for version in versions {
            self.versions.insert(version.as_str().into(), version);
        }
        self
    }

    /// Adds one lane.
    pub fn insert_lane(&mut self, lane: Lane) {
        self.lanes.insert(lane.as_str().into(), lane);
    }

    /// Adds one version.
    pub fn insert_version(&mut self, version: Version) {
        self.versions.insert(version.as_str().into(), version);
    }

    /// The lane named by `bytes`: the interned one when known, a new one otherwise.
    pub fn lane(&self, bytes: &[u8]) -> Result<Lane, InvalidName> {
        match std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| self.lanes.get(s))
        {
            Some(lane) => Ok(lane.clone()),
            None => Lane::from_bytes(bytes),
        }
    }

    /// The version named by `bytes`: the interned one when known, a new one otherwise.
    pub fn version(&self, bytes: &[u8]) -> Result<Version, InvalidName> {
        match std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| self.versions.get(s))
        {
            Some(version) => Ok(version.clone()),
            None => Version::from_bytes(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_validate() {
        assert!(Lane::new("gray").is_ok());
        assert!(Lane::new("canary-2.a_b").is_ok());
        assert!(Lane::new("").is_err());
        assert!(Lane::new("a b").is_err());
        assert!(Lane::new("é").is_err());
        assert!(Lane::new("x".repeat(65)).is_err());
        assert!(Version::new("2.0").is_ok());
        let err = Version::new("2,0").unwrap_err();
        assert!(err.to_string().contains("invalid version name"), "{err}");
    }

    #[test]
    fn interner_returns_the_known_instance() {
        let gray = Lane::new("gray").unwrap();
        let names = Names::new().with_lanes([gray.clone()]);
        let found = names.lane(b"gray").unwrap();
        assert!(Arc::ptr_eq(&(found.0).0, &(gray.0).0));
        let other = names.lane(b"blue").unwrap();
        assert_eq!(other, "blue");
        assert!(names.lane(b"\xff").is_err());
    }

    #[test]
    fn serde_round_trip() {
        let lane: Lane = serde_json::from_str("\"canary\"").unwrap();
        assert_eq!(serde_json::to_string(&lane).unwrap(), "\"canary\"");
        assert!(serde_json::from_str::<Lane>("\"bad name\"").is_err());
    }
}
