//! Reading a callgrind dump: its total instructions, self instructions per function, and per
//! crate of the source line.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufRead, BufReader},
    path::Path,
};

use crate::bench::{Result, report::Tally};

/// What a dump says.
#[derive(Debug)]
pub(crate) struct Profile {
    /// Instructions (Ir) in all.
    pub(crate) total: u64,
    /// Every event's total, named as the dump names it (`Ir`; with `--cache-sim=yes` also
    /// `Dr`, `Dw`, `I1mr`, `D1mr`, `D1mw`, `ILmr`, `DLmr`, `DLmw`).
    pub(crate) events: Vec<(String, u64)>,
    /// Self instructions per `function [object]`.
    pub(crate) by_function: Tally,
    /// Self instructions per crate of the source line (inlined code counts where it was
    /// written); `None` when the dump has no line information.
    pub(crate) by_crate: Option<Tally>,
}

/// Reads the dump at `path`.
pub(crate) fn read(path: &Path) -> Result<Profile> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    parse(BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a dump. The cost line after `calls=` is a call's inclusive cost, not the caller's
/// own: it is skipped (callgrind_annotate 3.19 counts the calls still on the stack at a
/// `callgrind_control -d` as self cost of main and its callers).
pub(crate) fn parse(dump: impl BufRead) -> Result<Profile> {
    // Compressed names: `(3) name` defines id 3 of its kind, `(3)` uses it. `fl`, `fi`,
    // `fe`, `cfi` and `cfl` share one table.
    let mut names: HashMap<(&'static str, String), String> = HashMap::new();
    let mut named = |kind: &'static str, value: &str| -> String {
        let Some(rest) = value.strip_prefix('(') else {
            return value.to_owned();
        };
        let Some(close) = rest.find(')') else {
            return value.to_owned();
        };
        let (id, after) = (&rest[..close], &rest[close + 1..]);
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return value.to_owned();
        }
        let key = (kind, id.to_owned());
        if let Some(name) = after.strip_prefix(' ') {
            names.insert(key.clone(), name.to_owned());
        } else if !after.is_empty() {
            return value.to_owned();
        }
        names.get(&key).cloned().unwrap_or_else(|| "???".into())
    };

    let (mut by_function, mut by_crate) = (Tally::default(), Tally::default());
    let mut total = None;
    let (mut event_names, mut totals): (Vec<String>, Vec<u64>) = (Vec::new(), Vec::new());
    let (mut fl, mut fi, mut func, mut ob) = (
        "???".to_owned(),
        "???".to_owned(),
        "???".to_owned(),
        String::new(),
    );
    let (mut skip, mut lines_with_files) = (false, 0);
    for line in dump.lines() {
        let line = line.map_err(|e| format!("cannot read: {e}"))?;
        let Some(first) = line.bytes().next() else {
            continue;
        };
        if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'*') {
            if skip {
                skip = false;
                continue;
            }
            let mut fields = line.split_whitespace();
            if let (Some(_position), Some(cost)) = (fields.next(), fields.next()) {
                let cost: u64 = cost
                    .parse()
                    .map_err(|_| format!("`{line}`: the cost is not a count"))?;
                by_function.add(&format!("{func} [{}]", basename(&ob)), cost);
                by_crate.add(&crate_of(&fi, &ob), cost);
            }
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((&line, ""));
        match key {
            "ob" => ob = named("ob", value),
            "fl" => {
                fl = named("fl", value);
                fi = fl.clone();
                lines_with_files += usize::from(fl.starts_with('/'));
            }
            "fi" | "fe" => fi = named("fl", value),
            "fn" => {
                fi = fl.clone();
                func = named("fn", value);
            }
            "cfi" | "cfl" => {
                named("fl", value);
            }
            "cob" => {
                named("ob", value);
            }
            "cfn" => {
                named("fn", value);
            }
            "calls" => skip = true,
            _ if line.starts_with("events:") => {
                event_names = line.split_whitespace().skip(1).map(str::to_owned).collect();
            }
            _ if line.starts_with("summary:") || line.starts_with("totals:") => {
                totals = line
                    .split_whitespace()
                    .skip(1)
                    .map_while(|n| n.parse().ok())
                    .collect();
                total = totals.first().copied();
            }
            _ => {}
        }
    }
    let counted = by_function.total();
    match total {
        Some(total) if counted.abs_diff(total) <= total / 1000 => Ok(Profile {
            total,
            events: event_names.into_iter().zip(totals).collect(),
            by_function,
            by_crate: (lines_with_files > 0).then_some(by_crate),
        }),
        _ => Err(format!(
            "self costs add up to {counted}, the dump's total is {}",
            total.map_or("missing".into(), |t: u64| t.to_string())
        )),
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The crate a source file belongs to: `tokio` for a registry path, `rust std` for the
/// standard library, `gray-gateway` for this workspace's crates; for code without line
/// information, its object.
pub(crate) fn crate_of(file: &str, object: &str) -> String {
    if let Some(name) = after_marker(file, "/registry/src/", 1).and_then(versioned) {
        return name.to_owned();
    }
    if let Some(name) = after_marker(file, "/git/checkouts/", 0).and_then(hashed) {
        return name.to_owned();
    }
    if let Some(rest) = file.find("/rustc/").map(|at| &file[at + "/rustc/".len()..])
        && let Some((hash, rest)) = rest.split_once('/')
    {
        let library = rest
            .strip_prefix("library/")
            .and_then(|r| r.split_once('/'));
        if let (true, Some((name, _))) = (is_hex(hash), library)
            && !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return format!("rust {name}");
        }
    }
    if let Some(name) = after_marker(file, "/rust/deps/", 0).and_then(versioned) {
        return format!("rust {name}");
    }
    for parent in ["/crates/", "/examples/", "/xtask/"] {
        if let Some(name) = after_marker(file, parent, 0) {
            let name_ok = name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            let component_end = file.find(parent).map(|at| at + parent.len() + name.len());
            if name_ok && component_end.is_some_and(|end| file[end..].starts_with("/src/")) {
                return name.to_owned();
            }
        }
    }
    if !file.starts_with('/') {
        let object = basename(object);
        let object = if object.is_empty() { "???" } else { object };
        return format!("(no line info: {object})");
    }
    file.to_owned()
}

/// The path component `skip` components after the first `marker` in `file` (that
/// component must be followed by `/`).
fn after_marker<'a>(file: &'a str, marker: &str, skip: usize) -> Option<&'a str> {
    let rest = &file[file.find(marker)? + marker.len()..];
    let mut parts = rest.split('/');
    let component = parts.nth(skip)?;
    parts.next()?;
    Some(component)
}

/// `hyper-util-0.1.21` → `hyper-util`: the name before the first `-X.Y.Z`.
fn versioned(component: &str) -> Option<&str> {
    for (at, _) in component.match_indices('-') {
        let version: Vec<&str> = component[at + 1..].splitn(3, '.').collect();
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let third = version
            .get(2)
            .map(|v| v.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""));
        if at > 0
            && version.len() == 3
            && digits(version[0])
            && digits(version[1])
            && third.is_some_and(digits)
        {
            return Some(&component[..at]);
        }
    }
    None
}

/// `tokio-0a1b2c3d` → `tokio`: the name before the first `-` followed only by hex digits.
fn hashed(component: &str) -> Option<&str> {
    component
        .match_indices('-')
        .find(|(at, _)| *at > 0 && is_hex(&component[at + 1..]))
        .map(|(at, _)| &component[..at])
}

fn is_hex(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crates_are_named_by_where_their_source_lives() {
        for (file, expected) in [
            (
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/hyper-util-0.1.21/src/rt/tokio.rs",
                "hyper-util",
            ),
            (
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-1.54.1/src/net/tcp.rs",
                "tokio",
            ),
            (
                "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/h2-0.4.12-rc.1/src/lib.rs",
                "h2",
            ),
            (
                "/root/.cargo/git/checkouts/tower-0a1b2c3d4e5f6789/abc1234/tower/src/lib.rs",
                "tower",
            ),
            (
                "/rustc/17067e9ac6d7e98f18d4a5ae8ba3d5c7ad1e5b5b/library/core/src/ptr/mod.rs",
                "rust core",
            ),
            (
                "/rust/deps/hashbrown-0.15.2/src/raw/mod.rs",
                "rust hashbrown",
            ),
            (
                "/work/wt/bench/crates/gray-gateway/src/proxy.rs",
                "gray-gateway",
            ),
            (
                "/work/wt/bench/xtask/bench-support/src/bin/bare-proxy.rs",
                "bench-support",
            ),
            (
                "/work/old/examples/bench-support/src/bin/bare-proxy.rs",
                "bench-support",
            ),
            (
                "/usr/include/x86_64-linux-gnu/bits/string_fortified.h",
                "/usr/include/x86_64-linux-gnu/bits/string_fortified.h",
            ),
        ] {
            assert_eq!(crate_of(file, "/usr/lib/libc.so.6"), expected, "{file}");
        }
        assert_eq!(
            crate_of("???", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "(no line info: libc.so.6)"
        );
        assert_eq!(crate_of("???", ""), "(no line info: ???)");
    }

    /// A dump in callgrind's compressed format: a function calling another (the call's
    /// inclusive cost is not self cost), an inlined file, and a summary.
    const DUMP: &str = "\
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  /t/gray-gateway --config /tmp/g.toml
part: 1

desc: I1 cache: 
positions: line
events: Ir
summary: 1000

ob=(1) /t/gray-gateway
fl=(1) /work/crates/gray-gateway/src/proxy.rs
fn=(1) gray_gateway::proxy::Proxy::call
10 300
fi=(2) /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/hyper-1.12.0/src/proto/h1/role.rs
+2 200
fe=(1)
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfi=(3) ???
cfn=(2) memcpy
calls=4 0
+1 450
* 50

ob=(2)
fl=(3)
fn=(2)
0 450

totals: 1000
";

    #[test]
    fn self_costs_by_function_and_crate() {
        let profile = parse(DUMP.as_bytes()).unwrap();
        assert_eq!(profile.total, 1000);
        assert_eq!(
            profile.by_function.most_common(5),
            [
                ("gray_gateway::proxy::Proxy::call [gray-gateway]", 550),
                ("memcpy [libc.so.6]", 450)
            ]
        );
        let by_crate = profile.by_crate.unwrap();
        assert_eq!(by_crate.get("gray-gateway"), 350);
        assert_eq!(by_crate.get("hyper"), 200);
        assert_eq!(by_crate.get("(no line info: libc.so.6)"), 450);
        assert_eq!(profile.events, [("Ir".to_owned(), 1000)]);
    }

    #[test]
    fn cache_simulation_totals_every_event_and_ir_stays_first() {
        // `--cache-sim=yes`: more columns; a line may leave its trailing zeros out.
        let dump = DUMP
            .replace(
                "events: Ir",
                "events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw",
            )
            .replace("10 300", "10 300 90 40 7 5 3")
            .replace("totals: 1000", "totals: 1000 120 60 9 8 4 1 0 2");
        let profile = parse(dump.as_bytes()).unwrap();
        assert_eq!(profile.total, 1000);
        let event = |name: &str| {
            profile
                .events
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
        };
        assert_eq!(
            (event("Ir"), event("D1mr"), event("DLmw"), event("I1mr")),
            (Some(1000), Some(8), Some(2), Some(9))
        );
        assert_eq!(
            profile
                .by_function
                .get("gray_gateway::proxy::Proxy::call [gray-gateway]"),
            550
        );
    }

    #[test]
    fn a_dump_whose_costs_do_not_add_up_is_refused() {
        let err = parse(
            DUMP.replace("summary: 1000", "")
                .replace("totals: 1000", "totals: 5000")
                .as_bytes(),
        )
        .unwrap_err();
        assert!(
            err.contains("add up to 1000, the dump's total is 5000"),
            "{err}"
        );
        let err = parse(
            DUMP.replace("summary: 1000", "")
                .replace("totals: 1000", "")
                .as_bytes(),
        )
        .unwrap_err();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn a_dump_without_line_information_has_no_crates() {
        let dump = DUMP
            .replace("/work/crates/gray-gateway/src/proxy.rs", "???")
            .replace("fi=(2) /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/hyper-1.12.0/src/proto/h1/role.rs", "fi=(2) ???");
        let profile = parse(dump.as_bytes()).unwrap();
        assert!(profile.by_crate.is_none());
        assert_eq!(profile.by_function.total(), 1000);
    }
}
