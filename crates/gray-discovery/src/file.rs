//! The instance file (feature `file`): the instances of several services in one TOML, YAML
//! or JSON document, read by a [`Registry`](crate::Registry) from a
//! [`FileSource`](gray_source::file::FileSource) (or from any source whose one entry is
//! such a document, with [`Layout::document`](crate::Layout::document)).
//!
//! # Format
//!
//! A `services` table whose keys are service names and whose values are lists of instances
//! with an `id` (optional: the address when left out), an `address` (`host:port` or
//! `http(s)://host:port`) and `labels` (optional; strings, booleans or numbers):
//!
//! ```toml
//! [[services.orders]]
//! id = "orders-1"
//! address = "10.0.0.7:8080"
//!
//! [[services.orders]]
//! id = "orders-2"
//! address = "10.0.0.8:8080"
//! labels = { gray = "true", version = "2.0" }
//! ```
//!
//! ```yaml
//! services:
//!   orders:
//!     - id: orders-1
//!       address: 10.0.0.7:8080
//!     - id: orders-2
//!       address: 10.0.0.8:8080
//!       labels: { gray: true, version: "2.0" }
//! ```
//!
//! ```json
//! {"services": {"orders": [
//!   {"id": "orders-1", "address": "10.0.0.7:8080"},
//!   {"id": "orders-2", "address": "10.0.0.8:8080", "labels": {"gray": "true", "version": "2.0"}}
//! ]}}
//! ```
//!
//! The format is chosen by the file's extension: `.toml`, `.yaml` / `.yml`, `.json`.
//! Unknown keys are rejected (a misspelt `adress` is an error, not an instance without an
//! address), and so is an id listed twice within a service.
//!
//! # Empty files
//!
//! **A file without a `services` key is rejected**, and so is a file of 0 bytes: a file
//! caught half-written (truncated by an editor, a config tool that writes in place) must
//! never empty a service. The message says what to write instead:
//!
//! ```text
//! instances.toml: empty: an instance file must have a `services` table; write `services = {}` to remove every instance
//! ```
//!
//! An explicit empty table, `services = {}` (YAML `services: {}`, JSON `{"services": {}}`),
//! means *no instances*, and a service listed with an empty list (`orders = []`) has none.
//!
//! # Edits
//!
//! A [`Registry`](crate::Registry) reads the file at start (an error there stops the start:
//! [`Registry::start`](crate::Registry::start) returns it), then polls it (every 250 ms by
//! default, [`FileSource::with_interval`](gray_source::file::FileSource::with_interval)).
//! Each new version is diffed against the instances known: only the instances that were
//! added, changed or removed become `Insert`s and `Remove`s. A version that does not
//! parse, names an invalid address or id, or is empty is **rejected as a whole**: the last
//! good instances stay, and an error event (`tracing`, level ERROR, target
//! `gray::discovery`) names the file, the line, the column and the field, for example
//!
//! ```text
//! instances.yaml:7:14: field `services.orders[1].address`: invalid address `x:y`: ...
//! ```
//!
//! A file that disappears for a while (an editor's rename, a config-map update) changes
//! nothing either. Write files atomically (a temporary file renamed over the old one).
//!
//! ```
//! use gray_discovery::{Registry, source::file::FileSource};
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let path = std::env::temp_dir().join(format!("gray-doc-{}.json", std::process::id()));
//! std::fs::write(&path, r#"{"services": {"orders": [
//!     {"id": "orders-1", "address": "127.0.0.1:8081", "labels": {"gray": "true"}}
//! ]}}"#).unwrap();
//!
//! let registry = Registry::start(FileSource::new(&path).with_interval(Duration::from_millis(10))).await?;
//! let orders = registry.service("orders")?;
//! assert_eq!(orders.instances()[0].labels().get("gray"), Some("true"));
//!
//! // Half-written: rejected (an ERROR names the file and why), the instance stays.
//! std::fs::write(&path, "").unwrap();
//!
//! // Every instance removed, on purpose: applied.
//! std::fs::write(&path, r#"{"services": {}}"#).unwrap();
//! let deadline = std::time::Instant::now() + Duration::from_secs(10);
//! while !orders.instances().is_empty() {
//!     assert!(std::time::Instant::now() < deadline);
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! # std::fs::remove_file(&path).unwrap();
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
};

use gray_config::{ConfigError, Document};
use gray_core::Labels;
use serde::{Deserialize, Deserializer, de};

use crate::{Address, Instance, InstanceId, instance::check_service};

/// The format of an instance file (the one enum all gray crates share).
pub use gray_config::Format;

/// The 0.1 name of what follows an instance file: a [`Registry`](crate::Registry) started on
/// a [`FileSource`](gray_source::file::FileSource). `WatchedFile::open(path)` is
/// `Registry::start(FileSource::new(path))`, `open_with(path, format, interval)` is
/// `Registry::start_with(FileSource::new(path).with_interval(interval),
/// Layout::document(format))`; `services()` is the same, `instances(service)` is
/// `service(service)?.instances()` and `service(service)` is `service(service)?.discover()`.
#[deprecated(
    since = "0.3.0",
    note = "renamed `Registry` (started with `Registry::start(FileSource::new(path))`); removed in 0.4.0"
)]
pub type WatchedFile = crate::Registry;

/// The 0.1 name of the discover stream of one service of an instance file:
/// [`InstanceDiscover`](crate::InstanceDiscover), from `registry.service(name)?.discover()`.
#[deprecated(
    since = "0.3.0",
    note = "renamed `InstanceDiscover` (`registry.service(name)?.discover()`); removed in 0.4.0"
)]
pub type FileDiscover = crate::InstanceDiscover;

/// The parsed content of an instance file: instances by service.
pub(crate) type Catalogue = BTreeMap<String, Vec<Instance>>;

/// What an empty file is told, by format.
fn empty_message(format: Format) -> String {
    let example = match format {
        Format::Toml => "services = {}",
        Format::Yaml => "services: {}",
        Format::Json => r#"{"services": {}}"#,
        _ => "an empty `services` table",
    };
    format!(
        "empty: an instance file must have a `services` table; write `{example}` to remove every instance"
    )
}

/// The instance file: `services` → lists of instances.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceFile {
    // Not defaulted: a document without it is rejected as empty.
    services: Option<BTreeMap<ServiceName, InstanceList>>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct ServiceName(String);

impl<'de> Deserialize<'de> for ServiceName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        check_service(&name).map_err(de::Error::custom)?;
        Ok(ServiceName(name))
    }
}

struct InstanceList(Vec<Instance>);

impl<'de> Deserialize<'de> for InstanceList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor;

        impl<'de> de::Visitor<'de> for ListVisitor {
            type Value = InstanceList;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of instances")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<InstanceList, A::Error> {
                let mut ids = HashMap::new();
                let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(entry) = seq.next_element::<FileInstance>()? {
                    let id = match entry.id {
                        Some(id) => id,
                        None => InstanceId::new(entry.address.authority().as_str())
                            .map_err(de::Error::custom)?,
                    };
                    if let Some(first) = ids.insert(id.clone(), list.len()) {
                        return Err(de::Error::custom(format_args!(
                            "instance id `{id}` is listed twice, at [{first}] and [{}]",
                            list.len()
                        )));
                    }
                    list.push(Instance::new(id, entry.address, entry.labels));
                }
                Ok(InstanceList(list))
            }
        }

        deserializer.deserialize_seq(ListVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileInstance {
    #[serde(default)]
    id: Option<InstanceId>,
    address: Address,
    #[serde(default, deserialize_with = "crate::instance::lenient_labels")]
    labels: Labels,
}

/// Parses an instance file through gray-config's loader (`source` names it in errors:
/// a file path, an etcd key).
pub(crate) fn parse(
    source: &str,
    format: Format,
    content: &[u8],
) -> Result<Catalogue, ConfigError> {
    let empty = || ConfigError::new(source, empty_message(format));
    if content.iter().all(u8::is_ascii_whitespace) {
        return Err(empty());
    }
    let document = Document::from_slice(content, format, source)?;
    // A YAML file of comments only is an empty document.
    if format == Format::Yaml && is_blank_yaml(document.text()) {
        return Err(empty());
    }
    let file: InstanceFile = document.parse()?;
    let services = file.services.ok_or_else(empty)?;
    Ok(services
        .into_iter()
        .map(|(name, list)| (name.0, list.0))
        .collect())
}

/// Whether a YAML text holds nothing but comments, blank lines and document markers.
fn is_blank_yaml(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .all(|line| line.is_empty() || line.starts_with('#') || line == "---" || line == "...")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(format: Format, text: &str) -> Result<Catalogue, ConfigError> {
        parse("instances", format, text.as_bytes())
    }

    #[test]
    fn the_three_formats_agree() {
        let toml = r#"
[[services.orders]]
id = "orders-1"
address = "10.0.0.7:8080"

[[services.orders]]
address = "10.0.0.8:8080"
labels = { gray = true, version = "2.0" }
"#;
        let yaml = r#"
services:
  orders:
    - id: orders-1
      address: 10.0.0.7:8080
    - address: 10.0.0.8:8080
      labels: { gray: true, version: "2.0" }
"#;
        let json = r#"{"services": {"orders": [
  {"id": "orders-1", "address": "10.0.0.7:8080"},
  {"address": "10.0.0.8:8080", "labels": {"gray": "true", "version": "2.0"}}
]}}"#;
        for (format, text) in [
            (Format::Toml, toml),
            (Format::Yaml, yaml),
            (Format::Json, json),
        ] {
            let catalogue = parse_str(format, text).unwrap();
            let orders = &catalogue["orders"];
            assert_eq!(orders.len(), 2, "{format:?}");
            assert_eq!(orders[0].id().as_str(), "orders-1");
            assert_eq!(orders[1].id().as_str(), "10.0.0.8:8080", "{format:?}");
            assert_eq!(orders[1].labels().get("gray"), Some("true"), "{format:?}");
            assert_eq!(orders[1].labels().get("version"), Some("2.0"), "{format:?}");
        }
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            (
                Format::Toml,
                "[[services.orders]]\nid = \"a\"\naddress = \"x:y\"\n",
                3,
                "services.orders[0].address",
                "invalid address `x:y`",
            ),
            (
                Format::Yaml,
                "services:\n  orders:\n    - id: a\n      address: 10.0.0.1:1\n    - id: b\n      adress: 10.0.0.1:2\n",
                6,
                "services.orders[1].adress",
                "unknown field `adress`",
            ),
            (
                Format::Json,
                "{\"services\": {\"orders\": [\n {\"id\": \"a\", \"address\": \"10.0.0.1:1\"},\n {\"id\": \"b\", \"address\": \"10.0.0.1:1\", \"labels\": {\"gray\": [true]}}\n]}}",
                3,
                "services.orders[1].labels.gray",
                "a string, boolean or number",
            ),
            (
                Format::Json,
                "{\"services\": {\"orders\": [\n {\"id\": \"a\", \"address\": \"10.0.0.1:1\"},\n {\"id\": \"a\", \"address\": \"10.0.0.1:2\"}\n]}}",
                4,
                "services.orders",
                "instance id `a` is listed twice, at [0] and [1]",
            ),
            (
                Format::Yaml,
                "services:\n  bad/name:\n    - address: 10.0.0.1:1\n",
                2,
                "services.bad/name",
                "invalid service name `bad/name`",
            ),
        ];
        for (format, text, line, field, message) in cases {
            let err = parse_str(format, text).unwrap_err();
            assert_eq!(err.line(), Some(line), "{format:?}: {err}");
            assert_eq!(err.field(), Some(field), "{format:?}: {err}");
            assert!(err.message().contains(message), "{format:?}: {err}");
            assert!(
                err.to_string().starts_with(&format!("instances:{line}:")),
                "{err}"
            );
        }
    }

    #[test]
    fn an_empty_file_is_rejected_and_an_empty_table_is_no_instances() {
        for (format, text, example) in [
            (Format::Toml, "", "services = {}"),
            (Format::Toml, "  \n# nothing yet\n", "services = {}"),
            (Format::Yaml, "\n", "services: {}"),
            (Format::Yaml, "# nothing\n---\n", "services: {}"),
            (Format::Yaml, "{}", "services: {}"),
            (Format::Json, "", r#"{"services": {}}"#),
            (Format::Json, "{}", r#"{"services": {}}"#),
        ] {
            let err = parse_str(format, text).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "instances: empty: an instance file must have a `services` table; write `{example}` to remove every instance"
                ),
                "{format:?} {text:?}"
            );
        }
        for (format, text) in [
            (Format::Toml, "services = {}"),
            (Format::Yaml, "services: {}"),
            (Format::Json, r#"{"services": {}}"#),
        ] {
            assert!(parse_str(format, text).unwrap().is_empty(), "{format:?}");
        }
        let one_empty = parse_str(Format::Toml, "[services]\norders = []\n").unwrap();
        assert_eq!(one_empty["orders"].len(), 0);
    }

    #[test]
    fn syntax_errors_have_a_line() {
        for (format, text) in [
            (Format::Toml, "[[services.orders]]\naddress = \n"),
            (Format::Yaml, "services:\n  orders: [\n"),
            (Format::Json, "{\"services\": {\n\"orders\": [}"),
        ] {
            let err = parse_str(format, text).unwrap_err();
            assert!(err.line().is_some(), "{format:?}: {err}");
        }
    }
}
