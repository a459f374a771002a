//! Lane and version names, interned once so the request path only clones an `Arc`.
//!
//! A [`Lane`] names a gray lane (`gray`, `canary-2`); a [`Version`] names a service version
//! (`v2`, `2.0`). Both are short tokens of ASCII letters, digits, `.`, `_` and `-`, at most
//! [`MAX_NAME_LEN`] bytes, so they can be written as a header value, a JSON string or a
//! `baggage` value without escaping. Each keeps its encoded [`HeaderValue`], so writing it
//! to an outbound request copies nothing.
//!
//! # Case
//!
//! **Lane names are case-insensitive**: every lane is lowercased when it is built, wherever
//! it comes from (a header such as `x-gray-lane: Gray`, a `baggage` member, a rule file, an
//! instance label `lane=Gray`, OpenTelemetry baggage, or [`Lane::new`] in code), so `Gray`,
//! `GRAY` and `gray` are one lane, written onward as `gray`. **Version names are
//! case-sensitive** (`v2` and `V2` are two versions), as registries report them.
//!
//! [`Names`] is the interner that codecs use while decoding: a name it already knows, or
//! has learned from an earlier request, is returned as a clone of the known one (no
//! allocation); an unknown one is built on the spot and learned, up to a cap.
//!
//! ```
//! use gray_core::{Lane, Names};
//!
//! let names = Names::new().with_lanes([Lane::new("gray").unwrap()]);
//! let lane = names.lane(b"gray").unwrap();
//! assert_eq!(lane.as_str(), "gray");
//! assert!(Lane::new("no spaces").is_err());
//!
//! // Lanes are lowercased wherever they come from; versions keep their case.
//! assert_eq!(names.lane(b"Gray").unwrap(), lane);
//! assert_eq!(Lane::new("CANARY-2").unwrap().as_str(), "canary-2");
//! assert_eq!(gray_core::Version::new("V2").unwrap().as_str(), "V2");
//! ```

use std::{borrow::Borrow, collections::HashMap, fmt, hash::Hash, sync::Arc};

use arc_swap::ArcSwap;

use http::HeaderValue;

/// The longest lane or version name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// A name that is not a valid lane or version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName {
    kind: &'static str,
    reason: &'static str,
}

// === impl InvalidName ===

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

/// How a kind of name treats ASCII case.
#[derive(Clone, Copy)]
enum Case {
    /// Lowercased when built (lanes).
    Insensitive,
    /// Kept as given (versions).
    Sensitive,
}

// === impl Token ===

impl Token {
    fn new(kind: &'static str, case: Case, bytes: &[u8]) -> Result<Self, InvalidName> {
        validate(kind, bytes)?;
        // Validated as ASCII above, so both conversions succeed.
        let name = std::str::from_utf8(bytes).map_err(|_| InvalidName {
            kind,
            reason: "it is not UTF-8",
        })?;
        let name: Box<str> = match case {
            Case::Insensitive if name.bytes().any(|b| b.is_ascii_uppercase()) => {
                name.to_ascii_lowercase().into()
            }
            _ => name.into(),
        };
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
    ($(#[$meta:meta])* $ty:ident, $kind:literal, $case:expr) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $ty(Token);

        impl $ty {
            #[doc = concat!("Builds a ", $kind, " name, checking that it is a valid token")]
            #[doc = "(see the [module docs](self) for case)."]
            pub fn new(name: impl AsRef<str>) -> Result<Self, InvalidName> {
                Token::new($kind, $case, name.as_ref().as_bytes()).map($ty)
            }

            #[doc = concat!("Builds a ", $kind, " name from raw bytes (for example a header value).")]
            pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidName> {
                Token::new($kind, $case, bytes).map($ty)
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
    /// Case-insensitive: lowercased when built (`Lane::new("Gray")` is `gray`).
    /// Cloning is an `Arc` increment; equality compares names.
    Lane,
    "lane",
    Case::Insensitive
);

name_type!(
    /// The name of a service version (`v2`, `2.0`), as used by version pins and the
    /// `version` / `versions` instance labels.
    ///
    /// Case-sensitive. Cloning is an `Arc` increment; equality compares names.
    Version,
    "version",
    Case::Sensitive
);

/// The interner codecs use while decoding: known names come back as clones, without
/// allocating; unknown names are built on the spot.
///
/// Names come from two places. Those given at configuration time ([`Names::with_lanes`],
/// [`Names::with_versions`]) are always known. Beyond them, an interner *learns* the names it
/// decodes, up to a cap ([`DEFAULT_LEARNED_NAMES`], [`Names::with_learning_cap`]): the
/// first request in a new lane builds it, every later one clones it. Learning is lock-free
/// for readers (an `arc-swap` snapshot); once the cap is reached, further unknown names are
/// built per request and never retained, so names sent by clients cannot grow memory without
/// bound. Clones of a `Names` share what they learn.
#[derive(Debug, Clone)]
pub struct Names {
    lanes: Known<Lane>,
    versions: Known<Version>,
    learned: Arc<Learned>,
}

/// How many names of a kind are looked up by comparing them one by one; those beyond
/// are hashed. A deployment has a few lanes: comparing a short name with each costs less
/// than hashing it once (about 100 instructions with `std`'s SipHash), and the hashed
/// rest keeps a lookup bounded whatever names clients send.
const COMPARED: usize = 8;

/// Names of one kind, found by comparison among the first [`COMPARED`], by hash beyond.
#[derive(Debug, Clone)]
struct Known<T> {
    few: Vec<(Box<str>, T)>,
    more: HashMap<Box<str>, T>,
}

// === impl Known ===

impl<T> Default for Known<T> {
    fn default() -> Self {
        Known {
            few: Vec::new(),
            more: HashMap::new(),
        }
    }
}

impl<T> Known<T> {
    fn get(&self, name: &str) -> Option<&T> {
        match self.few.iter().find(|(known, _)| **known == *name) {
            Some((_, found)) => Some(found),
            // An empty map answers without hashing.
            None => self.more.get(name),
        }
    }

    fn len(&self) -> usize {
        self.few.len() + self.more.len()
    }

    /// Adds `name`, or replaces what it named.
    fn insert(&mut self, name: Box<str>, value: T) {
        if let Some((_, known)) = self.few.iter_mut().find(|(known, _)| *known == name) {
            *known = value;
        } else if self.few.len() < COMPARED {
            self.few.push((name, value));
        } else {
            self.more.insert(name, value);
        }
    }

    /// Adds `name` unless it is known.
    fn insert_new(&mut self, name: &str, value: impl FnOnce() -> T) {
        if self.get(name).is_none() {
            self.insert(name.into(), value());
        }
    }
}

/// How many names an interner learns by default (lanes and versions counted apart).
pub const DEFAULT_LEARNED_NAMES: usize = 1024;

#[derive(Debug)]
struct Learned {
    cap: usize,
    lanes: ArcSwap<Known<Lane>>,
    versions: ArcSwap<Known<Version>>,
}

// === impl Learned ===

impl Learned {
    fn new(cap: usize) -> Self {
        Learned {
            cap,
            lanes: ArcSwap::default(),
            versions: ArcSwap::default(),
        }
    }
}

/// Looks `bytes` up in the fixed map, then in the learned one; builds and (under the cap)
/// learns it otherwise.
fn intern<T: Clone>(
    fixed: &Known<T>,
    learned: &ArcSwap<Known<T>>,
    cap: usize,
    bytes: &[u8],
    build: impl FnOnce(&[u8]) -> Result<T, InvalidName>,
) -> Result<T, InvalidName> {
    let Ok(s) = std::str::from_utf8(bytes) else {
        return build(bytes);
    };
    if let Some(found) = fixed.get(s) {
        return Ok(found.clone());
    }
    if let Some(found) = learned.load().get(s) {
        return Ok(found.clone());
    }
    let built = build(bytes)?;
    if cap > 0 && learned.load().len() < cap {
        learned.rcu(|known| {
            let mut known = Known::clone(known);
            if known.len() < cap {
                known.insert_new(s, || built.clone());
            }
            known
        });
    }
    Ok(built)
}

// === impl Names ===

impl Default for Names {
    fn default() -> Self {
        Self::new()
    }
}

impl Names {
    /// An interner that knows no name yet and learns up to [`DEFAULT_LEARNED_NAMES`].
    #[must_use]
    pub fn new() -> Self {
        Names {
            lanes: Known::default(),
            versions: Known::default(),
            learned: Arc::new(Learned::new(DEFAULT_LEARNED_NAMES)),
        }
    }

    /// Sets how many decoded names this interner learns (`0`: none). Forgets what it had
    /// learned.
    #[must_use]
    pub fn with_learning_cap(mut self, cap: usize) -> Self {
        self.learned = Arc::new(Learned::new(cap));
        self
    }

    /// Adds lanes that always decode without allocating.
    #[must_use]
    pub fn with_lanes(mut self, lanes: impl IntoIterator<Item = Lane>) -> Self {
        for lane in lanes {
            self.insert_lane(lane);
        }
        self
    }

    /// Adds versions that always decode without allocating.
    #[must_use]
    pub fn with_versions(mut self, versions: impl IntoIterator<Item = Version>) -> Self {
        for version in versions {
            self.insert_version(version);
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

    /// The lane named by `bytes`, lowercased: a known or learned one when there is one, a
    /// new one otherwise. `Gray` and `gray` find the same interned lane, without allocating.
    pub fn lane(&self, bytes: &[u8]) -> Result<Lane, InvalidName> {
        let mut lowered = [0u8; MAX_NAME_LEN];
        let bytes = match lowered.get_mut(..bytes.len()) {
            Some(buf) if bytes.iter().any(u8::is_ascii_uppercase) => {
                buf.copy_from_slice(bytes);
                buf.make_ascii_lowercase();
                &*buf
            }
            // Already lowercase, or too long to be a name (rejected while building).
            _ => bytes,
        };
        intern(
            &self.lanes,
            &self.learned.lanes,
            self.learned.cap,
            bytes,
            Lane::from_bytes,
        )
    }

    /// The version named by `bytes`: a known or learned one when there is one, a new one
    /// otherwise.
    pub fn version(&self, bytes: &[u8]) -> Result<Version, InvalidName> {
        intern(
            &self.versions,
            &self.learned.versions,
            self.learned.cap,
            bytes,
            Version::from_bytes,
        )
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
        assert!(names.lane(b"a b").is_err());
    }

    #[test]
    fn learns_up_to_the_cap_and_shares_with_clones() {
        let names = Names::new().with_learning_cap(2);
        let first = names.lane(b"blue").unwrap();
        let clone = names.clone();
        let again = clone.lane(b"blue").unwrap();
        assert!(
            Arc::ptr_eq(&(first.0).0, &(again.0).0),
            "learned once, shared"
        );
        let _ = names.lane(b"green").unwrap();
        let red = names.lane(b"red").unwrap();
        let red_again = names.lane(b"red").unwrap();
        assert_eq!(red, red_again);
        assert!(
            !Arc::ptr_eq(&(red.0).0, &(red_again.0).0),
            "over the cap: not retained"
        );
        let off = Names::new().with_learning_cap(0);
        let a = off.lane(b"blue").unwrap();
        let b = off.lane(b"blue").unwrap();
        assert!(!Arc::ptr_eq(&(a.0).0, &(b.0).0));
        // Invalid names are never learned.
        assert!(names.version(b"").is_err());
    }

    #[test]
    fn lanes_are_lowercased_and_versions_keep_their_case() {
        let gray = Lane::new("gray").unwrap();
        assert_eq!(Lane::new("Gray").unwrap(), gray);
        assert_eq!(Lane::from_bytes(b"GRAY").unwrap().header_value(), "gray");
        let names = Names::new().with_lanes([gray.clone()]);
        for spelling in [&b"Gray"[..], b"GRAY", b"gRaY", b"gray"] {
            let found = names.lane(spelling).unwrap();
            assert!(Arc::ptr_eq(&(found.0).0, &(gray.0).0), "{spelling:?}");
        }
        // A learned lane is learned once, under its lowercase name.
        let learning = Names::new();
        let first = learning.lane(b"Blue").unwrap();
        let again = learning.lane(b"BLUE").unwrap();
        assert_eq!(first.as_str(), "blue");
        assert!(Arc::ptr_eq(&(first.0).0, &(again.0).0));
        assert_ne!(Version::new("V2").unwrap(), Version::new("v2").unwrap());
        let lane: Lane = serde_json::from_str("\"Canary\"").unwrap();
        assert_eq!(lane, "canary");
        assert!(names.lane(&[b'A'; 65]).is_err());
    }

    #[test]
    fn many_names_are_found_compared_and_hashed() {
        // More names than are compared one by one: the rest are found by hash.
        let fixed: Vec<Lane> = (0..3 * COMPARED)
            .map(|i| Lane::new(format!("fixed-{i}")).unwrap())
            .collect();
        let names = Names::new().with_lanes(fixed.clone());
        for lane in &fixed {
            let found = names.lane(lane.as_str().to_uppercase().as_bytes()).unwrap();
            assert!(Arc::ptr_eq(&(found.0).0, &(lane.0).0), "{lane}");
        }
        // Learned ones too, each learned once.
        let learned: Vec<Lane> = (0..3 * COMPARED)
            .map(|i| names.lane(format!("learned-{i}").as_bytes()).unwrap())
            .collect();
        for lane in &learned {
            let again = names.lane(lane.as_str().as_bytes()).unwrap();
            assert!(Arc::ptr_eq(&(again.0).0, &(lane.0).0), "{lane}");
        }
        assert_eq!(names.learned.lanes.load().len(), 3 * COMPARED);
        // Adding a known name again replaces it, in either part.
        let mut names = names;
        for i in [0, 2 * COMPARED] {
            let lane = Lane::new(format!("fixed-{i}")).unwrap();
            names.insert_lane(lane.clone());
            let found = names.lane(lane.as_str().as_bytes()).unwrap();
            assert!(Arc::ptr_eq(&(found.0).0, &(lane.0).0));
            assert_eq!(names.lanes.len(), 3 * COMPARED);
        }
    }

    #[test]
    fn serde_round_trip() {
        let lane: Lane = serde_json::from_str("\"canary\"").unwrap();
        assert_eq!(serde_json::to_string(&lane).unwrap(), "\"canary\"");
        assert!(serde_json::from_str::<Lane>("\"bad name\"").is_err());
    }
}
