//! The instance model: a stable [`InstanceId`], an [`Address`] and [`Labels`].
//!
//! ```
//! use gray_core::{Labelled, Labels};
//! use gray_discovery::{Address, Instance};
//!
//! let instance = Instance::new(
//!     "orders-1".parse()?,
//!     "127.0.0.1:8081".parse()?,
//!     Labels::from_iter([("gray", "true")]),
//! );
//! assert_eq!(instance.id().as_str(), "orders-1");
//! // The canonical form of an address: `host:port` for plain HTTP, `https://host:port` else.
//! assert_eq!(instance.address().to_string(), "127.0.0.1:8081");
//! assert_eq!(instance.labels().get("gray"), Some("true"));
//! # Ok::<(), gray_discovery::Error>(())
//! ```

use std::{borrow::Borrow, fmt, str::FromStr, sync::Arc};

use gray_core::{Labelled, Labels, Origin};
use http::{
    Uri,
    uri::{Authority, PathAndQuery, Scheme},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::Error;

/// The longest instance id accepted, in bytes.
pub const MAX_ID_LEN: usize = 253;

/// The stable identity of an instance within its service: the key of its
/// [`Change`](tower::discover::Change)s.
///
/// A non-empty string of at most [`MAX_ID_LEN`] bytes, without `/` (it is the last segment of
/// an etcd key), whitespace or control characters. Cloning it clones an `Arc`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(Arc<str>);

// === impl InstanceId ===

impl InstanceId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<Self, Error> {
        check_segment("instance id", id, MAX_ID_LEN)?;
        Ok(InstanceId(Arc::from(id)))
    }

    /// The id as a string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub(crate) fn check_segment(what: &'static str, value: &str, max: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::invalid(what, value, "it is empty"));
    }
    if value.len() > max {
        return Err(Error::invalid(what, value, "it is too long"));
    }
    if value.contains('/') {
        return Err(Error::invalid(what, value, "it contains `/`"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::invalid(
            what,
            value,
            "it contains whitespace or control characters",
        ));
    }
    Ok(())
}

/// Checks a service name: what [`InstanceId`] accepts, as it is a segment of an etcd key too.
pub(crate) fn check_service(service: &str) -> Result<(), Error> {
    check_segment("service name", service, MAX_ID_LEN)
}

impl FromStr for InstanceId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        InstanceId::new(s)
    }
}

impl Borrow<str> for InstanceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for InstanceId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for InstanceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for InstanceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        InstanceId::new(&s).map_err(de::Error::custom)
    }
}

/// Where an instance listens: a scheme (`http` or `https`) and an authority (`host:port`).
///
/// Parsed from `host:port` (scheme `http`) or `http://host:port` / `https://host:port`; a
/// path, query, fragment or user is rejected.
///
/// **One canonical form** is written everywhere (`Display`, serde, the etcd records that
/// self-registration writes): `host:port` when the scheme is `http`, `https://host:port`
/// when it is `https`. It is what operators type with `etcdctl`, and it reads back as the
/// same address.
///
/// ```
/// use gray_discovery::Address;
///
/// let plain: Address = "http://10.0.0.7:8080".parse()?;
/// assert_eq!(plain.to_string(), "10.0.0.7:8080");
/// assert_eq!(plain, "10.0.0.7:8080".parse()?);
/// let tls: Address = "https://orders.internal:443".parse()?;
/// assert_eq!(tls.to_string(), "https://orders.internal:443");
/// assert_eq!(tls.uri().to_string(), "https://orders.internal:443/");
/// # Ok::<(), gray_discovery::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Address {
    scheme: Scheme,
    authority: Authority,
}

// === impl Address ===

impl Address {
    /// `http://{authority}`.
    pub fn http(authority: Authority) -> Self {
        Address {
            scheme: Scheme::HTTP,
            authority,
        }
    }

    /// The scheme, `http` or `https`.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// `scheme://host:port/`, the URI a client connects to.
    pub fn uri(&self) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(PathAndQuery::from_static("/"))
            .build()
            .unwrap_or_else(|_| unreachable!("a scheme and an authority make a valid URI"))
    }
}

impl Origin for Address {
    fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl FromStr for Address {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::invalid("address", s, reason);
        let (scheme, rest) = match s.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (Scheme::HTTP, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (Scheme::HTTPS, rest),
            Some(_) => return Err(invalid("the scheme must be `http` or `https`")),
            None => (Scheme::HTTP, s),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Err(invalid("it has no host"));
        }
        if rest.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "expected `host:port` or `http(s)://host:port`, without path, query or user",
            ));
        }
        let authority: Authority = rest
            .parse()
            .map_err(|_| invalid("expected `host:port` or `http(s)://host:port`"))?;
        if authority.host().is_empty() {
            return Err(invalid("it has no host"));
        }
        if authority.as_str().len() > authority.host().len() && authority.port_u16().is_none() {
            return Err(invalid("the port must be a number from 0 to 65535"));
        }
        Ok(Address { scheme, authority })
    }
}

impl fmt::Display for Address {
    /// The canonical form: `host:port` for `http`, `https://host:port` for `https`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == Scheme::HTTP {
            f.write_str(self.authority.as_str())
        } else {
            write!(f, "{}://{}", self.scheme, self.authority)
        }
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// One instance of a service, as a registry reports it.
///
/// Two instances are equal when id, address and labels are; a registry emits a
/// [`Change::Insert`](tower::discover::Change::Insert) only when one of them changed.
/// Cloning an instance clones an `Arc`: the registry, every subscriber and every endpoint
/// share one copy.
#[derive(Clone, PartialEq, Eq)]
pub struct Instance(Arc<Parts>);

#[derive(PartialEq, Eq)]
struct Parts {
    id: InstanceId,
    address: Address,
    labels: Labels,
}

// === impl Instance ===

impl Instance {
    /// An instance.
    pub fn new(id: InstanceId, address: Address, labels: Labels) -> Self {
        Instance(Arc::new(Parts {
            id,
            address,
            labels,
        }))
    }

    /// Its id, unique within its service.
    #[must_use]
    pub fn id(&self) -> &InstanceId {
        &self.0.id
    }

    /// Where it listens.
    #[must_use]
    pub fn address(&self) -> &Address {
        &self.0.address
    }

    /// Its labels.
    #[must_use]
    pub fn labels(&self) -> &Labels {
        &self.0.labels
    }

    /// This instance with other labels.
    #[must_use]
    pub fn with_labels(self, labels: Labels) -> Self {
        Instance::new(self.id().clone(), self.address().clone(), labels)
    }

    /// The registry record of this instance: its address and labels.
    #[must_use]
    pub fn record(&self) -> Record {
        Record {
            address: self.address().clone(),
            labels: self.labels().clone(),
        }
    }
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("id", self.id())
            .field("address", self.address())
            .field("labels", self.labels())
            .finish()
    }
}

impl Labelled for Instance {
    fn labels(&self) -> &Labels {
        &self.0.labels
    }

    /// Its address: a balancer probes it before an ejected instance comes back.
    fn origin(&self) -> Option<&dyn Origin> {
        Some(self)
    }
}

impl Origin for Instance {
    fn scheme(&self) -> &Scheme {
        self.0.address.scheme()
    }

    fn authority(&self) -> &Authority {
        self.0.address.authority()
    }
}

/// What a registry stores for an instance: the JSON value of its etcd key,
/// `{"address": "10.0.0.7:8080", "labels": {"gray": "true"}}`.
///
/// `labels` may be left out (no labels). Label values that are JSON/YAML/TOML booleans or
/// numbers are taken as their text (`true`, `2`), so `gray: true` in YAML works as
/// `gray: "true"`. Unknown fields are rejected, so a misspelt `adress` is reported.
///
/// ```
/// use gray_discovery::Record;
///
/// let record: Record =
///     serde_json::from_str(r#"{"address": "10.0.0.7:8080", "labels": {"gray": true}}"#)?;
/// assert_eq!(record.labels.get("gray"), Some("true"));
/// // Written in the canonical form of the address.
/// assert_eq!(
///     serde_json::to_string(&record)?,
///     r#"{"address":"10.0.0.7:8080","labels":{"gray":"true"}}"#
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Record {
    /// Where the instance listens.
    pub address: Address,
    /// Its labels.
    #[serde(default, deserialize_with = "lenient_labels")]
    pub labels: Labels,
}

// === impl Record ===

impl Record {
    /// The record of an instance at `address` with `labels`.
    pub fn new(address: Address, labels: Labels) -> Self {
        Record { address, labels }
    }

    /// The instance `id` with this record.
    pub fn into_instance(self, id: InstanceId) -> Instance {
        Instance::new(id, self.address, self.labels)
    }
}

/// Reads a map of labels whose values may be strings, booleans or numbers.
pub(crate) fn lenient_labels<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Labels, D::Error> {
    struct LabelsVisitor;

    impl<'de> de::Visitor<'de> for LabelsVisitor {
        type Value = Labels;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of label names to strings, booleans or numbers")
        }

        fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
            let mut labels = Labels::new();
            while let Some((key, LabelValue(value))) = map.next_entry::<String, LabelValue>()? {
                labels.insert(key, value);
            }
            Ok(labels)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Labels, E> {
            Ok(Labels::new())
        }
    }

    deserializer.deserialize_map(LabelsVisitor)
}

struct LabelValue(String);

// === impl LabelValue ===

impl<'de> Deserialize<'de> for LabelValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValueVisitor;

        impl de::Visitor<'_> for ValueVisitor {
            type Value = LabelValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, boolean or number")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_owned()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<LabelValue, E> {
                Ok(LabelValue(v))
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<LabelValue, E> {
                Ok(LabelValue(v.to_string()))
            }
        }

        deserializer.deserialize_any(ValueVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let a: Address = "127.0.0.1:80".parse().unwrap();
        assert_eq!(a.to_string(), "127.0.0.1:80");
        let b: Address = "http://127.0.0.1:80/".parse().unwrap();
        assert_eq!(a, b, "both forms read as one address");
        assert_eq!(b.to_string(), "127.0.0.1:80", "and are written in one form");
        let a: Address = "HTTPS://example.test:443/".parse().unwrap();
        assert_eq!(a.scheme(), &Scheme::HTTPS);
        assert_eq!(a.authority().as_str(), "example.test:443");
        assert_eq!(a.to_string(), "https://example.test:443");
        assert_eq!(a.to_string().parse::<Address>().unwrap(), a);
        let a: Address = "[::1]:8080".parse().unwrap();
        assert_eq!(a.authority().host(), "[::1]");
        assert_eq!(a.uri().to_string(), "http://[::1]:8080/");
        for bad in [
            "",
            "http://",
            "ftp://h:1",
            "h:1/path",
            "u@h:1",
            "h:1?q",
            "h:port",
            "a b:1",
        ] {
            let err = bad.parse::<Address>().unwrap_err();
            assert!(
                err.to_string().starts_with("invalid address"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn ids() {
        assert_eq!(InstanceId::new("a-1").unwrap().as_str(), "a-1");
        for bad in ["", "a/b", "a b", "a\n", &"x".repeat(MAX_ID_LEN + 1)] {
            assert!(InstanceId::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn records() {
        let r: Record = serde_json::from_str(r#"{"address":"h:1"}"#).unwrap();
        assert!(r.labels.is_empty());
        let r: Record =
            serde_json::from_str(r#"{"address":"h:1","labels":{"w":2,"f":0.5,"g":false}}"#)
                .unwrap();
        assert_eq!(r.labels.get("w"), Some("2"));
        assert_eq!(r.labels.get("f"), Some("0.5"));
        assert_eq!(r.labels.get("g"), Some("false"));
        let e = serde_json::from_str::<Record>(r#"{"adress":"h:1"}"#).unwrap_err();
        assert!(e.to_string().contains("adress"), "{e}");
        let e =
            serde_json::from_str::<Record>(r#"{"address":"h:1","labels":{"x":[1]}}"#).unwrap_err();
        assert!(e.to_string().contains("a string, boolean or number"), "{e}");
    }
}
