//! [`WatchedFile`]: instances listed in a TOML, YAML or JSON file that is watched for edits.
//!
//! One file lists the instances of several services; [`WatchedFile::service`] gives the
//! discover stream of one of them. The file is polled (modification time, size and, for a
//! recently modified file, content) every 250 ms by default, so an edit reaches the streams
//! as the difference of `Remove`s and `Insert`s within a second. An instance whose address
//! or labels changed is one `Insert` with its id, which replaces it.
//!
//! An edit that does not parse, or names an invalid address or id, is rejected as a whole:
//! the streams keep serving the last good content, and an error event (`tracing`, level
//! ERROR) names the file, the line, the column and the field, for example
//!
//! ```text
//! instances.yaml:7:14: field `services.orders[1].address`: invalid address `x:y`: ...
//! ```
//!
//! A file that disappears for a while (an editor's rename, a config-map update) is handled
//! the same way. The first read, in [`WatchedFile::open`], returns these errors instead.
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
//! # Example
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_discovery::WatchedFile;
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let path = std::env::temp_dir().join(format!("gray-doc-{}.json", std::process::id()));
//! std::fs::write(&path, r#"{"services": {"orders": [
//!     {"id": "orders-1", "address": "127.0.0.1:8081", "labels": {"gray": "true"}}
//! ]}}"#).unwrap();
//!
//! let file = WatchedFile::open(&path).await?;
//! let mut orders = file.service("orders")?;
//! match orders.next().await.unwrap()? {
//!     Change::Insert(id, instance) => {
//!         assert_eq!(id.as_str(), "orders-1");
//!         assert_eq!(instance.labels().get("gray"), Some("true"));
//!     }
//!     Change::Remove(_) => unreachable!(),
//! }
//! # std::fs::remove_file(&path).unwrap();
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    fmt,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use futures_core::Stream;
use futures_util::stream::{self, BoxStream, StreamExt};
use gray_core::Labels;
use serde::{Deserialize, Deserializer, de};
use tokio::sync::watch;
use tower::discover::Change;

use crate::{
    Address, Error, Instance, InstanceId, InstanceSet, ParseError, instance::check_service,
};

/// How often the file is checked by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);

/// A file modified less than this long ago is compared by content as well, as its
/// modification time may not change on a second edit on file systems with coarse times.
const RACY_WINDOW: Duration = Duration::from_secs(3);

/// The format of an instance file (the one enum all gray crates share).
pub use gray_core::format::Format;

/// The parsed content of an instance file: instances by service.
#[derive(Debug, Default)]
struct Catalogue {
    services: BTreeMap<String, Vec<Instance>>,
}

/// A watched instance file; see the [module docs](self).
///
/// Cloning it is cheap; the file is polled by one task for all clones and all service
/// streams, and the task stops when the last of them is dropped.
#[derive(Clone)]
pub struct WatchedFile {
    path: Arc<Path>,
    catalogue: watch::Receiver<Arc<Catalogue>>,
}

impl fmt::Debug for WatchedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedFile")
            .field("path", &self.path)
            .field("services", &self.catalogue.borrow().services.len())
            .finish()
    }
}

impl WatchedFile {
    /// Reads `path`, in the format its extension names, and watches it every
    /// [`DEFAULT_INTERVAL`]. Must be called within a tokio runtime with timers enabled.
    pub async fn open(path: impl AsRef<Path>) -> Result<WatchedFile, Error> {
        let path = path.as_ref();
        let format = Format::from_path(path).ok_or_else(|| {
            Error::Parse(ParseError {
                path: path.to_owned(),
                line: None,
                column: None,
                field: None,
                message: "unknown format: the file name must end in .toml, .yaml, .yml or .json"
                    .to_owned(),
            })
        })?;
        WatchedFile::open_with(path, format, DEFAULT_INTERVAL).await
    }

    /// Reads `path` in `format` and watches it every `interval`.
    pub async fn open_with(
        path: impl AsRef<Path>,
        format: Format,
        interval: Duration,
    ) -> Result<WatchedFile, Error> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        let read_error = |source| Error::Read {
            path: path.to_path_buf(),
            source,
        };
        let meta = tokio::fs::metadata(&path).await.map_err(read_error)?;
        let content = tokio::fs::read(&path).await.map_err(read_error)?;
        let catalogue = parse(&path, format, &content)?;
        let (tx, rx) = watch::channel(Arc::new(catalogue));
        let poller = Poller {
            path: path.clone(),
            format,
            stamp: Some(Stamp::of(&meta)),
            content,
            rejected: None,
            unreadable: false,
        };
        tokio::spawn(poller.run(tx, interval.max(Duration::from_millis(1))));
        Ok(WatchedFile {
            path,
            catalogue: rx,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of the services the file lists now.
    pub fn services(&self) -> Vec<String> {
        self.catalogue.borrow().services.keys().cloned().collect()
    }

    /// The instances of `service` the file lists now.
    pub fn instances(&self, service: &str) -> Vec<Instance> {
        self.catalogue
            .borrow()
            .services
            .get(service)
            .cloned()
            .unwrap_or_default()
    }

    /// The discover stream of `service`: first an `Insert` for each of its instances now in
    /// the file (none when the file does not list the service yet), then the changes of
    /// every accepted edit. It never yields an error: rejected edits are logged.
    pub fn service(&self, service: &str) -> Result<FileDiscover, Error> {
        check_service(service)?;
        let mut catalogue = self.catalogue.clone();
        catalogue.mark_changed();
        let state = FileState {
            catalogue,
            service: service.to_owned(),
            set: InstanceSet::new(),
            queue: VecDeque::new(),
        };
        Ok(FileDiscover {
            service: service.to_owned(),
            path: self.path.clone(),
            inner: stream::unfold(state, FileState::next).boxed(),
        })
    }
}

/// The discover stream of one service of a [`WatchedFile`].
pub struct FileDiscover {
    service: String,
    path: Arc<Path>,
    inner: BoxStream<'static, Result<Change<InstanceId, Instance>, Error>>,
}

impl fmt::Debug for FileDiscover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileDiscover")
            .field("path", &self.path)
            .field("service", &self.service)
            .finish()
    }
}

impl Stream for FileDiscover {
    type Item = Result<Change<InstanceId, Instance>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

struct FileState {
    catalogue: watch::Receiver<Arc<Catalogue>>,
    service: String,
    set: InstanceSet,
    queue: VecDeque<Change<InstanceId, Instance>>,
}

type Step = Option<(Result<Change<InstanceId, Instance>, Error>, FileState)>;

impl FileState {
    async fn next(mut self) -> Step {
        loop {
            if let Some(change) = self.queue.pop_front() {
                return Some((Ok(change), self));
            }
            // The poller only stops once every receiver is gone, or when the runtime does.
            self.catalogue.changed().await.ok()?;
            let catalogue = self.catalogue.borrow_and_update().clone();
            let instances = catalogue
                .services
                .get(&self.service)
                .map(|list| list.iter().cloned())
                .into_iter()
                .flatten();
            self.queue.extend(self.set.replace(instances));
        }
    }
}

/// What identifies a version of the file cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            modified: meta.modified().ok(),
            len: meta.len(),
        }
    }

    /// Whether the file was modified so recently that an edit may not show in the stamp.
    fn is_recent(&self) -> bool {
        match self.modified {
            Some(modified) => SystemTime::now()
                .duration_since(modified)
                .map_or(true, |age| age < RACY_WINDOW),
            None => true,
        }
    }
}

struct Poller {
    path: Arc<Path>,
    format: Format,
    stamp: Option<Stamp>,
    /// The content last accepted.
    content: Vec<u8>,
    /// The content last rejected, so that one bad edit is reported once.
    rejected: Option<Vec<u8>>,
    /// Whether the last attempt could not read the file, so that it is reported once.
    unreadable: bool,
}

impl Poller {
    async fn run(mut self, tx: watch::Sender<Arc<Catalogue>>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = tx.closed() => return,
                _ = ticker.tick() => {}
            }
            if let Some(catalogue) = self.check().await {
                tx.send_replace(Arc::new(catalogue));
            }
        }
    }

    /// Returns the new catalogue when the file changed and its new content is good.
    async fn check(&mut self) -> Option<Catalogue> {
        let read = async {
            let meta = tokio::fs::metadata(&self.path).await?;
            let stamp = Stamp::of(&meta);
            if self.stamp == Some(stamp) && !stamp.is_recent() {
                return Ok(None);
            }
            let content = tokio::fs::read(&self.path).await?;
            Ok::<_, std::io::Error>(Some((stamp, content)))
        };
        let (stamp, content) = match read.await {
            Ok(Some(read)) => read,
            Ok(None) => return None,
            Err(error) => {
                if !self.unreadable {
                    self.unreadable = true;
                    tracing::error!(
                        file = %self.path.display(),
                        %error,
                        "cannot read instance file; keeping the last good instances"
                    );
                }
                return None;
            }
        };
        if self.unreadable {
            self.unreadable = false;
            tracing::info!(file = %self.path.display(), "instance file readable again");
        }
        self.stamp = Some(stamp);
        if content == self.content || self.rejected.as_ref() == Some(&content) {
            return None;
        }
        match parse(&self.path, self.format, &content) {
            Ok(catalogue) => {
                tracing::info!(file = %self.path.display(), "instance file reloaded");
                self.content = content;
                self.rejected = None;
                Some(catalogue)
            }
            Err(error) => {
                tracing::error!(
                    file = %error.path.display(),
                    line = error.line,
                    column = error.column,
                    field = error.field.as_deref(),
                    %error,
                    "instance file rejected; keeping the last good instances"
                );
                self.rejected = Some(content);
                None
            }
        }
    }
}

/// The document: `services` → lists of instances.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(default)]
    services: BTreeMap<ServiceName, InstanceList>,
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

fn parse(path: &Path, format: Format, content: &[u8]) -> Result<Catalogue, ParseError> {
    let error = |line, column, field: Option<String>, message: String| ParseError {
        path: path.to_path_buf(),
        line,
        column,
        field: field.filter(|f| !f.is_empty() && f != "."),
        message,
    };
    let text = std::str::from_utf8(content).map_err(|e| {
        let (line, column) = line_column(content, e.valid_up_to());
        error(Some(line), Some(column), None, format!("not UTF-8: {e}"))
    })?;
    let document: Document = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let json_error = |inner: &serde_json::Error, field: Option<String>| {
                let (line, column) = (inner.line(), inner.column());
                error(
                    (line > 0).then_some(line),
                    (column > 0).then_some(column),
                    field,
                    strip_position(&inner.to_string()),
                )
            };
            let document = serde_path_to_error::deserialize(&mut de)
                .map_err(|e| json_error(e.inner(), Some(e.path().to_string())))?;
            de.end().map_err(|e| json_error(&e, None))?;
            document
        }
        Format::Yaml => {
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let location = e.inner().location();
                let message = strip_position(&e.inner().to_string());
                // serde_norway prefixes its own path; ours is in `field`.
                let message = match message.split_once(": ") {
                    Some((prefix, rest)) if !prefix.contains(' ') => rest.to_owned(),
                    _ => message,
                };
                error(
                    location.as_ref().map(|l| l.line()),
                    location.as_ref().map(|l| l.column()),
                    Some(e.path().to_string()),
                    message,
                )
            })?
        }
        Format::Toml => {
            let de = toml::Deserializer::parse(text).map_err(|e| {
                let (line, column) = e.span().map(|s| line_column(content, s.start)).unzip();
                error(line, column, None, e.message().to_owned())
            })?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let (line, column) = e
                    .inner()
                    .span()
                    .map(|s| line_column(content, s.start))
                    .unzip();
                error(
                    line,
                    column,
                    Some(e.path().to_string()),
                    e.inner().message().to_owned(),
                )
            })?
        }
        // `Format` is non-exhaustive: a format added to gray-core is not read here yet.
        other => {
            return Err(error(
                None,
                None,
                None,
                format!("{other} instance files are not supported"),
            ));
        }
    };
    Ok(Catalogue {
        services: document
            .services
            .into_iter()
            .map(|(name, list)| (name.0, list.0))
            .collect(),
    })
}

/// The 1-based line and column (in characters) of byte `offset`.
fn line_column(content: &[u8], offset: usize) -> (usize, usize) {
    let before = &content[..offset.min(content.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Drops the ` at line L column C` that serde_json and serde_norway append: the position is
/// reported on its own.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) if message[i..].contains(" column ") => message[..i].to_owned(),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(format: Format, text: &str) -> Result<Catalogue, ParseError> {
        parse(Path::new("instances"), format, text.as_bytes())
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
            let orders = &catalogue.services["orders"];
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

    #[test]
    fn positions() {
        assert_eq!(line_column(b"ab\ncd", 4), (2, 2));
        assert_eq!(line_column(b"ab", 0), (1, 1));
        assert_eq!(line_column(b"ab", 99), (1, 3));
        assert_eq!(strip_position("bad at line 3 column 4"), "bad");
        assert_eq!(strip_position("bad"), "bad");
    }
}
