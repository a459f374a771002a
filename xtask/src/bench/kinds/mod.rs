//! The kinds of target: one proxy program each, and how the bench configures and starts it.
//!
//! A kind is a [`Kind`] in its own file, listed in [`KINDS`] (the module docs of
//! [`bench`](super) say how to add one). Every kind routes the same way: `/svc/**` with
//! `x-gray-lane: gray` to the gray upstreams, anything else to the baseline ones,
//! round-robin within the lane, `/svc` stripped.

use std::{
    ffi::OsString,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
};

use super::{Result, settings::Settings};

mod bare;
mod gateway;
mod haproxy;
mod nginx;

/// Every kind of target, in `--help` order.
pub(crate) static KINDS: &[&dyn Kind] = &[
    &nginx::Nginx::PLAIN,
    &haproxy::Haproxy,
    &gateway::Gateway::PLAIN,
    &nginx::Nginx::TLS,
    &gateway::Gateway::TLS,
    &gateway::Gateway::H2C,
    &bare::Bare::LEGACY,
    &bare::Bare::GRAY,
];

/// The kind `--targets` calls `name`.
pub(crate) fn find(name: &str) -> Option<&'static dyn Kind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// A kind of target: a proxy program, configured to do the benchmark's routing.
pub(crate) trait Kind: Sync + fmt::Debug {
    /// What `--targets` calls it.
    fn name(&self) -> &'static str;

    /// Its `--help` entry (lines after the first are indented under it).
    fn about(&self) -> &'static str;

    /// Where its program comes from.
    fn program(&self, settings: &Settings) -> Program;

    /// Writes its configuration into `setup.dir`, checks it with the program where the
    /// program can, and says how to start it.
    fn configure(&self, setup: &Setup<'_>) -> Result<Launch>;

    /// Whether it terminates TLS: it is then given a [`Tls`] listener, which wrk loads (its
    /// plaintext `listen` still serves the start-up and routing checks).
    fn tls(&self) -> bool {
        false
    }

    /// The processes whose CPU time counts, `pid` being the one the bench started.
    fn cpu_pids(&self, pid: u32) -> Vec<u32> {
        vec![pid]
    }

    /// The processes that serve the requests (whose system calls are counted).
    fn serving_pids(&self, pid: u32) -> Vec<u32> {
        vec![pid]
    }
}

/// Where a kind's program comes from.
#[derive(Debug)]
pub(crate) enum Program {
    /// A program on the PATH (or in /usr/sbin), installed from a Debian package when
    /// missing.
    System {
        command: &'static str,
        package: &'static str,
    },
    /// A binary of this workspace, built with cargo (or prebuilt, when set).
    Cargo {
        package: String,
        bin: String,
        prebuilt: Option<PathBuf>,
    },
}

/// What a kind configures a target with.
#[derive(Debug)]
pub(crate) struct Setup<'a> {
    /// The program it runs.
    pub(crate) program: &'a Path,
    /// Its own directory (mode 755: nginx's workers run as `nobody` when started as root).
    pub(crate) dir: &'a Path,
    /// Where it listens for wrk and the routing checks.
    pub(crate) listen: SocketAddr,
    /// A second port of its own (the gateway's admin listener).
    pub(crate) admin: SocketAddr,
    /// Its TLS listener, when the kind terminates TLS.
    pub(crate) tls: Option<Tls<'a>>,
    pub(crate) upstreams: &'a Upstreams,
    /// It must run as one process (callgrind follows the process it starts).
    pub(crate) one_process: bool,
    pub(crate) settings: &'a Settings,
}

/// A TLS listener: its address, and the run's certificate and key (PEM; the same for every
/// TLS target: a self-signed ECDSA P-256 certificate).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tls<'a> {
    pub(crate) listen: SocketAddr,
    pub(crate) cert: &'a Path,
    pub(crate) key: &'a Path,
}

/// How to start a configured target.
#[derive(Debug)]
pub(crate) struct Launch {
    /// The program's arguments.
    pub(crate) args: Vec<OsString>,
    /// Environment variables to set.
    pub(crate) env: Vec<(&'static str, String)>,
    /// What the log says about it (`worker_processes 1, master_process on`).
    pub(crate) describe: String,
}

/// The four upstream instances: two baseline, two gray.
#[derive(Debug)]
pub(crate) struct Upstreams {
    pub(crate) baseline: [Instance; 2],
    pub(crate) gray: [Instance; 2],
}

/// One upstream instance: its id (`x-instance`) and address.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    pub(crate) id: &'static str,
    pub(crate) addr: SocketAddr,
}

impl Upstreams {
    /// base-1, base-2, gray-1 and gray-2 on these addresses.
    pub(crate) fn new(addrs: [SocketAddr; 4]) -> Self {
        let [b1, b2, g1, g2] = addrs;
        let instance = |id, addr| Instance { id, addr };
        Upstreams {
            baseline: [instance("base-1", b1), instance("base-2", b2)],
            gray: [instance("gray-1", g1), instance("gray-2", g2)],
        }
    }

    /// All four, baseline first.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Instance> {
        self.baseline.iter().chain(&self.gray)
    }

    /// The `{base1}`, `{base2}`, `{gray1}`, `{gray2}` values of a template.
    pub(crate) fn values(&self) -> [(&'static str, String); 4] {
        let [b1, b2] = &self.baseline;
        let [g1, g2] = &self.gray;
        [
            ("base1", b1.addr.to_string()),
            ("base2", b2.addr.to_string()),
            ("gray1", g1.addr.to_string()),
            ("gray2", g2.addr.to_string()),
        ]
    }
}

/// `template` with every `{name}` replaced by its value. A `{` followed by anything but a
/// name and `}` is kept (nginx's blocks). Fails on a `{name}` without a value: a template
/// and its values that disagree are a bug here, not a file to write.
pub(crate) fn render(template: &str, values: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len > 0 && after[name_len..].starts_with('}') {
            let name = &after[..name_len];
            let Some((_, value)) = values.iter().find(|(n, _)| *n == name) else {
                return Err(format!("template placeholder `{{{name}}}` has no value"));
            };
            out.push_str(value);
            rest = &after[name_len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Writes `contents` to `path`.
pub(crate) fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs a program's configuration check (`nginx -t`, `haproxy -c`); fails with its output
/// when it rejects `config`.
pub(crate) fn check(program: &Path, args: &[OsString], config: &Path) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} rejected {} ({}):\n{}{}",
        program.display(),
        config.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_placeholders_and_keeps_blocks() {
        let values = [("listen", "127.0.0.1:80".to_owned()), ("n", "1".into())];
        let out = render("server {\n    listen {listen};\n}{n}{ x }", &values).unwrap();
        assert_eq!(out, "server {\n    listen 127.0.0.1:80;\n}1{ x }");
        let err = render("listen {port};", &values).unwrap_err();
        assert!(err.contains("`{port}`"), "{err}");
    }

    #[test]
    fn every_kind_has_a_distinct_name() {
        for (i, kind) in KINDS.iter().enumerate() {
            assert!(find(kind.name()).is_some());
            assert!(KINDS[..i].iter().all(|k| k.name() != kind.name()));
        }
    }
}
