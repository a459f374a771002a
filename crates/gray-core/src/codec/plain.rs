use http::{HeaderMap, HeaderName, HeaderValue};

use super::{DEFAULT_PLAIN_MAX_LEN, Decoded, OneHeader, Reason, Rejection};
use crate::{
    name::{Lane, Names},
    stain::{Pins, Stain},
};

/// A plain header that carries the stain: a boolean flag, a lane name, or a version.
///
/// ```
/// use gray_core::{Carriers, Lane, codec::PlainHeader};
/// use http::{HeaderMap, HeaderName, HeaderValue};
///
/// // Seed 000: `gray: true`, case-insensitive; anything else is unstained.
/// let carriers = Carriers::new().with(PlainHeader::flag(
///     HeaderName::from_static("gray"),
///     Lane::new("gray").unwrap(),
/// ));
/// let mut headers = HeaderMap::new();
/// headers.insert("gray", HeaderValue::from_static("TRUE"));
/// assert_eq!(carriers.extract(&headers).unwrap().lane().unwrap(), "gray");
/// headers.insert("gray", HeaderValue::from_static("yes"));
/// assert!(carriers.extract(&headers).unwrap().is_baseline());
/// ```
#[derive(Debug, Clone)]
pub struct PlainHeader {
    pub(super) header: OneHeader,
    form: Form,
}

#[derive(Debug, Clone)]
enum Form {
    Flag(Lane),
    Lane,
    Version,
}

const TRUE: HeaderValue = HeaderValue::from_static("true");

impl PlainHeader {
    /// A boolean flag (seed 000, seed 003's `X-Gray-Flag`): `true` puts the request in `lane`,
    /// `false` marks it baseline explicitly, both case-insensitive; any other value is ignored.
    ///
    /// Writing puts `true` when the stain is in `lane` and nothing otherwise.
    pub fn flag(name: HeaderName, lane: Lane) -> Self {
        PlainHeader {
            header: OneHeader::new(name, DEFAULT_PLAIN_MAX_LEN),
            form: Form::Flag(lane),
        }
    }

    /// A lane name (`x-gray-lane: canary-2`).
    pub fn lane(name: HeaderName) -> Self {
        PlainHeader {
            header: OneHeader::new(name, DEFAULT_PLAIN_MAX_LEN),
            form: Form::Lane,
        }
    }

    /// A version pinned for every service (seed 001's `version: 2.0`).
    ///
    /// Writing puts the stain's `all` pin; per-service pins need a [`super::RouteHeader`].
    pub fn version(name: HeaderName) -> Self {
        PlainHeader {
            header: OneHeader::new(name, DEFAULT_PLAIN_MAX_LEN),
            form: Form::Version,
        }
    }

    /// Caps the accepted value length (default 256 bytes); longer values are ignored.
    #[must_use]
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.header.max_len = max_len;
        self
    }

    /// The header name.
    pub fn header_name(&self) -> &HeaderName {
        &self.header.name
    }

    pub(super) fn flag_lane(&self) -> Option<&Lane> {
        match &self.form {
            Form::Flag(lane) => Some(lane),
            _ => None,
        }
    }

    /// Decodes the header's (first) value.
    pub(super) fn decode_value(
        &self,
        value: &HeaderValue,
        names: &Names,
    ) -> Result<Option<Decoded>, Rejection> {
        let bytes = value.as_bytes();
        let stain = match &self.form {
            Form::Flag(lane) => {
                if bytes.eq_ignore_ascii_case(b"true") {
                    Decoded::Lane(lane.clone())
                } else if bytes.eq_ignore_ascii_case(b"false") {
                    Decoded::Baseline
                } else {
                    return Err(Rejection::new(&self.header.name, Reason::NotABoolean));
                }
            }
            Form::Lane => Decoded::Lane(
                names
                    .lane(bytes)
                    .map_err(|e| Rejection::new(&self.header.name, Reason::InvalidName(e)))?,
            ),
            Form::Version => {
                let version = names
                    .version(bytes)
                    .map_err(|e| Rejection::new(&self.header.name, Reason::InvalidName(e)))?;
                Decoded::Pins(Pins::all(version).into())
            }
        };
        Ok(Some(stain))
    }

    pub(super) fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
        let value = match &self.form {
            Form::Flag(lane) => (stain.lane() == Some(lane)).then_some(TRUE),
            Form::Lane => stain.lane().map(|l| l.header_value().clone()),
            Form::Version => stain
                .pins()
                .and_then(Pins::all_version)
                .map(|v| v.header_value().clone()),
        };
        match value {
            Some(value) => {
                headers.insert(&self.header.name, value);
            }
            None => {
                headers.remove(&self.header.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Carriers;

    fn carriers(plain: PlainHeader) -> Carriers {
        Carriers::new().with(plain)
    }

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    #[test]
    fn flag_is_lenient_and_case_insensitive() {
        let c = carriers(PlainHeader::flag(
            HeaderName::from_static("gray"),
            Lane::new("gray").unwrap(),
        ));
        for v in [&b"true"[..], b"TRUE", b"True", b"tRuE"] {
            let stain = c.extract(&headers(&[("gray", v)])).unwrap();
            assert_eq!(stain.lane().unwrap(), "gray");
        }
        for v in [&b"false"[..], b"FALSE", b"False"] {
            let stain = c.extract(&headers(&[("gray", v)])).unwrap();
            assert!(stain.is_baseline());
        }
        for v in [&b"yes"[..], b"1", b"truee", b" true x", b"\xff\xfe"] {
            let stain = c.extract(&headers(&[("gray", v)])).unwrap();
            assert!(stain.is_baseline(), "{v:?}");
        }
        assert_eq!(c.extract(&HeaderMap::new()), None);
    }

    #[test]
    fn flag_writes_true_only_for_its_lane() {
        let gray = Lane::new("gray").unwrap();
        let c = carriers(PlainHeader::flag(
            HeaderName::from_static("gray"),
            gray.clone(),
        ));
        let mut h = HeaderMap::new();
        c.inject(&Stain::in_lane(gray), &mut h);
        assert_eq!(h["gray"], "true");
        c.inject(&Stain::in_lane(Lane::new("blue").unwrap()), &mut h);
        assert!(h.get("gray").is_none());
    }

    #[test]
    fn duplicates_are_read_as_their_first_value() {
        let c = carriers(PlainHeader::flag(
            HeaderName::from_static("gray"),
            Lane::new("gray").unwrap(),
        ));
        let false_true = headers(&[("gray", b"false"), ("gray", b"true")]);
        assert!(c.extract(&false_true).unwrap().is_baseline());
        let true_false = headers(&[("gray", b"true"), ("gray", b"false")]);
        assert_eq!(c.extract(&true_false).unwrap().lane().unwrap(), "gray");
        // The first value decides even when it is unusable.
        let bad_first = headers(&[("gray", b"yes"), ("gray", b"true")]);
        assert!(c.extract(&bad_first).unwrap().is_baseline());
    }

    #[test]
    fn rejects_oversize_and_bad_names() {
        let c = carriers(PlainHeader::lane(HeaderName::from_static("x-gray-lane")).with_max_len(8));
        let mut seen = Vec::new();
        let long = headers(&[("x-gray-lane", b"abcdefghij")]);
        assert_eq!(
            c.extract_with(&long, |r| seen.push(r.reason().clone())),
            Some(Stain::baseline())
        );
        let bad = headers(&[("x-gray-lane", b"a b")]);
        assert_eq!(
            c.extract_with(&bad, |r| seen.push(r.reason().clone())),
            Some(Stain::baseline())
        );
        let empty = headers(&[("x-gray-lane", b"")]);
        assert_eq!(
            c.extract_with(&empty, |r| seen.push(r.reason().clone())),
            Some(Stain::baseline())
        );
        assert!(matches!(seen[0], Reason::TooLong { len: 10, max: 8 }));
        assert!(matches!(seen[1], Reason::InvalidName(_)));
        assert!(matches!(seen[2], Reason::Empty));
    }

    #[test]
    fn version_form_pins_all() {
        let c = carriers(PlainHeader::version(HeaderName::from_static("version")));
        let stain = c.extract(&headers(&[("version", b"2.0")])).unwrap();
        assert_eq!(stain.version_for("anything").unwrap(), "2.0");
        let mut out = HeaderMap::new();
        c.inject(&stain, &mut out);
        assert_eq!(out["version"], "2.0");
    }
}
