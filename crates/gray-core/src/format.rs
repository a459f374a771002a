//! The configuration file formats every gray crate reads: TOML, YAML and JSON.
//!
//! One enum, shared by staining rules ([`crate::rules`]) and instance files
//! (`gray_discovery::WatchedFile`).

use std::path::Path;

/// A configuration format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// TOML (parsing rule sets needs gray-core's feature `toml`).
    Toml,
    /// YAML (parsing rule sets needs gray-core's feature `yaml`).
    Yaml,
    /// JSON (always available).
    Json,
}

impl Format {
    /// The format named by a file's extension: `.toml`, `.yaml` / `.yml`, `.json`.
    ///
    /// ```
    /// use gray_core::format::Format;
    /// assert_eq!(Format::from_path("conf/rules.yml".as_ref()), Some(Format::Yaml));
    /// assert_eq!(Format::from_path("rules".as_ref()), None);
    /// ```
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
