//! Errors of loading and validating a rule set.

use std::{borrow::Cow, fmt, sync::Arc};

use crate::config::{ConfigError, Document};

/// A rule set that could not be loaded: it names the source, the line and column (when the
/// rule set was parsed from text), the rule, the field and what was expected.
///
/// ```text
/// rules.toml:7:30: rules[1] ("testers"), field `when.header.regex`: expected a valid regular expression (regex parse error: …)
/// ```
#[derive(Debug, Clone)]
pub struct RulesError(Box<Inner>);

/// Boxed, so that a `Result` of the compiler stays small.
#[derive(Debug, Clone)]
struct Inner {
    source_name: Arc<str>,
    line: Option<usize>,
    column: Option<usize>,
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
    /// A document that did not deserialize: its field path is made relative to its rule,
    /// whose name is read from the document.
    pub(crate) fn from_document(e: ConfigError, document: &Document<'_>) -> Self {
        let mut error = RulesError::from_config(e);
        if let Some((i, name @ None)) = &mut error.0.rule {
            *name = document.string_at(&format!("rules[{i}].name"));
        }
        error
    }

    fn from_config(e: ConfigError) -> Self {
        let path = e.field().unwrap_or_default();
        let rule = rule_from_path(path);
        let field = match &rule {
            Some(_) => match path.find(']') {
                Some(end) => path[end + 1..].trim_start_matches('.').to_owned(),
                None => String::new(),
            },
            None => path.to_owned(),
        };
        let problem = match e.disabled_feature() {
            Some(feature) => Problem::FormatDisabled(feature),
            None => Problem::Syntax(e.message().to_owned()),
        };
        RulesError(Box::new(Inner {
            source_name: e.shared_source().clone(),
            line: e.line(),
            column: e.column(),
            rule,
            field,
            problem,
        }))
    }

    /// Adds the line and column of the field at fault in `document`.
    pub(crate) fn locate(mut self, document: &Document<'_>) -> Self {
        let e = &mut *self.0;
        let path = match (&e.rule, e.field.is_empty()) {
            (Some((i, _)), true) => format!("rules[{i}]"),
            (Some((i, _)), false) => format!("rules[{i}].{}", e.field),
            (None, _) => e.field.clone(),
        };
        if let Some((line, column)) = document.position(&path) {
            e.line = Some(line);
            e.column = column;
        }
        self
    }

    /// The source: a file path, an etcd key, or whatever name the caller gave.
    pub fn source_name(&self) -> &str {
        &self.0.source_name
    }

    /// The line of the error, from 1, when the rule set was parsed from text.
    pub fn line(&self) -> Option<usize> {
        self.0.line
    }

    /// The column of the error, from 1, when the format reports it.
    pub fn column(&self) -> Option<usize> {
        self.0.column
    }

    /// The 0-based index of the rule at fault, if the error is inside a rule.
    pub fn rule_index(&self) -> Option<usize> {
        self.0.rule.as_ref().map(|(i, _)| *i)
    }

    /// The name of the rule at fault, if it has one.
    pub fn rule_name(&self) -> Option<&str> {
        self.0.rule.as_ref().and_then(|(_, n)| n.as_deref())
    }

    /// The field at fault, as a dotted path inside the rule (or the document, for an error
    /// outside every rule).
    pub fn field(&self) -> &str {
        &self.0.field
    }

    /// What went wrong.
    pub fn problem(&self) -> &Problem {
        &self.0.problem
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
        f.write_str(&self.0.source_name)?;
        if let Some(line) = self.0.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.0.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        match &self.0.rule {
            Some((i, Some(name))) => write!(f, "rules[{i}] ({name:?}), ")?,
            Some((i, None)) => write!(f, "rules[{i}], ")?,
            None => {}
        }
        if !self.0.field.is_empty() {
            write!(f, "field `{}`: ", self.0.field)?;
        }
        match &self.0.problem {
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
        RulesError(Box::new(Inner {
            source_name: self.source_name.clone(),
            line: None,
            column: None,
            rule: self.rule.map(|(i, n)| (i, n.map(str::to_owned))),
            field: field.into(),
            problem: Problem::Expected {
                expected: expected.into(),
                found,
            },
        }))
    }
}
