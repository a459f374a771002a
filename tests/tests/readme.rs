//! The Rust snippets of the README and of the guides in `docs/` are compiled code: every
//! `rust` block that is not `ignore`d follows a `<!-- snippet: path -->` line naming the
//! program it is cut from (an example, which the test command runs), and stands there
//! verbatim, indented as a whole or not. Every relative link of those pages resolves to a
//! file of the workspace, and the README's index links every guide of `docs/`.

use std::path::Path;

/// A Rust block of the README: where it starts, the file it names, and its lines.
#[derive(Debug)]
struct Snippet {
    line: usize,
    source: Option<String>,
    lines: Vec<String>,
}

fn snippets(readme: &str) -> Vec<Snippet> {
    let mut snippets = Vec::new();
    let mut source = None;
    let mut lines = readme.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if let Some(path) = line
            .trim()
            .strip_prefix("<!-- snippet:")
            .and_then(|rest| rest.strip_suffix("-->"))
        {
            source = Some(path.trim().to_owned());
            continue;
        }
        let Some(info) = line.trim_start().strip_prefix("```") else {
            if !line.trim().is_empty() {
                source = None;
            }
            continue;
        };
        let block: Vec<String> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| !l.trim_start().starts_with("```"))
            .map(str::to_owned)
            .collect();
        let rust = info.split(',').next() == Some("rust");
        if rust && !info.split(',').any(|tag| tag == "ignore") {
            snippets.push(Snippet {
                line: n + 1,
                source: source.take(),
                lines: block,
            });
        }
        source = None;
    }
    snippets
}

/// `true` when `lines` stand in `file` one after another, each with the same indentation
/// added (blank lines match blank lines).
fn stands_in(file: &str, lines: &[String]) -> bool {
    let file: Vec<&str> = file.lines().collect();
    let Some(first) = lines.iter().find(|l| !l.trim().is_empty()) else {
        return false;
    };
    (0..file.len()).any(|start| {
        let offset = lines.iter().position(|l| l == first).unwrap_or(0);
        let Some(anchor) = file.get(start + offset) else {
            return false;
        };
        let Some(indent) = anchor.strip_suffix(first.as_str()) else {
            return false;
        };
        lines
            .iter()
            .enumerate()
            .all(|(i, line)| match file.get(start + i) {
                Some(got) if line.trim().is_empty() => got.trim().is_empty(),
                Some(got) => got.strip_prefix(indent) == Some(line.as_str()),
                None => false,
            })
    })
}

/// The workspace's root.
fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The README and every guide of `docs/`: their paths from the root, and their text.
fn pages() -> Vec<(String, String)> {
    let root = root();
    let mut pages = vec!["README.md".to_owned()];
    let mut guides: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.ends_with(".md").then(|| format!("docs/{name}"))
        })
        .collect();
    assert!(!guides.is_empty(), "docs/ holds the guides");
    guides.sort();
    pages.extend(guides);
    pages
        .into_iter()
        .map(|page| {
            let text =
                std::fs::read_to_string(root.join(&page)).unwrap_or_else(|e| panic!("{page}: {e}"));
            (page, text)
        })
        .collect()
}

#[test]
fn every_rust_snippet_is_cut_from_a_program_that_runs() {
    let root = root();
    for (page, text) in pages() {
        for snippet in snippets(&text) {
            let Some(source) = &snippet.source else {
                panic!(
                    "{page}:{}: a `rust` block without `<!-- snippet: path -->` before it",
                    snippet.line
                );
            };
            let file = std::fs::read_to_string(root.join(source))
                .unwrap_or_else(|e| panic!("{page}:{}: {source}: {e}", snippet.line));
            assert!(
                stands_in(&file, &snippet.lines),
                "{page}:{}: the snippet is not in {source} as it is:\n{}",
                snippet.line,
                snippet.lines.join("\n")
            );
        }
    }
}

/// The targets of the relative links of `text` (`[text](target)`), their `#anchor` cut.
fn relative_links(text: &str) -> Vec<&str> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.contains("://") && !target.starts_with('#'))
        .map(|target| target.split('#').next().unwrap_or(target))
        .filter(|target| !target.is_empty() && !target.contains(' '))
        .collect()
}

#[test]
fn every_relative_link_resolves() {
    let root = root();
    for (page, text) in pages() {
        let folder = Path::new(&page).parent().unwrap_or(Path::new(""));
        for target in relative_links(&text) {
            assert!(
                root.join(folder).join(target).exists(),
                "{page}: the link to {target} leads nowhere"
            );
        }
    }
}

#[test]
fn the_readme_links_every_guide() {
    let pages = pages();
    let (_, readme) = &pages[0];
    let linked = relative_links(readme);
    for (page, _) in &pages[1..] {
        assert!(
            linked.contains(&page.as_str()),
            "README.md: {page} is missing from the index of the guides"
        );
    }
}

#[test]
fn the_readme_is_read_in_ten_minutes() {
    let lines = std::fs::read_to_string(root().join("README.md"))
        .expect("README.md")
        .lines()
        .count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: guides go to docs/"
    );
}

#[test]
fn the_check_finds_snippets_and_drift() {
    let program = "fn main() {\n    let a = 1;\n\n    let b = a;\n}\n";
    let readme = "text\n<!-- snippet: x.rs -->\n```rust\nlet a = 1;\n\nlet b = a;\n```\n\n\
                  ```rust,ignore\nanything\n```\n```rust\nunmarked\n```\n";
    let found = snippets(readme);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].source.as_deref(), Some("x.rs"));
    assert!(stands_in(program, &found[0].lines));
    assert_eq!(found[1].source, None);
    let drifted = ["let a = 2;".to_owned()];
    assert!(!stands_in(program, &drifted));
    let reindented = ["let a = 1;".to_owned(), "  let b = a;".to_owned()];
    assert!(!stands_in(program, &reindented));
    let links = "[a](docs/a.md) [b](https://x.io/b) [c](#c) [d](../d.rs#L1) `[e](f g)`";
    assert_eq!(relative_links(links), ["docs/a.md", "../d.rs"]);
}
