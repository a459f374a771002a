//! Configuration documents: one loader, in TOML, YAML or JSON, whose errors say where.
//!
//! Every gray crate reads its configuration through this crate: staining rules
//! (gray-rules' `RuleSet::parse`), routing policies (gray-policy's `PolicyConfig`),
//! instance files (gray-discovery), a gateway's own file. [`from_str`] deserializes any serde type, and when the text is rejected the
//! [`ConfigError`] names the source (a file path, an etcd key), the 1-based line and
//! column, and the dotted path of the field:
//!
//! ```text
//! gateway.toml:12:1: field `services.orders.falback`: unknown field `falback`, expected one of `pick`, `name`, `preset`, …
//! ```
//!
//! | format | cargo feature of gray-config | position reported |
//! |---|---|---|
//! | [`Format::Json`] | always | line and column (`serde_json`) |
//! | [`Format::Toml`] | `toml` | line and column of the key or value (`toml`'s spans) |
//! | [`Format::Yaml`] | `yaml` | line and column (`serde_norway`'s locations) |
//!
//! A value can deserialize and still be wrong: a CIDR that does not parse, two fields
//! that must differ. [`Document::error`] reports such a finding the same way, with the line
//! of the field it names, so that no configuration mistake is reported without its place.
//!
//! # Example
//!
//! ```
//! use gray_config::{self as config, Format};
//! use serde::Deserialize;
//!
//! #[derive(Debug, Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Upstream {
//!     address: String,
//!     #[serde(default)]
//!     weight: u32,
//! }
//!
//! let text = "{\n  \"address\": \"10.0.0.7:8080\",\n  \"wieght\": 3\n}";
//! let err = config::from_str::<Upstream>(text, Format::Json, "upstream.json").unwrap_err();
//! assert_eq!(err.line(), Some(3));
//! assert_eq!(err.field(), Some("wieght"));
//! assert!(err.to_string().starts_with("upstream.json:3:"), "{err}");
//! assert!(err.message().starts_with("unknown field `wieght`, expected `address` or `weight`"));
//!
//! // A check made after parsing names its line as well.
//! let doc = config::Document::new("{\n  \"address\": \"nowhere\"\n}", Format::Json, "upstream.json");
//! let upstream: Upstream = doc.parse()?;
//! assert!(upstream.address.parse::<std::net::SocketAddr>().is_err());
//! let err = doc.error("address", "expected `host:port`");
//! assert_eq!(err.line(), Some(2));
//! assert_eq!(err.to_string(), "upstream.json:2:22: field `address`: expected `host:port`");
//! # Ok::<(), config::ConfigError>(())
//! ```
//!
//! # Strict tables next to a policy
//!
//! Every configuration type of gray rejects unknown keys (serde's `deny_unknown_fields`),
//! so that a typo is an error and not a silently ignored setting. serde cannot do that
//! through `#[serde(flatten)]`; gray-policy's `WithPolicy` is the strict table that puts
//! a routing policy's keys next to a program's own, with errors read by this loader.

mod error;
mod locate;

use std::{fmt, path::Path};

use serde::de::{DeserializeOwned, DeserializeSeed};

pub use self::error::ConfigError;

/// A configuration format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// TOML (needs gray-config's feature `toml`).
    Toml,
    /// YAML, through `serde_norway` (needs gray-config's feature `yaml`).
    Yaml,
    /// JSON (always available).
    Json,
}

// === impl Format ===

impl Format {
    /// The format named by a file's extension: `.toml`, `.yaml` / `.yml`, `.json`.
    ///
    /// ```
    /// use gray_config::Format;
    /// assert_eq!(Format::from_path("conf/rules.yml".as_ref()), Some(Format::Yaml));
    /// assert_eq!(Format::from_path("rules".as_ref()), None);
    /// ```
    #[must_use]
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?;
        if ext.eq_ignore_ascii_case("toml") {
            Some(Format::Toml)
        } else if ext.eq_ignore_ascii_case("yaml") || ext.eq_ignore_ascii_case("yml") {
            Some(Format::Yaml)
        } else if ext.eq_ignore_ascii_case("json") {
            Some(Format::Json)
        } else {
            None
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Toml => "TOML",
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        })
    }
}

/// Deserializes `text`, written in `format`; `source` names it in errors (a file path, an
/// etcd key). See the [module docs](self).
pub fn from_str<T: DeserializeOwned>(
    text: &str,
    format: Format,
    source: &str,
) -> Result<T, ConfigError> {
    Document::new(text, format, source).parse()
}

/// A configuration document: its text, its format and the name of its source.
///
/// [`parse`](Self::parse) deserializes it; [`error`](Self::error) reports a problem that
/// only a check after parsing finds, at the line of the field it names.
#[derive(Debug, Clone, Copy)]
pub struct Document<'a> {
    text: &'a str,
    format: Format,
    source: &'a str,
}

/// A 1-based line, and column when the format reports it.
type Position = (usize, Option<usize>);

/// Why a run over the document failed: where, which field, what.
struct Failure {
    position: Option<Position>,
    path: Option<String>,
    message: String,
    /// The feature that would read the document's format, when it is not compiled in.
    disabled: Option<&'static str>,
}

// === impl Document ===

impl<'a> Document<'a> {
    /// The document `text`, in `format`, read from `source`.
    #[must_use]
    pub fn new(text: &'a str, format: Format, source: &'a str) -> Self {
        Document {
            text,
            format,
            source,
        }
    }

    /// The document in `bytes`, which must be UTF-8 (the error says where they are not).
    ///
    /// ```
    /// use gray_config::{Document, Format};
    ///
    /// let err = Document::from_slice(b"{\n \"a\": \"\xff\"}", Format::Json, "a.json").unwrap_err();
    /// assert_eq!((err.line(), err.column()), (Some(2), Some(8)));
    /// ```
    pub fn from_slice(
        bytes: &'a [u8],
        format: Format,
        source: &'a str,
    ) -> Result<Self, ConfigError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(Document::new(text, format, source)),
            Err(e) => Err(ConfigError::located(
                source,
                Some(line_column(bytes, e.valid_up_to())).map(|(l, c)| (l, Some(c))),
                None,
                format!("not UTF-8: {e}"),
            )),
        }
    }

    /// The text.
    #[must_use]
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The format.
    #[must_use]
    pub fn format(&self) -> Format {
        self.format
    }

    /// The source's name.
    #[must_use]
    pub fn source_name(&self) -> &'a str {
        self.source
    }

    /// Deserializes the document.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        self.run(true, std::marker::PhantomData::<T>)
            .map_err(|f| self.failed(f))
    }

    /// The error a failed run reports.
    fn failed(&self, failure: Failure) -> ConfigError {
        match failure.disabled {
            Some(feature) => ConfigError::format_disabled(self.source, feature),
            None => {
                ConfigError::located(self.source, failure.position, failure.path, failure.message)
            }
        }
    }

    /// An error about `field` (a dotted path such as `services.orders.fallback` or
    /// `rules[1].when.ip[0]`), at the line and column of its value in this document when
    /// it is there.
    pub fn error(&self, field: &str, message: impl fmt::Display) -> ConfigError {
        let field = field.trim_start_matches('.');
        ConfigError::located(
            self.source,
            self.position(field),
            Some(field.to_owned()),
            message.to_string(),
        )
    }

    /// The 1-based line and column of the value at `field` (a dotted path with `[i]`
    /// indices, as [`ConfigError::field`] names them), if the document has it. For the
    /// checks a program makes after parsing, when it builds an error of its own type.
    ///
    /// ```
    /// use gray_config::{Document, Format};
    ///
    /// let doc = Document::new("{\n  \"rules\": [\n    {\"name\": \"a\"}\n  ]\n}", Format::Json, "r.json");
    /// assert_eq!(doc.position("rules[0].name").map(|(line, _)| line), Some(3));
    /// assert_eq!(doc.string_at("rules[0].name").as_deref(), Some("a"));
    /// assert_eq!(doc.position("rules[1]"), None);
    /// ```
    #[must_use]
    pub fn position(&self, field: &str) -> Option<(usize, Option<usize>)> {
        self.seek(field).map(|(position, _)| position)?
    }

    /// The string at `field`, if the document has one there (see [`Document::position`]).
    #[must_use]
    pub fn string_at(&self, field: &str) -> Option<String> {
        self.seek(field)?.1
    }

    fn seek(&self, field: &str) -> Option<(Option<Position>, Option<String>)> {
        let path = locate::Segment::parse(field)?;
        let text = std::cell::Cell::new(None);
        match self.run(false, locate::Seek::new(&path, &text)) {
            // serde_norway may put the path of the value before the marker.
            Err(f) if f.message.ends_with(locate::FOUND) => Some((f.position, text.take())),
            _ => None,
        }
    }

    /// Runs `seed` over the document; on failure, says where (and, with `track`, the path
    /// of the field).
    fn run<T, S>(&self, track: bool, seed: S) -> Result<T, Failure>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        match self.format {
            Format::Json => self.run_json(track, seed),
            #[cfg(feature = "toml")]
            Format::Toml => self.run_toml(track, seed),
            #[cfg(feature = "yaml")]
            Format::Yaml => self.run_yaml(track, seed),
            #[cfg(not(feature = "toml"))]
            Format::Toml => Err(self.disabled("toml")),
            #[cfg(not(feature = "yaml"))]
            Format::Yaml => Err(self.disabled("yaml")),
        }
    }

    /// The failure of a run over a format whose `feature` is not compiled in (compiled in
    /// tests too: CI builds every feature, and still tests what a build without one says).
    #[cfg(any(test, not(all(feature = "toml", feature = "yaml"))))]
    fn disabled(&self, feature: &'static str) -> Failure {
        Failure {
            position: None,
            path: None,
            message: ConfigError::format_disabled(self.source, feature)
                .message()
                .to_owned(),
            disabled: Some(feature),
        }
    }

    fn run_json<T, S>(&self, track: bool, seed: S) -> Result<T, Failure>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let position = |e: &serde_json::Error| {
            (e.line() > 0).then(|| (e.line(), (e.column() > 0).then_some(e.column())))
        };
        let mut de = serde_json::Deserializer::from_str(self.text);
        let value = tracked(&mut de, track, seed).map_err(|(path, e)| Failure {
            position: position(&e),
            path,
            message: strip_positions(&e.to_string()),
            disabled: None,
        })?;
        de.end().map_err(|e| Failure {
            position: position(&e),
            path: None,
            message: strip_positions(&e.to_string()),
            disabled: None,
        })?;
        Ok(value)
    }

    #[cfg(feature = "toml")]
    fn run_toml<T, S>(&self, track: bool, seed: S) -> Result<T, Failure>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let position = |e: &toml::de::Error| {
            e.span()
                .map(|s| line_column(self.text.as_bytes(), s.start))
                .map(|(line, column)| (line, Some(column)))
        };
        let de = toml::Deserializer::parse(self.text).map_err(|e| Failure {
            position: position(&e),
            path: None,
            message: e.message().to_owned(),
            disabled: None,
        })?;
        tracked(de, track, seed).map_err(|(path, e)| Failure {
            position: position(&e),
            path,
            message: e.message().to_owned(),
            disabled: None,
        })
    }

    #[cfg(feature = "yaml")]
    fn run_yaml<T, S>(&self, track: bool, seed: S) -> Result<T, Failure>
    where
        S: for<'de> DeserializeSeed<'de, Value = T>,
    {
        let de = serde_norway::Deserializer::from_str(self.text);
        tracked(de, track, seed).map_err(|(path, e)| {
            let message = strip_positions(&e.to_string());
            // serde_norway starts its message with the path of the enclosing value, which
            // `path` gives more precisely.
            let message = match (message.split_once(": "), &path) {
                (Some((prefix, rest)), Some(path)) if path.starts_with(prefix) => rest.to_owned(),
                _ => message,
            };
            Failure {
                position: e.location().map(|l| (l.line(), Some(l.column()))),
                path,
                message,
                disabled: None,
            }
        })
    }
}

/// Runs `seed` over `de`, with the path of the failing field when `track` is set.
fn tracked<'de, D, S>(de: D, track: bool, seed: S) -> Result<S::Value, (Option<String>, D::Error)>
where
    D: serde::Deserializer<'de>,
    S: DeserializeSeed<'de>,
{
    if !track {
        return seed.deserialize(de).map_err(|e| (None, e));
    }
    let mut track = serde_path_to_error::Track::new();
    seed.deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
        .map_err(|e| (Some(track.path().to_string()), e))
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

/// Drops every ` at line L column C` that serde_json and serde_norway write into their
/// messages: the position is reported on its own.
fn strip_positions(message: &str) -> String {
    const AT: &str = " at line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(AT) {
        let after = &rest[i + AT.len()..];
        let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let line = digits(after);
        let column = after[line..]
            .strip_prefix(" column ")
            .map(digits)
            .filter(|&n| line > 0 && n > 0);
        match column {
            Some(n) => {
                out.push_str(&rest[..i]);
                rest = &after[line + " column ".len() + n..];
            }
            None => {
                out.push_str(&rest[..i + AT.len()]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
