//! ARCHITECTURE.md's table of the library crates' dependencies on each other is what
//! `cargo metadata` says, the README's crate table lists every crate under `crates/`, the
//! rules engine's dependencies stay where the table puts them, and no source file of a
//! library crate grows past 600 lines of code (its tests apart).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

/// `crate → (normal dependencies, optional ones)` among the `gray-*` crates, from
/// `cargo metadata`.
type Edges = BTreeMap<String, (Vec<String>, Vec<String>)>;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
}

/// `cargo metadata` of the workspace, without its dependencies.
fn metadata() -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Whether a package of `cargo metadata` has a library target.
fn is_library(package: &serde_json::Value) -> bool {
    package["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| {
            t["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k == "lib")
        })
}

fn cargo_metadata() -> Edges {
    let meta = metadata();
    let mut edges = Edges::new();
    for package in meta["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().unwrap_or_default();
        let published = !package["publish"].is_array();
        if !name.starts_with("gray-") || !is_library(package) || !published {
            continue;
        }
        let (mut normal, mut optional) = (Vec::new(), Vec::new());
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            if !dep_name.starts_with("gray-") || !dep["kind"].is_null() {
                continue;
            }
            if dep["optional"].as_bool() == Some(true) {
                optional.push(dep_name.to_owned());
            } else {
                normal.push(dep_name.to_owned());
            }
        }
        normal.sort();
        optional.sort();
        edges.insert(name.to_owned(), (normal, optional));
    }
    edges
}

/// The table under "Dependencies point down only": `| `crate` | deps |`, the optional ones
/// after `; ` and before ` behind`.
fn documented() -> Edges {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("readable");
    let table = text
        .split("| crate | depends on |")
        .nth(1)
        .expect("the dependency table");
    let mut edges = Edges::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_owned();
        let list = |s: &str| -> Vec<String> {
            let mut v: Vec<String> = s
                .split(',')
                .map(|d| d.trim().to_owned())
                .filter(|d| d.starts_with("gray-"))
                .collect();
            v.sort();
            v
        };
        let (normal, optional) = match cells[2].split_once("; ") {
            Some((normal, rest)) => (
                list(normal),
                list(rest.split(" behind").next().unwrap_or("")),
            ),
            None => (list(cells[2]), Vec::new()),
        };
        let optional = optional
            .into_iter()
            .flat_map(|d| d.split(" and ").map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>();
        let mut optional = optional;
        optional.sort();
        edges.insert(name, (normal, optional));
    }
    edges
}

#[test]
fn the_dependency_table_is_what_cargo_metadata_says() {
    let actual = cargo_metadata();
    let documented = documented();
    assert_eq!(
        documented, actual,
        "ARCHITECTURE.md's dependency table (left) differs from cargo metadata (right)"
    );
}

/// Every library crate whose manifest is in `crates/` (published or not), by name.
fn crates_folder() -> BTreeSet<String> {
    let crates = workspace().join("crates");
    metadata()["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| {
            p["manifest_path"]
                .as_str()
                .is_some_and(|m| Path::new(m).starts_with(&crates))
                && is_library(p)
        })
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// The crates the README's "Crates" table names, one a row: ``| [`name`](crates/name) | … |``.
fn readme_crates() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace().join("README.md")).expect("readable");
    let table = text
        .split("| crate | what it owns |")
        .nth(1)
        .expect("the README's crate table");
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cell = row.split('|').nth(1).unwrap_or_default().trim();
            let name = cell
                .trim_start_matches("[`")
                .split('`')
                .next()
                .unwrap_or_default();
            assert!(
                cell.ends_with(&format!("(crates/{name})")),
                "README.md: the row of `{name}` links elsewhere than crates/{name}: {cell}"
            );
            name.to_owned()
        })
        .collect()
}

#[test]
fn the_readme_lists_every_crate() {
    assert_eq!(
        readme_crates(),
        crates_folder(),
        "README.md's crate table (left) differs from the library crates under crates/ (right)"
    );
}

#[test]
fn only_gray_rules_compiles_the_rules_engine() {
    for package in [
        "gray-core",
        "gray-source",
        "gray-balance",
        "gray-policy",
        "gray-discovery",
    ] {
        let out = Command::new(env!("CARGO"))
            .args([
                "tree",
                "-e",
                "normal",
                "--prefix",
                "none",
                "--offline",
                "-p",
                package,
            ])
            .current_dir(workspace())
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tree = String::from_utf8_lossy(&out.stdout);
        for heavy in ["regex ", "ipnet "] {
            assert!(
                !tree.lines().any(|l| l.starts_with(heavy)),
                "{package} depends on {heavy}:\n{tree}"
            );
        }
    }
}

/// The most lines a library crate's source file may have before its tests: one concern
/// per file (a file past it is a module folder waiting to happen).
const MAX_LINES: usize = 600;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("readable").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_library_source_file_is_over_600_lines_before_its_tests() {
    let mut files = Vec::new();
    for krate in crates_folder() {
        sources(
            &workspace().join("crates").join(&krate).join("src"),
            &mut files,
        );
    }
    assert!(files.len() > 100, "the crates' sources: {files:?}");
    let mut over = Vec::new();
    for file in files {
        // A module of tests only (`mod tests;` in its own file) is all tests.
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable");
        let code = text
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
            .count();
        if code > MAX_LINES {
            over.push(format!(
                "{} ({code} lines before its tests)",
                file.strip_prefix(workspace()).unwrap_or(&file).display()
            ));
        }
    }
    assert!(
        over.is_empty(),
        "one concern per file: split these into a module folder (at most {MAX_LINES} lines \
         each before the tests):\n{}",
        over.join("\n")
    );
}
