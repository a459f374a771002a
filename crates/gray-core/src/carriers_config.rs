//! Carriers named in a configuration file: [`CarrierConfig`] builds a [`Carrier`], a list
//! of them builds [`Carriers`].
//!
//! Each entry has a `kind` and, optionally, the header (or baggage key) and settings; what
//! is left out takes the default of its kind, which is the header the seeds use:
//!
//! | `kind` | fields (default) | builds | example on the wire |
//! |---|---|---|---|
//! | `flag` | `header` (`gray`), `lane` (`gray`), `max_len` (256) | [`PlainHeader::flag`] | seed 000's `gray: true`; seed 003's `x-gray-flag: true` |
//! | `lane` | `header` (`x-gray-lane`), `max_len` (256) | [`PlainHeader::lane`] | `x-gray-lane: canary-2` |
//! | `version` | `header` (`version`), `max_len` (256) | [`PlainHeader::version`] | seed 001's `version: 2.0` |
//! | `route` | `header` (`x-gray-info`), `max_len` (4096) | [`RouteHeader`] | seed 002's `x-gray-info: {"all":"v2"}` |
//! | `baggage` | `key` ([`DEFAULT_BAGGAGE_KEY`]) | [`BaggageMember`] | `baggage: gray.lane=gray,userId=42` |
//!
//! Unknown kinds and fields are errors; header names, lanes and keys are checked while the
//! file is read, so the error carries the position a `serde_path_to_error` loader reports.
//!
//! In code, the constructors build the same entries, with the same defaults:
//! [`CarrierConfig::flag`], [`lane`](CarrierConfig::lane), [`version`](CarrierConfig::version),
//! [`route`](CarrierConfig::route) and [`baggage`](CarrierConfig::baggage), then
//! [`with_header`](CarrierConfig::with_header), [`with_max_len`](CarrierConfig::with_max_len),
//! [`with_lane`](CarrierConfig::with_lane) and [`with_member`](CarrierConfig::with_member)
//! as fits the kind. A carrier of your own ([`CustomCarrier`](crate::codec::CustomCarrier))
//! has no entry here: add it to the [`Carriers`] these build.
//!
//! ```
//! use gray_core::CarrierConfig;
//! use http::HeaderMap;
//!
//! #[derive(Debug, serde::Deserialize)]
//! struct Config {
//!     carriers: Vec<CarrierConfig>,
//! }
//!
//! let config: Config = serde_json::from_str(r#"{ "carriers": [
//!     { "kind": "flag" },
//!     { "kind": "lane" },
//!     { "kind": "version", "header": "x-version" },
//!     { "kind": "baggage" }
//! ] }"#)?;
//! let carriers = CarrierConfig::carriers(&config.carriers);
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("gray", "TRUE".parse()?);
//! headers.insert("x-version", "2.0".parse()?);
//! let stain = carriers.extract(&headers).unwrap_or_default();
//! assert_eq!(stain.lane().unwrap(), "gray");
//! assert_eq!(stain.version_for("orders").unwrap(), "2.0");
//!
//! let bad = serde_json::from_str::<Config>(r#"{ "carriers": [{ "kind": "lane", "header": "a b" }] }"#);
//! assert!(bad.unwrap_err().to_string().contains("a valid HTTP header name"));
//!
//! // The same list in code.
//! let in_code = [
//!     CarrierConfig::flag(),
//!     CarrierConfig::lane(),
//!     CarrierConfig::version().with_header(http::HeaderName::from_static("x-version")),
//!     CarrierConfig::baggage(),
//! ];
//! let headers = |list: &[CarrierConfig]| list.iter().map(|c| c.header().clone()).collect::<Vec<_>>();
//! assert_eq!(headers(&in_code), headers(&config.carriers));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use http::HeaderName;
use serde::{Deserialize, Deserializer, de::Error as _};

use crate::{
    codec::{
        BaggageMember, Carrier, Carriers, DEFAULT_BAGGAGE_KEY, DEFAULT_PLAIN_MAX_LEN,
        DEFAULT_ROUTE_MAX_LEN, PlainHeader, RouteHeader, X_GRAY_INFO, X_GRAY_LANE,
    },
    name::Lane,
};

/// Seed 000's flag header, `gray`.
pub const GRAY: HeaderName = HeaderName::from_static("gray");
/// Seed 001's version header, `version`.
pub const VERSION: HeaderName = HeaderName::from_static("version");

/// One carrier, as a configuration file names it; see the [module docs](self).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum CarrierConfig {
    /// A boolean flag: `true` puts the request in `lane`, `false` marks it baseline
    /// (case-insensitive; anything else is unstained).
    #[non_exhaustive]
    Flag {
        /// The header (default `gray`).
        #[serde(default = "gray_header", deserialize_with = "header_name")]
        header: HeaderName,
        /// The lane `true` means (default `gray`).
        #[serde(default = "gray_lane")]
        lane: Lane,
        /// The longest value read, in bytes (default 256).
        #[serde(default = "plain_max_len")]
        max_len: usize,
    },
    /// A lane name.
    #[non_exhaustive]
    Lane {
        /// The header (default `x-gray-lane`).
        #[serde(default = "lane_header", deserialize_with = "header_name")]
        header: HeaderName,
        /// The longest value read, in bytes (default 256).
        #[serde(default = "plain_max_len")]
        max_len: usize,
    },
    /// A version pinned for every service.
    #[non_exhaustive]
    Version {
        /// The header (default `version`).
        #[serde(default = "version_header", deserialize_with = "header_name")]
        header: HeaderName,
        /// The longest value read, in bytes (default 256).
        #[serde(default = "plain_max_len")]
        max_len: usize,
    },
    /// Seed 002's JSON route header.
    #[non_exhaustive]
    Route {
        /// The header (default `x-gray-info`).
        #[serde(default = "route_header", deserialize_with = "header_name")]
        header: HeaderName,
        /// The longest value read, in bytes (default 4096).
        #[serde(default = "route_max_len")]
        max_len: usize,
    },
    /// A member of the W3C `baggage` header.
    #[non_exhaustive]
    Baggage {
        /// The member, by its key (field `key`, default [`DEFAULT_BAGGAGE_KEY`]).
        #[serde(
            rename = "key",
            default = "default_member",
            deserialize_with = "baggage_member"
        )]
        member: BaggageMember,
    },
}

// === impl CarrierConfig: constructors ===

impl CarrierConfig {
    /// A boolean flag (`kind = "flag"`): header `gray`, lane `gray`, values up to 256 bytes.
    #[must_use]
    pub fn flag() -> Self {
        CarrierConfig::Flag {
            header: GRAY,
            lane: gray_lane(),
            max_len: DEFAULT_PLAIN_MAX_LEN,
        }
    }

    /// A lane name (`kind = "lane"`): header `x-gray-lane`, values up to 256 bytes.
    #[must_use]
    pub fn lane() -> Self {
        CarrierConfig::Lane {
            header: X_GRAY_LANE,
            max_len: DEFAULT_PLAIN_MAX_LEN,
        }
    }

    /// A version pinned for every service (`kind = "version"`): header `version`, values
    /// up to 256 bytes.
    #[must_use]
    pub fn version() -> Self {
        CarrierConfig::Version {
            header: VERSION,
            max_len: DEFAULT_PLAIN_MAX_LEN,
        }
    }

    /// Seed 002's JSON route header (`kind = "route"`): header `x-gray-info`, values up
    /// to 4096 bytes.
    #[must_use]
    pub fn route() -> Self {
        CarrierConfig::Route {
            header: X_GRAY_INFO,
            max_len: DEFAULT_ROUTE_MAX_LEN,
        }
    }

    /// A member of the W3C `baggage` header (`kind = "baggage"`): key
    /// [`DEFAULT_BAGGAGE_KEY`].
    #[must_use]
    pub fn baggage() -> Self {
        CarrierConfig::Baggage {
            member: default_member(),
        }
    }

    /// The header a flag, lane, version or route entry reads. A `baggage` entry lives in
    /// `baggage` whatever this says: name its member with [`with_member`](Self::with_member).
    #[must_use]
    pub fn with_header(mut self, name: HeaderName) -> Self {
        match &mut self {
            CarrierConfig::Flag { header, .. }
            | CarrierConfig::Lane { header, .. }
            | CarrierConfig::Version { header, .. }
            | CarrierConfig::Route { header, .. } => *header = name,
            CarrierConfig::Baggage { .. } => {}
        }
        self
    }

    /// The longest value a flag, lane, version or route entry reads, in bytes (a `baggage`
    /// member's caps are [`BaggageMember`]'s own).
    #[must_use]
    pub fn with_max_len(mut self, len: usize) -> Self {
        match &mut self {
            CarrierConfig::Flag { max_len, .. }
            | CarrierConfig::Lane { max_len, .. }
            | CarrierConfig::Version { max_len, .. }
            | CarrierConfig::Route { max_len, .. } => *max_len = len,
            CarrierConfig::Baggage { .. } => {}
        }
        self
    }

    /// The lane a flag entry's `true` means (other kinds have no lane of their own).
    #[must_use]
    pub fn with_lane(mut self, lane: Lane) -> Self {
        if let CarrierConfig::Flag { lane: own, .. } = &mut self {
            *own = lane;
        }
        self
    }

    /// The member a `baggage` entry reads and writes (other kinds are whole headers).
    #[must_use]
    pub fn with_member(mut self, member: BaggageMember) -> Self {
        if let CarrierConfig::Baggage { member: own } = &mut self {
            *own = member;
        }
        self
    }
}

// === impl CarrierConfig ===

impl CarrierConfig {
    /// The carrier this entry describes.
    pub fn carrier(&self) -> Carrier {
        match self {
            CarrierConfig::Flag {
                header,
                lane,
                max_len,
            } => PlainHeader::flag(header.clone(), lane.clone())
                .with_max_len(*max_len)
                .into(),
            CarrierConfig::Lane { header, max_len } => PlainHeader::lane(header.clone())
                .with_max_len(*max_len)
                .into(),
            CarrierConfig::Version { header, max_len } => PlainHeader::version(header.clone())
                .with_max_len(*max_len)
                .into(),
            CarrierConfig::Route { header, max_len } => RouteHeader::new(header.clone())
                .with_max_len(*max_len)
                .into(),
            CarrierConfig::Baggage { member } => member.clone().into(),
        }
    }

    /// The carriers `list` describes, in order (earlier ones win when several are present).
    pub fn carriers(list: &[CarrierConfig]) -> Carriers {
        list.iter()
            .fold(Carriers::new(), |carriers, c| carriers.with(c.carrier()))
    }

    /// The header this entry reads (`baggage` for a baggage member).
    pub fn header(&self) -> &HeaderName {
        match self {
            CarrierConfig::Flag { header, .. }
            | CarrierConfig::Lane { header, .. }
            | CarrierConfig::Version { header, .. }
            | CarrierConfig::Route { header, .. } => header,
            CarrierConfig::Baggage { .. } => &BAGGAGE,
        }
    }
}

static BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// The stain's `baggage` member under [`DEFAULT_BAGGAGE_KEY`].
#[must_use]
pub fn default_member() -> BaggageMember {
    match BaggageMember::new(DEFAULT_BAGGAGE_KEY) {
        Ok(member) => member,
        Err(_) => unreachable!("`gray.lane` is a valid baggage key"),
    }
}

fn gray_header() -> HeaderName {
    GRAY
}

fn lane_header() -> HeaderName {
    X_GRAY_LANE
}

fn version_header() -> HeaderName {
    VERSION
}

fn route_header() -> HeaderName {
    X_GRAY_INFO
}

fn gray_lane() -> Lane {
    match Lane::new("gray") {
        Ok(lane) => lane,
        Err(_) => unreachable!("`gray` is a valid lane"),
    }
}

fn plain_max_len() -> usize {
    DEFAULT_PLAIN_MAX_LEN
}

fn route_max_len() -> usize {
    DEFAULT_ROUTE_MAX_LEN
}

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<HeaderName, D::Error> {
    let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        D::Error::custom(format_args!(
            "expected a valid HTTP header name, found {name:?}"
        ))
    })
}

fn baggage_member<'de, D: Deserializer<'de>>(d: D) -> Result<BaggageMember, D::Error> {
    let key = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    BaggageMember::new(&key).map_err(|e| D::Error::custom(format_args!("{e}, found {key:?}")))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::stain::Stain;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        carriers: Vec<CarrierConfig>,
    }

    fn parse(json: &str) -> Result<Vec<CarrierConfig>, String> {
        serde_json::from_str::<File>(json)
            .map(|f| f.carriers)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn constructors_build_what_the_file_names() {
        let file = parse(
            r#"{"carriers":[{"kind":"flag","header":"x-gray-flag","lane":"canary","max_len":4},{"kind":"lane","max_len":8},{"kind":"version"},{"kind":"route","header":"x-route"},{"kind":"baggage","key":"lane"}]}"#,
        )
        .unwrap();
        let code = [
            CarrierConfig::flag()
                .with_header(HeaderName::from_static("x-gray-flag"))
                .with_lane(Lane::new("canary").unwrap())
                .with_max_len(4)
                .with_member(default_member()),
            CarrierConfig::lane().with_max_len(8).with_lane(gray_lane()),
            CarrierConfig::version(),
            CarrierConfig::route().with_header(HeaderName::from_static("x-route")),
            CarrierConfig::baggage()
                .with_member(BaggageMember::new("lane").unwrap())
                .with_header(GRAY)
                .with_max_len(1),
        ];
        // The same entries: the same Debug, field for field.
        assert_eq!(format!("{file:?}"), format!("{code:?}"));
        let headers: Vec<_> = code.iter().map(|c| c.header().as_str()).collect();
        assert_eq!(
            headers,
            [
                "x-gray-flag",
                "x-gray-lane",
                "version",
                "x-route",
                "baggage"
            ]
        );
        // And the carriers they build behave the same.
        let (from_file, from_code) = (
            CarrierConfig::carriers(&file),
            CarrierConfig::carriers(&code),
        );
        let mut h = HeaderMap::new();
        h.insert("x-gray-flag", HeaderValue::from_static("TRUE"));
        assert_eq!(from_code.extract(&h), from_file.extract(&h));
        assert_eq!(from_code.extract(&h).unwrap().lane().unwrap(), "canary");
        h.insert("x-gray-flag", HeaderValue::from_static("TRUE!"));
        assert!(from_code.extract(&h).unwrap().is_baseline(), "over max_len");
    }

    #[test]
    fn defaults_are_the_seed_headers() {
        let list = parse(
            r#"{"carriers":[{"kind":"flag"},{"kind":"lane"},{"kind":"version"},{"kind":"route"},{"kind":"baggage"}]}"#,
        )
        .unwrap();
        let headers: Vec<_> = list.iter().map(|c| c.header().as_str()).collect();
        assert_eq!(
            headers,
            ["gray", "x-gray-lane", "version", "x-gray-info", "baggage"]
        );
        let carriers = CarrierConfig::carriers(&list);
        let gray = Stain::in_lane(gray_lane());
        let mut out = HeaderMap::new();
        carriers.inject(&gray, &mut out);
        assert_eq!(out["gray"], "true");
        assert_eq!(out["x-gray-lane"], "gray");
        assert_eq!(out["baggage"], "gray.lane=gray");
        assert_eq!(carriers.extract(&out), Some(gray));
    }

    #[test]
    fn named_headers_lanes_and_keys() {
        let list = parse(
            r#"{"carriers":[{"kind":"flag","header":"X-Gray-Flag","lane":"canary"},{"kind":"baggage","key":"lane"}]}"#,
        )
        .unwrap();
        let carriers = CarrierConfig::carriers(&list);
        let mut h = HeaderMap::new();
        h.insert("x-gray-flag", HeaderValue::from_static("true"));
        assert_eq!(
            carriers.extract(&h).unwrap().lane().unwrap().as_str(),
            "canary"
        );
        let mut h = HeaderMap::new();
        h.insert("baggage", HeaderValue::from_static("a=1,lane=blue"));
        assert_eq!(
            carriers.extract(&h).unwrap().lane().unwrap().as_str(),
            "blue"
        );
    }

    #[test]
    fn errors_name_what_is_wrong() {
        for (json, expected) in [
            (r#"{"kind":"colour"}"#, "unknown variant `colour`"),
            (r#"{"kind":"lane","key":"x"}"#, "unknown field `key`"),
            (
                r#"{"kind":"lane","header":"a b"}"#,
                "expected a valid HTTP header name, found \"a b\"",
            ),
            (r#"{"kind":"flag","lane":"a b"}"#, "lane"),
            (r#"{"kind":"baggage","key":"a,b"}"#, "invalid baggage key"),
            (r#"{"header":"gray"}"#, "missing field `kind`"),
        ] {
            let e = parse(&format!(r#"{{"carriers":[{json}]}}"#)).unwrap_err();
            assert!(e.contains(expected), "{json}: {e}");
        }
    }
}
