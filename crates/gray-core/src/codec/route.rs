use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::{DEFAULT_ROUTE_MAX_LEN, Decoded, OneHeader, Reason, Rejection};
use crate::{
    name::Names,
    stain::{Pins, Stain, validate_service},
};

/// Seed 002's JSON route header: `x-gray-info: {"all":"v2","custom":{"svc-b":"v3"}}`.
///
/// `all` pins one version for every service; an entry in `custom` wins for its service.
/// Unknown fields are ignored and empty strings count as absent. A value that does not
/// parse is ignored as a whole. Writing re-emits the pins exactly as they arrived.
///
/// ```
/// use gray_core::{Carriers, codec::RouteHeader};
/// use http::{HeaderMap, HeaderName, HeaderValue};
///
/// let carriers = Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
/// let mut headers = HeaderMap::new();
/// headers.insert(
///     "x-gray-info",
///     HeaderValue::from_static(r#"{"all":"v2","custom":{"svc-b":"v3"}}"#),
/// );
/// let stain = carriers.extract(&headers).unwrap();
/// assert_eq!(stain.version_for("svc-a").unwrap(), "v2");
/// assert_eq!(stain.version_for("svc-b").unwrap(), "v3");
/// ```
#[derive(Debug, Clone)]
pub struct RouteHeader {
    pub(super) header: OneHeader,
}

#[derive(serde::Deserialize)]
struct RouteJson {
    #[serde(default)]
    all: Option<String>,
    #[serde(default)]
    custom: Option<BTreeMap<String, Option<String>>>,
}

impl RouteHeader {
    /// The route header named `name`, capped at 4096 bytes.
    pub fn new(name: HeaderName) -> Self {
        RouteHeader {
            header: OneHeader::new(name, DEFAULT_ROUTE_MAX_LEN),
        }
    }

    /// Caps the accepted value length; longer values are ignored.
    #[must_use]
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.header.max_len = max_len;
        self
    }

    /// The header name.
    pub fn header_name(&self) -> &HeaderName {
        &self.header.name
    }

    /// Decodes the header's (first) value.
    pub(super) fn decode_value(
        &self,
        value: &HeaderValue,
        names: &Names,
    ) -> Result<Option<Decoded>, Rejection> {
        let reject = |reason| Rejection::new(&self.header.name, reason);
        if value.as_bytes().trim_ascii_start().first() != Some(&b'{') {
            return Err(reject(Reason::InvalidJson("expected a JSON object".into())));
        }
        let json: RouteJson = serde_json::from_slice(value.as_bytes())
            .map_err(|e| reject(Reason::InvalidJson(e.to_string())))?;
        let all = match json.all.as_deref() {
            None | Some("") => None,
            Some(v) => Some(
                names
                    .version(v.as_bytes())
                    .map_err(|e| reject(Reason::InvalidName(e)))?,
            ),
        };
        let mut services = BTreeMap::new();
        for (service, version) in json.custom.into_iter().flatten() {
            let Some(version) = version.filter(|v| !v.is_empty()) else {
                continue;
            };
            validate_service(&service).map_err(|e| reject(Reason::InvalidService(e)))?;
            let version = names
                .version(version.as_bytes())
                .map_err(|e| reject(Reason::InvalidName(e)))?;
            services.insert(service.into_boxed_str(), version);
        }
        if all.is_none() && services.is_empty() {
            return Ok(None);
        }
        Ok(Some(Decoded::Pins(
            Pins::from_parts(all, services, Some(value.clone())).into(),
        )))
    }

    pub(super) fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
        match stain.pins() {
            Some(pins) => {
                headers.insert(&self.header.name, pins.route_header_value().clone());
            }
            None => {
                headers.remove(&self.header.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::Carriers;

    fn extract(value: &'static [u8]) -> Option<Stain> {
        let c = Carriers::new().with(RouteHeader::new(HeaderName::from_static("x-gray-info")));
        let mut h = HeaderMap::new();
        h.insert("x-gray-info", HeaderValue::from_bytes(value).unwrap());
        c.extract(&h)
    }

    #[test]
    fn parses_seed_002_and_round_trips() {
        let raw = br#"{"all":"v2","custom":{"svc-b":"v3"},"note":"ignored"}"#;
        let stain = extract(raw).unwrap();
        assert_eq!(stain.version_for("svc-b").unwrap(), "v3");
        assert_eq!(stain.version_for("svc-c").unwrap(), "v2");
        let mut out = HeaderMap::new();
        Carriers::new()
            .with(RouteHeader::new(HeaderName::from_static("x-gray-info")))
            .inject(&stain, &mut out);
        assert_eq!(out["x-gray-info"].as_bytes(), raw);
    }

    #[test]
    fn broken_json_is_unstained() {
        for raw in [
            &br#"{"all":"v2""#[..],
            b"not json",
            br#"{"all":42}"#,
            br#"{"all":"bad version"}"#,
            br#"{"custom":{"":"v1"}}"#,
            b"[]",
            b"\xff",
        ] {
            let stain = extract(raw).unwrap();
            assert!(stain.is_baseline(), "{}", String::from_utf8_lossy(raw));
        }
        assert_eq!(extract(br#"{"all":"","custom":{"a":null}}"#), None);
    }
}
