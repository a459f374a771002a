//! How the sources of gray-source hold instances: [`Layout`], the built-in [`Decoder`]s.

use std::{collections::BTreeMap, fmt};

use gray_source::{Entry, Snapshot, Source, Update};

use super::decoder::{Decoder, Effect};
use crate::{Error, Instance, InstanceId, Record, instance::check_segment};
#[cfg(feature = "file")]
use crate::{error::ConfigError, file::Format};

/// How a source's entries hold instances: one document with every service, or one key per
/// instance; the [`Decoder`] of the instance files and records this crate defines.
/// [`InstanceSource::layout`] knows it for the sources of gray-source;
/// [`Registry::start_with`](crate::Registry::start_with) takes it (or any other decoder)
/// for any other source.
///
/// ```
/// use gray_discovery::Layout;
///
/// assert_eq!(Layout::keys("/gray").prefix(), Some("/gray/"));
/// # #[cfg(feature = "file")]
/// assert_eq!(Layout::document(gray_config::Format::Yaml).prefix(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout(Kind);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// The source's one entry is a whole instance file ([`crate::file`]).
    #[cfg(feature = "file")]
    Document(Format),
    /// One key per instance: `<prefix><service>/<instance-id>`, a JSON [`Record`].
    Keys { prefix: String },
}

impl Layout {
    /// The source's one entry (a file, one etcd key) is a whole instance file in `format`
    /// (feature `file`; see [`crate::file`]).
    #[cfg(feature = "file")]
    #[must_use]
    pub fn document(format: Format) -> Self {
        Layout(Kind::Document(format))
    }

    /// One key per instance, `<prefix>/<service>/<instance-id>`, whose value is the JSON
    /// [`Record`] `{"address": "host:port", "labels": {..}}`; keys outside the prefix, or
    /// nested deeper, are ignored. A trailing `/` of `prefix` is implied.
    pub fn keys(prefix: impl Into<String>) -> Self {
        let mut prefix = prefix.into();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Layout(Kind::Keys { prefix })
    }

    /// The key prefix of a [`Layout::keys`], with its trailing `/`.
    #[must_use]
    pub fn prefix(&self) -> Option<&str> {
        match &self.0 {
            Kind::Keys { prefix } => Some(prefix),
            #[cfg(feature = "file")]
            Kind::Document(_) => None,
        }
    }
}

/// A [`Source`] whose [`Layout`] is known, so that [`Registry::start`](crate::Registry::start)
/// needs nothing else: a [`FileSource`](gray_source::file::FileSource) holds an instance
/// file (format by extension), an [`EtcdSource`](gray_source::etcd::EtcdSource) prefix holds
/// one key per instance (and an etcd single key, a JSON instance document).
pub trait InstanceSource: Source {
    /// How this source holds instances; an error when it cannot tell (a file name without a
    /// known extension).
    fn layout(&self) -> Result<Layout, Error>;
}

#[cfg(feature = "file")]
impl InstanceSource for gray_source::file::FileSource {
    fn layout(&self) -> Result<Layout, Error> {
        let path = self.path();
        Format::from_path(path)
            .map(Layout::document)
            .ok_or_else(|| {
                Error::Parse(ConfigError::new(
                    &path.display().to_string(),
                    "unknown format: the file name must end in .toml, .yaml, .yml or .json",
                ))
            })
    }
}

#[cfg(feature = "etcd")]
impl InstanceSource for gray_source::etcd::EtcdSource {
    fn layout(&self) -> Result<Layout, Error> {
        if self.is_prefix() {
            return Ok(Layout::keys(self.key_or_prefix()));
        }
        #[cfg(feature = "file")]
        return Ok(Layout::document(Format::Json));
        #[cfg(not(feature = "file"))]
        Err(Error::invalid(
            "etcd source",
            self.key_or_prefix(),
            "one key holding an instance document needs the feature `file`; watch a prefix",
        ))
    }
}

impl<S: InstanceSource + ?Sized> InstanceSource for std::sync::Arc<S> {
    fn layout(&self) -> Result<Layout, Error> {
        (**self).layout()
    }
}

impl Decoder for Layout {
    /// What the first content of a source holds; `Err` for a document that is rejected
    /// (the registry does not start). Malformed keys of a key layout are skipped.
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        match &self.0 {
            #[cfg(feature = "file")]
            Kind::Document(format) => Ok(Effect::Reset(document(*format, &snapshot)?)),
            Kind::Keys { .. } => Ok(self.apply(Update::Reset(snapshot))),
        }
    }

    /// What an update does; a rejected document is logged (ERROR) and changes nothing.
    fn apply(&self, update: Update) -> Effect {
        match &self.0 {
            #[cfg(feature = "file")]
            Kind::Document(format) => {
                let snapshot = match update {
                    Update::Reset(snapshot) => snapshot,
                    Update::Put(entry) => Snapshot {
                        revision: entry.revision.clone(),
                        entries: vec![entry],
                    },
                    // An instance document deleted: as empty as a file of 0 bytes (rejected).
                    Update::Delete { revision, .. } => Snapshot {
                        entries: Vec::new(),
                        revision,
                    },
                    other => return ignored(other),
                };
                match document(*format, &snapshot) {
                    Ok(services) => {
                        tracing::debug!(target: "gray::discovery", revision = %snapshot.revision,
                            "instance file read");
                        Effect::Reset(services)
                    }
                    Err(Error::Parse(error)) => {
                        tracing::error!(
                            target: "gray::discovery",
                            file = error.source_name(),
                            line = error.line(),
                            column = error.column(),
                            field = error.field(),
                            %error,
                            "instance file rejected; keeping the last good instances"
                        );
                        Effect::None
                    }
                    Err(error) => {
                        tracing::error!(target: "gray::discovery", %error,
                            "instance file rejected; keeping the last good instances");
                        Effect::None
                    }
                }
            }
            Kind::Keys { prefix } => match update {
                Update::Reset(snapshot) => {
                    let mut services: BTreeMap<&str, Vec<Instance>> = BTreeMap::new();
                    for entry in &snapshot.entries {
                        if let Some((service, Ok(instance))) = decode(prefix, entry) {
                            services.entry(service).or_default().push(instance);
                        }
                    }
                    Effect::Reset(
                        services
                            .into_iter()
                            .map(|(name, list)| (name.to_owned(), list))
                            .collect(),
                    )
                }
                Update::Put(entry) => match decode(prefix, &entry) {
                    Some((service, Ok(instance))) => Effect::Put(service.to_owned(), instance),
                    // A malformed value over a valid instance removes it, as a fresh listing
                    // would not include it either.
                    Some((service, Err(id))) => Effect::Remove(service.to_owned(), id),
                    None => Effect::None,
                },
                Update::Delete { key, .. } => match split(prefix, &key) {
                    Some((service, id)) => Effect::Remove(service.to_owned(), id),
                    None => Effect::None,
                },
                other => ignored(other),
            },
        }
    }
}

/// An update of a kind this crate does not know yet ([`Update`] is non-exhaustive): changes
/// nothing, with a debug event.
fn ignored(update: Update) -> Effect {
    tracing::debug!(target: "gray::discovery", ?update, "update of an unknown kind ignored");
    Effect::None
}

/// The instances of the document in `snapshot`'s one entry.
#[cfg(feature = "file")]
fn document(format: Format, snapshot: &Snapshot) -> Result<BTreeMap<String, Vec<Instance>>, Error> {
    match snapshot.entries.as_slice() {
        [entry] => Ok(crate::file::parse(&entry.key, format, &entry.value)?),
        // An absent document (an etcd key deleted) is as empty as a file of 0 bytes.
        [] => Err(Error::Parse(ConfigError::new(
            "(no document)",
            "empty: the source holds no instance document",
        ))),
        [first, ..] => Err(Error::invalid(
            "instance document",
            &first.key,
            "the source holds more than one entry; use a key layout",
        )),
    }
}

/// The service and id a key names: `<prefix><service>/<id>`; `None` (logged at debug) for
/// keys that name no instance.
fn split<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, InstanceId)> {
    let rest = key.strip_prefix(prefix)?;
    let parsed = rest.split_once('/').and_then(|(service, id)| {
        let valid = check_segment("service name", service, crate::instance::MAX_ID_LEN).is_ok();
        Some((service, InstanceId::new(id).ok().filter(|_| valid)?))
    });
    if parsed.is_none() {
        tracing::debug!(target: "gray::discovery", key,
            "key ignored: not <prefix>/<service>/<instance-id>");
    }
    parsed
}

/// The instance an entry holds: `None` for keys that name no instance, `Err(id)` (logged
/// at WARN) for an instance key whose value is not a valid record.
fn decode<'k>(prefix: &str, entry: &'k Entry) -> Option<(&'k str, Result<Instance, InstanceId>)> {
    let (service, id) = split(prefix, &entry.key)?;
    match serde_json::from_slice::<Record>(&entry.value) {
        Ok(record) => Some((service, Ok(record.into_instance(id)))),
        Err(error) => {
            tracing::warn!(
                target: "gray::discovery",
                key = %entry.key,
                revision = %entry.revision,
                %error,
                "value skipped: expected {{\"address\": \"host:port\", \"labels\": {{..}}}}"
            );
            Some((service, Err(id)))
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            #[cfg(feature = "file")]
            Kind::Document(format) => write!(f, "instance document ({format:?})"),
            Kind::Keys { prefix } => write!(f, "one key per instance under {prefix}"),
        }
    }
}
