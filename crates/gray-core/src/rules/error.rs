//! Errors of loading and validating a rule set.

use std::{borrow::Cow, fmt, sync::Arc};

/// A rule set that could not be loaded: it names the source, the rule, the field and what
/// was expected.
///
/// ```text
/// rules.toml: rules[1] ("testers"), field `when.header.regex`: expected a valid regular expression (regex parse error: …)
/// ```
#[derive(Debug, Clone)]
pub struct RulesError {
    source_name: Arc<str>,
    rule: Option<(usize, Option<String>)>,
    field: String,
    problem: Problem,
}

/// What went wrong, inside a [`RulesError`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Problem {
    /// The text does not parse in its format, or has the wrong shape.
    Syntax(String),
    /// A value is not what the field expects.
    Expected {
        /// What the field expects.
        expected: Cow<'static, str>,
        /// What was found, when it helps.
        found: Option<String>,
    },
    /// The format is not compiled in (a cargo feature of gray-core is off).
    FormatDisabled(&'static str),
}

impl RulesError {
    pub(crate) fn syntax(source_name: &Arc<str>, field: String, message: String) -> Self {
        let rule = rule_from_path(&field);
        RulesError {
            source_name: source_name.clone(),
            rule,
            field,
            problem: Problem::Syntax(message),
        }
    }

    #[cfg(not(all(feature = "toml", feature = "yaml")))]
    pub(crate) fn format_disabled(source_name: &Arc<str>, feature: &'static str) -> Self {
        RulesError {
            source_name: source_name.clone(),
            rule: None,
            field: String::new(),
            problem: Problem::FormatDisabled(feature),
        }
    }

    /// The source: a file path, an etcd key, or whatever name the caller gave.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    /// The 0-based index of the rule at fault, if the error is inside a rule.
    pub fn rule_index(&self) -> Option<usize> {
        self.rule.as_ref().map(|(i, _)| *i)
    }

    /// The name of the rule at fault, if it has one.
    pub fn rule_name(&self) -> Option<&str> {
        self.rule.as_ref().and_then(|(_, n)| n.as_deref())
    }

    /// The field at fault, as a dotted path inside the rule (or the document).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What went wrong.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }
}

/// `rules[3].when.header` → rule 3 (serde_path_to_error's path form).
fn rule_from_path(path: &str) -> Option<(usize, Option<String>)> {
    let rest = path.strip_prefix("rules[")?;
    let end = rest.find(']')?;
    rest[..end].parse().ok().map(|i| (i, None))
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.source_name)?;
        match &self.rule {
            Some((i, Some(name))) => write!(f, "rules[{i}] ({name:?}), ")?,
            Some((i, None)) => write!(f, "rules[{i}], ")?,
            None => {}
        }
        if !self.field.is_empty() {
            write!(f, "field `{}`: ", self.field)?;
        }
        match &self.problem {
            Problem::Syntax(message) => f.write_str(message),
            Problem::Expected {
                expected,
                found: Some(found),
            } => write!(f, "expected {expected}, found {found}"),
            Problem::Expected {
                expected,
                found: None,
            } => write!(f, "expected {expected}"),
            Problem::FormatDisabled(feature) => write!(
                f,
                "this format is not compiled in: enable the `{feature}` feature of gray-core"
            ),
        }
    }
}

impl std::error::Error for RulesError {}

/// Where the compiler is, to build errors that name the source, rule and field.
pub(crate) struct At<'a> {
    pub(crate) source_name: &'a Arc<str>,
    pub(crate) rule: Option<(usize, Option<&'a str>)>,
}

impl At<'_> {
    pub(crate) fn expected(
        &self,
        field: impl Into<String>,
        expected: impl Into<Cow<'static, str>>,
        found: Option<String>,
    ) -> RulesError {
        RulesError {
            source_name: self.source_name.clone(),
            rule: self.rule.map(|(i, n)| (i, n.map(str::to_owned))),
            field: field.into(),
            problem: Problem::Expected {
                expected: expected.into(),
                found,
            },
        }
    }
}
