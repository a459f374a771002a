//! The file formats a rule set is read from.

use std::sync::Arc;

pub use crate::format::Format;

use super::{config::RulesConfig, error::RulesError};

impl RulesConfig {
    /// Deserializes `text` in `format`; `source` names it in errors.
    ///
    /// ```
    /// use gray_core::rules::{Format, RulesConfig};
    ///
    /// let config = RulesConfig::parse(r#"{"rules":[{"lane":"gray"}]}"#, Format::Json, "inline")?;
    /// assert_eq!(config.rules[0].lane.as_deref(), Some("gray"));
    /// # Ok::<(), gray_core::rules::RulesError>(())
    /// ```
    pub fn parse(text: &str, format: Format, source: &str) -> Result<Self, RulesError> {
        parse(text, format, &Arc::from(source))
    }
}

fn path_error<E: std::fmt::Display>(
    source: &Arc<str>,
    e: serde_path_to_error::Error<E>,
) -> RulesError {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = e
        .into_inner()
        .to_string()
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    RulesError::syntax(source, path, message)
}

pub(crate) fn parse(
    text: &str,
    format: Format,
    source: &Arc<str>,
) -> Result<RulesConfig, RulesError> {
    match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            let config: RulesConfig =
                serde_path_to_error::deserialize(&mut de).map_err(|e| path_error(source, e))?;
            de.end()
                .map_err(|e| RulesError::syntax(source, String::new(), e.to_string()))?;
            Ok(config)
        }
        #[cfg(feature = "toml")]
        Format::Toml => {
            let de = toml::Deserializer::parse(text)
                .map_err(|e| RulesError::syntax(source, String::new(), one_line(&e.to_string())))?;
            serde_path_to_error::deserialize(de).map_err(|e| path_error(source, e))
        }
        #[cfg(not(feature = "toml"))]
        Format::Toml => Err(RulesError::format_disabled(source, "toml")),
        #[cfg(feature = "yaml")]
        Format::Yaml => {
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| path_error(source, e))
        }
        #[cfg(not(feature = "yaml"))]
        Format::Yaml => Err(RulesError::format_disabled(source, "yaml")),
    }
}

#[cfg(feature = "toml")]
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
