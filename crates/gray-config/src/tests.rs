//! The loader's tests: the three formats agree on positions, fields and messages.

use serde::Deserialize;

use super::*;

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Doc {
    name: String,
    #[serde(default)]
    upstreams: Vec<Upstream>,
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Upstream {
    address: String,
    #[serde(default)]
    weight: u32,
}

/// The same document in every compiled-in format: `(format, text)`.
fn documents() -> Vec<(Format, &'static str)> {
    let mut docs = vec![(
        Format::Json,
        "{\n  \"name\": \"a\",\n  \"upstreams\": [\n    {\"address\": \"x\"},\n    {\"address\": \"y\", \"weight\": 3}\n  ]\n}\n",
    )];
    if cfg!(feature = "toml") {
        docs.push((
            Format::Toml,
            "name = \"a\"\n\n[[upstreams]]\naddress = \"x\"\n[[upstreams]]\naddress = \"y\"\nweight = 3\n",
        ));
    }
    if cfg!(feature = "yaml") {
        docs.push((
            Format::Yaml,
            "name: a\nupstreams:\n  - address: x\n  - address: y\n    weight: 3\n",
        ));
    }
    docs
}

#[test]
fn the_formats_agree() {
    for (format, text) in documents() {
        let doc: Doc = from_str(text, format, "doc").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(doc.upstreams[1].weight, 3, "{format}");
    }
}

#[test]
fn errors_name_source_line_and_field() {
    for (format, text) in documents() {
        // A key no table knows, at the line where it is written.
        let typo = text.replacen("weight", "wieght", 1);
        let line = typo.lines().position(|l| l.contains("wieght")).unwrap() + 1;
        let err = from_str::<Doc>(&typo, format, "doc").unwrap_err();
        assert_eq!(err.line(), Some(line), "{format}: {err}");
        assert!(err.column().is_some(), "{format}: {err}");
        assert_eq!(err.field(), Some("upstreams[1].wieght"), "{format}: {err}");
        assert_eq!(
            err.message(),
            "unknown field `wieght`, expected `address` or `weight`",
            "{format}"
        );
        assert!(
            err.to_string().starts_with(&format!(
                "doc:{line}:{}: field `upstreams[1].wieght`: unknown field",
                err.column().unwrap()
            )),
            "{format}: {err}"
        );

        // A value of the wrong type.
        let bad = text.replacen('3', "\"3\"", 1);
        let err = from_str::<Doc>(&bad, format, "doc").unwrap_err();
        assert_eq!(err.line(), Some(line), "{format}: {err}");
        assert_eq!(err.field(), Some("upstreams[1].weight"), "{format}: {err}");
        assert!(
            err.message().starts_with("invalid type: string \"3\""),
            "{format}: {err}"
        );

        // A check after parsing: its line from the document.
        let doc = Document::new(text, format, "doc");
        let err = doc.error("upstreams[1].weight", "too heavy");
        assert_eq!(err.line(), Some(line), "{format}: {err}");
        assert_eq!(err.field(), Some("upstreams[1].weight"));
        let name_line = text.lines().position(|l| l.contains("name")).unwrap() + 1;
        assert_eq!(doc.error("name", "x").line(), Some(name_line), "{format}");
        let first = text
            .lines()
            .position(|l| l.contains("\"x\"") || l.ends_with(" x"))
            .unwrap()
            + 1;
        assert_eq!(
            doc.error("upstreams[0]", "x").line().map(|l| l <= first),
            Some(true),
            "{format}"
        );
        // A field the document does not have: no position, still the field.
        let err = doc.error("upstreams[7].weight", "missing");
        assert_eq!(
            (err.line(), err.field()),
            (None, Some("upstreams[7].weight"))
        );
        assert_eq!(err.to_string(), "doc: field `upstreams[7].weight`: missing");
    }
}

#[test]
fn syntax_errors_have_a_line() {
    let mut cases = vec![(Format::Json, "{\"name\": \"a\",\n\"upstreams\": [}", 2)];
    if cfg!(feature = "toml") {
        cases.push((Format::Toml, "name = \"a\"\nupstreams = \n", 2));
    }
    if cfg!(feature = "yaml") {
        cases.push((Format::Yaml, "name: a\nupstreams: [\n", 3));
    }
    for (format, text, line) in cases {
        let err = from_str::<Doc>(text, format, "doc").unwrap_err();
        assert_eq!(err.line(), Some(line), "{format}: {err}");
        assert!(!err.message().contains(" at line "), "{format}: {err}");
    }
    // Trailing text after a JSON document.
    let err = from_str::<Doc>("{\"name\": \"a\"}\nx", Format::Json, "doc").unwrap_err();
    assert_eq!(err.line(), Some(2), "{err}");
}

#[test]
fn missing_fields_and_bad_utf8() {
    let err = from_str::<Doc>("{}", Format::Json, "doc").unwrap_err();
    assert_eq!(err.message(), "missing field `name`");
    let err = Document::from_slice(b"{\"name\":\n\"\xc3\"}", Format::Json, "doc").unwrap_err();
    assert_eq!((err.line(), err.column()), (Some(2), Some(2)));
    assert!(err.message().starts_with("not UTF-8"), "{err}");
}

/// What a build without a format's feature answers. CI builds every feature, so the
/// failure the disabled branch of `Document::run` returns is made here directly and
/// reported the way `parse` reports every failure.
#[test]
fn a_disabled_format_says_which_feature() {
    for (format, feature, text) in [
        (Format::Toml, "toml", "name = \"a\""),
        (Format::Yaml, "yaml", "name: a"),
    ] {
        let doc = Document::new(text, format, "doc");
        let err = doc.failed(doc.disabled(feature));
        assert_eq!(
            err.to_string(),
            format!(
                "doc: this format is not compiled in: enable the `{feature}` feature of gray-config"
            )
        );
        assert_eq!(err.disabled_feature(), Some(feature));
        assert_eq!((err.line(), err.field()), (None, None));

        // The whole path, in this build: read with the feature, that error without it.
        match doc.parse::<Doc>() {
            Ok(parsed) => {
                assert!(compiled(feature), "{feature}");
                assert_eq!(parsed.name, "a");
            }
            Err(e) => {
                assert!(!compiled(feature), "{feature}: {e}");
                assert_eq!(e.disabled_feature(), Some(feature));
            }
        }
    }
}

fn compiled(feature: &str) -> bool {
    match feature {
        "toml" => cfg!(feature = "toml"),
        "yaml" => cfg!(feature = "yaml"),
        _ => unreachable!(),
    }
}

#[test]
fn positions_and_messages() {
    assert_eq!(line_column(b"ab\ncd", 4), (2, 2));
    assert_eq!(line_column(b"ab", 0), (1, 1));
    assert_eq!(line_column(b"ab", 99), (1, 3));
    assert_eq!(line_column("é\né".as_bytes(), 5), (2, 2));
    assert_eq!(strip_positions("bad at line 3 column 4"), "bad");
    assert_eq!(
        strip_positions("bad at line 3 column 4, while parsing at line 2 column 1"),
        "bad, while parsing"
    );
    assert_eq!(strip_positions("at line x column 4"), "at line x column 4");
    assert_eq!(strip_positions("bad"), "bad");
}

#[test]
fn format_from_path() {
    assert_eq!(Format::from_path("a/b.TOML".as_ref()), Some(Format::Toml));
    assert_eq!(Format::from_path("b.yaml".as_ref()), Some(Format::Yaml));
    assert_eq!(Format::from_path("b.json".as_ref()), Some(Format::Json));
    assert_eq!(Format::from_path("b.ini".as_ref()), None);
}
