//! Errors of loading and validating a rule set.

use std::{borrow::Cow, fmt, sync::Arc};

use gray_config::{ConfigError, Document};

/// A rule set that could not be loaded: it names the source, the line and column (when the
/// rule set was parsed from text), the rule, the field and what was expected.
///
/// ```text
/// rules.toml:7:30: rules[1] ("testers"), field `when.header.regex`: expected a valid regular expression (regex parse error: …)
/// ```
#[derive(Debug, Clone)]
pub struct RulesError(Box<Details>);

/// Boxed, so that a `Result` of the compiler stays small.
#[derive(Debug, Clone)]
struct Details {
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
    /// The format is not compiled in (a cargo feature of gray-rules is off).
    FormatDisabled(&'static str),
}

// === impl RulesError ===

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
        RulesError(Box::new(Details {
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
        // A field that is not written (a missing `arms`) is reported at the nearest table
        // around it that is.
        let mut at = path.as_str();
        loop {
            if let Some((line, column)) = document.position(at) {
                e.line = Some(line);
                e.column = column;
                break;
            }
            match at.rfind(['.', '[']) {
                Some(cut) if cut > 0 => at = &at[..cut],
                _ => break,
            }
        }
        self
    }

    /// The source: a file path, an etcd key, or whatever name the caller gave.
    #[must_use]
    pub fn source_name(&self) -> &str {
        &self.0.source_name
    }

    /// The line of the error, from 1, when the rule set was parsed from text.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        self.0.line
    }

    /// The column of the error, from 1, when the format reports it.
    #[must_use]
    pub fn column(&self) -> Option<usize> {
        self.0.column
    }

    /// The 0-based index of the rule at fault, if the error is inside a rule.
    #[must_use]
    pub fn rule_index(&self) -> Option<usize> {
        self.0.rule.as_ref().map(|(i, _)| *i)
    }

    /// The name of the rule at fault, if it has one.
    #[must_use]
    pub fn rule_name(&self) -> Option<&str> {
        self.0.rule.as_ref().and_then(|(_, n)| n.as_deref())
    }

    /// The field at fault, as a dotted path inside the rule (or the document, for an error
    /// outside every rule).
    #[must_use]
    pub fn field(&self) -> &str {
        &self.0.field
    }

    /// What went wrong.
    #[must_use]
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
                "this format is not compiled in: enable the `{feature}` feature of gray-rules"
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

// === impl At ===

impl At<'_> {
    pub(crate) fn expected(
        &self,
        field: impl Into<String>,
        expected: impl Into<Cow<'static, str>>,
        found: Option<String>,
    ) -> RulesError {
        RulesError(Box::new(Details {
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

    /// Checks that exactly one of the `keys` of `field` is set (each with whether it is);
    /// the error lists them: "exactly one of `a`, `b` or `c`", found "2 of them".
    pub(crate) fn exactly_one(&self, field: &str, keys: &[(&str, bool)]) -> Result<(), RulesError> {
        let set = keys.iter().filter(|(_, set)| *set).count();
        if set == 1 {
            return Ok(());
        }
        let mut expected = String::from("exactly one of ");
        for (i, (key, _)) in keys.iter().enumerate() {
            let sep = match i {
                0 => "",
                i if i + 1 == keys.len() => " or ",
                _ => ", ",
            };
            expected.push_str(&format!("{sep}`{key}`"));
        }
        Err(self.expected(field, expected, Some(format!("{set} of them"))))
    }
}

// Documents in all three formats, each with its line.
#[cfg(all(test, feature = "toml", feature = "yaml"))]
mod tests {
    use super::*;
    use crate::{Format, KeyConfig, RuleSet, RulesConfig};

    fn error(text: &str) -> RulesError {
        RuleSet::parse(text, Format::Json, "rules.json").unwrap_err()
    }

    /// What a build without a format's feature reports (this module is built with every
    /// feature, as CI builds it): gray-rules' feature, which forwards to gray-config's.
    #[test]
    fn a_disabled_format_names_the_gray_rules_feature() {
        let e = RulesError(Box::new(Details {
            source_name: Arc::from("rules.yaml"),
            line: None,
            column: None,
            rule: None,
            field: String::new(),
            problem: Problem::FormatDisabled("yaml"),
        }));
        assert_eq!(
            e.to_string(),
            "rules.yaml: this format is not compiled in: enable the `yaml` feature of gray-rules"
        );
    }

    /// One typo per kind of table: each is refused with the file, its line, its rule and its
    /// field, in TOML, YAML and JSON.
    #[test]
    fn every_table_rejects_unknown_keys_with_file_line_and_field() {
        // (table, TOML, YAML, field inside the rule (empty: the document), the unknown key)
        let cases = [
            (
                "the document",
                "enabled = true\nrulez = []\n",
                "enabled: true\nrulez: []\n",
                "rulez",
                "rulez",
            ),
            (
                "a rule",
                "[[rules]]\nlane = \"gray\"\nlabe = \"x\"\n",
                "rules:\n  - lane: gray\n    labe: x\n",
                "labe",
                "labe",
            ),
            (
                "a condition",
                "[[rules]]\nlane = \"gray\"\n[rules.when]\nhedaer = { name = \"x\", present = true }\n",
                "rules:\n  - lane: gray\n    when:\n      hedaer: { name: x, present: true }\n",
                "when.hedaer",
                "hedaer",
            ),
            (
                "a nested condition",
                "[[rules]]\nlane = \"gray\"\n[rules.when]\nnot = { cokie = { name = \"x\", present = true } }\n",
                "rules:\n  - lane: gray\n    when:\n      not: { cokie: { name: x, present: true } }\n",
                "when.not.cokie",
                "cokie",
            ),
            (
                "a field match",
                "[[rules]]\nlane = \"gray\"\n[rules.when.header]\nname = \"x\"\nexcat = \"1\"\n",
                "rules:\n  - lane: gray\n    when:\n      header:\n        name: x\n        excat: \"1\"\n",
                "when.header.excat",
                "excat",
            ),
            (
                "a path match",
                "[[rules]]\nlane = \"gray\"\n[rules.when.path]\nprefx = \"/api\"\n",
                "rules:\n  - lane: gray\n    when:\n      path:\n        prefx: /api\n",
                "when.path.prefx",
                "prefx",
            ),
            (
                "a split arm",
                "[[rules]]\n[[rules.split]]\nweight = 1\nlane = \"a\"\n[[rules.split]]\nweight = 1\nlnae = \"b\"\n",
                "rules:\n  - split:\n      - { weight: 1, lane: a }\n      - weight: 1\n        lnae: b\n",
                "split[1].lnae",
                "lnae",
            ),
            (
                "version_from",
                "[[rules]]\n[rules.version_from]\npath_segment = 0\nstrip = \"v\"\n",
                "rules:\n  - version_from:\n      path_segment: 0\n      strip: v\n",
                "version_from.strip",
                "strip",
            ),
            (
                "sticky",
                "[[rules]]\nlane = \"gray\"\n[rules.when.sticky]\nby = \"client_ip\"\npercent = 10\nsalty = \"s\"\n",
                "rules:\n  - lane: gray\n    when:\n      sticky:\n        by: client_ip\n        percent: 10\n        salty: s\n",
                "when.sticky.salty",
                "salty",
            ),
            (
                "sticky's key",
                "[[rules]]\nlane = \"gray\"\n[rules.when.sticky]\npercent = 10\nby = { hedaer = \"x\" }\n",
                "rules:\n  - lane: gray\n    when:\n      sticky:\n        percent: 10\n        by: { hedaer: x }\n",
                "when.sticky.by.hedaer",
                "hedaer",
            ),
            (
                "random",
                "[[rules]]\nlane = \"gray\"\n[rules.when.random]\npercent = 10\nseed = 1\n",
                "rules:\n  - lane: gray\n    when:\n      random:\n        percent: 10\n        seed: 1\n",
                "when.random.seed",
                "seed",
            ),
        ];
        for (table, toml, yaml, field, key) in cases {
            for (format, text, file) in [
                (Format::Toml, toml, "rules.toml"),
                (Format::Yaml, yaml, "rules.yaml"),
            ] {
                let line = text.lines().position(|l| l.contains(key)).unwrap() + 1;
                let e = RuleSet::parse(text, format, file).unwrap_err();
                assert_eq!(e.line(), Some(line), "{table}, {format}: {e}");
                assert_eq!(e.field(), field, "{table}, {format}: {e}");
                assert_eq!(
                    e.rule_index(),
                    (table != "the document").then_some(0),
                    "{table}, {format}: {e}"
                );
                let text = e.to_string();
                assert!(
                    text.starts_with(&format!("{file}:{line}:")),
                    "{table}, {format}: {text}"
                );
                assert!(
                    text.contains(&format!("unknown field `{key}`"))
                        || text.contains(&format!("unknown variant `{key}`")),
                    "{table}, {format}: {text}"
                );
            }
        }
        // JSON: the same, on one of them.
        let e = error(
            "{\"rules\": [\n  {\"lane\": \"gray\",\n   \"when\": {\"path\": {\"prefx\": \"/api\"}}}\n]}",
        );
        assert_eq!(
            (e.line(), e.rule_index(), e.field()),
            (Some(3), Some(0), "when.path.prefx")
        );
    }

    /// Values that deserialize but do not compile are reported at their line as well.
    #[test]
    fn compile_errors_have_their_line() {
        let toml = "[[rules]]\nname = \"a\"\nlane = \"gray\"\n\n[[rules]]\nname = \"b\"\nlane = \"gray\"\nwhen = { header = { name = \"x\", regex = \"(\" } }\n";
        let e = RuleSet::parse(toml, Format::Toml, "rules.toml").unwrap_err();
        assert_eq!(
            (e.line(), e.rule_index(), e.field()),
            (Some(8), Some(1), "when.header.regex")
        );
        let yaml = "rules:\n  - name: a\n    lane: gray\n  - name: b\n    split:\n      - weight: 0\n        lane: g\n";
        let e = RuleSet::parse(yaml, Format::Yaml, "rules.yaml").unwrap_err();
        assert_eq!(
            (e.line(), e.rule_index(), e.field()),
            (Some(6), Some(1), "split"),
            "{e}"
        );
        // An error about the rule as a whole points at the rule.
        let yaml =
            "rules:\n  - name: a\n    lane: gray\n  - name: b\n    baseline: true\n    lane: g\n";
        let e = RuleSet::parse(yaml, Format::Yaml, "rules.yaml").unwrap_err();
        assert_eq!((e.rule_index(), e.field()), (Some(1), ""), "{e}");
        assert!(matches!(e.line(), Some(4 | 5)), "{e}");
        // A rule set compiled from a value has no text, so no line.
        let config = RulesConfig::parse(yaml, Format::Yaml, "rules.yaml").unwrap();
        let e = RuleSet::compile(&config, "rules.yaml").unwrap_err();
        assert_eq!(e.line(), None);
        assert!(
            e.to_string().starts_with("rules.yaml: rules[1] (\"b\")"),
            "{e}"
        );
    }

    /// The sticky key reads the same in every format, as `docs/rules.md` writes it.
    #[test]
    fn sticky_keys_read_alike_in_every_format() {
        let sticky = |format, text: &str| {
            let config = RulesConfig::parse(text, format, "r").unwrap_or_else(|e| panic!("{e}"));
            config.rules[0]
                .when
                .as_ref()
                .unwrap()
                .sticky
                .clone()
                .unwrap()
                .by
        };
        let header = KeyConfig::Header("x-user-id".into());
        let toml = "[[rules]]\nlane = \"g\"\nwhen = { sticky = { by = { header = \"x-user-id\" }, percent = 10 } }\n";
        assert_eq!(sticky(Format::Toml, toml), header);
        let yaml = "rules:\n  - lane: g\n    when: { sticky: { by: { header: x-user-id }, percent: 10 } }\n";
        assert_eq!(sticky(Format::Yaml, yaml), header);
        let tagged =
            "rules:\n  - lane: g\n    when: { sticky: { by: !header x-user-id, percent: 10 } }\n";
        assert_eq!(sticky(Format::Yaml, tagged), header);
        let json = r#"{"rules":[{"lane":"g","when":{"sticky":{"by":{"header":"x-user-id"},"percent":10}}}]}"#;
        assert_eq!(sticky(Format::Json, json), header);
        let ip = r#"{"rules":[{"lane":"g","when":{"sticky":{"by":"client_ip","percent":10}}}]}"#;
        assert_eq!(sticky(Format::Json, ip), KeyConfig::ClientIp);
        // Serialized and read back.
        let config = RulesConfig::parse(json, Format::Json, "r").unwrap();
        let again = serde_json::to_string(&config).unwrap();
        assert_eq!(
            RulesConfig::parse(&again, Format::Json, "r").unwrap(),
            config
        );

        for (text, message) in [
            (r#""header""#, "invalid value: string \"header\""),
            (r#"{"header":"a","cookie":"b"}"#, "invalid length 2"),
            (r#"{}"#, "invalid length 0"),
            (
                r#"{"header":1}"#,
                "invalid type: integer `1`, expected a string",
            ),
        ] {
            let doc = format!(
                r#"{{"rules":[{{"lane":"g","when":{{"sticky":{{"by":{text},"percent":10}}}}}}]}}"#
            );
            let e = RuleSet::parse(&doc, Format::Json, "r.json").unwrap_err();
            assert!(e.field().starts_with("when.sticky.by"), "{text}: {e}");
            assert!(e.to_string().contains(message), "{text}: {e}");
        }
    }

    /// `docs/rules.md` stays exact: its three documents parse to the same rules, and its
    /// error lines are what the parser says.
    #[test]
    fn the_guide_is_exact() {
        let guide = include_str!("../docs/rules.md");
        let block = |lang: &str| {
            let start = guide
                .find(&format!("```{lang}\n"))
                .unwrap_or_else(|| panic!("a {lang} block"))
                + lang.len()
                + 4;
            &guide[start..start + guide[start..].find("```").unwrap()]
        };
        let toml = block("toml");
        let a = RulesConfig::parse(toml, Format::Toml, "rules.toml").unwrap();
        let b = RulesConfig::parse(block("yaml"), Format::Yaml, "rules.yaml").unwrap();
        let c = RulesConfig::parse(block("json"), Format::Json, "rules.json").unwrap();
        assert_eq!(a, b);
        assert_eq!(b, c);
        assert_eq!(a.rules.len(), 4);
        RuleSet::compile(&a, "rules.toml").unwrap();

        // The last `text` block: the errors (the first is the sticky split's formula).
        let start = guide.rfind("```text\n").expect("a text block") + 8;
        let errors: Vec<&str> = guide[start..start + guide[start..].find("```").unwrap()]
            .lines()
            .collect();
        let percent = toml.replace("percent = 10 }", "percent = 120 }");
        let e = RuleSet::parse(&percent, Format::Toml, "rules.toml").unwrap_err();
        assert_eq!(e.to_string(), errors[0]);
        let typo = toml.replace("strip_prefix", "strip_prefx");
        let e = RuleSet::parse(&typo, Format::Toml, "rules.toml").unwrap_err();
        assert_eq!(e.to_string(), errors[1]);
    }
}
