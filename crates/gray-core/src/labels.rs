//! Instance labels, as a registry reports them (`gray=true`, `lane=canary`, `version=2.0`).
//!
//! Labels are plain strings; what they mean for routing is decided by the matching policy.
//!
//! ```
//! use gray_core::Labels;
//!
//! let labels = Labels::from_iter([("gray", "true"), ("version", "2.0")]);
//! assert_eq!(labels.get("gray"), Some("true"));
//! assert_eq!(labels.get("zone"), None);
//! let json = serde_json::to_string(&labels).unwrap();
//! assert_eq!(json, r#"{"gray":"true","version":"2.0"}"#);
//! ```

use std::collections::BTreeMap;

/// The string labels of one instance, sorted by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    /// No labels.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of label `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Sets label `key`, returning the previous value.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        self.0.insert(key.into(), value.into())
    }

    /// Removes label `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.0.remove(key)
    }

    /// All labels, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The number of labels.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there are no labels.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Labels(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Labels(map)
    }
}

/// Anything that knows its instance labels: a registry instance, or an endpoint service
/// built from one. The balancer reads labels through this trait.
pub trait Labelled {
    /// The labels of this instance.
    fn labels(&self) -> &Labels;

    /// Where the instance listens, when this value knows it: a balancer's re-admission
    /// probe connects there (gray-balance's `health::Probe`). `None` by default; the
    /// instances and endpoints of gray-discovery return themselves.
    ///
    /// ```
    /// use gray_core::{Labelled, Labels, Origin};
    /// use http::uri::{Authority, Scheme};
    ///
    /// struct Instance(Labels, Authority);
    ///
    /// impl Labelled for Instance {
    ///     fn labels(&self) -> &Labels { &self.0 }
    ///     fn origin(&self) -> Option<&dyn Origin> { Some(self) }
    /// }
    ///
    /// impl Origin for Instance {
    ///     fn scheme(&self) -> &Scheme { &Scheme::HTTP }
    ///     fn authority(&self) -> &Authority { &self.1 }
    /// }
    ///
    /// let i = Instance(Labels::new(), Authority::from_static("10.0.0.7:8080"));
    /// assert_eq!(i.origin().map(|o| o.authority().as_str()), Some("10.0.0.7:8080"));
    /// assert!(Labels::new().origin().is_none());
    /// ```
    fn origin(&self) -> Option<&dyn Origin> {
        None
    }
}

impl Labelled for Labels {
    fn labels(&self) -> &Labels {
        self
    }
}

/// Anything that knows where its instance listens: a registry instance, or an endpoint
/// service built from one.
///
/// Clients that keep their own connection pool (reqwest) route by rewriting a request's
/// URL: a balancer picks an instance by its [`Labels`], and the URL's scheme and authority
/// become the instance's.
///
/// ```
/// use gray_core::Origin;
/// use http::uri::{Authority, Scheme};
///
/// struct Instance(Authority);
///
/// impl Origin for Instance {
///     fn scheme(&self) -> &Scheme { &Scheme::HTTP }
///     fn authority(&self) -> &Authority { &self.0 }
/// }
///
/// let i = Instance(Authority::from_static("10.0.0.7:8080"));
/// assert_eq!(i.authority().port_u16(), Some(8080));
/// ```
pub trait Origin {
    /// `http` or `https`.
    fn scheme(&self) -> &http::uri::Scheme;
    /// `host:port`.
    fn authority(&self) -> &http::uri::Authority;
}
