//! The programs a run needs (found on the PATH or in /usr/sbin, installed from Debian
//! packages when missing) and the cargo builds of the Rust targets.

use std::{
    collections::HashMap,
    ffi::OsString,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use super::{Result, kinds::Program, options::Options, step};

/// A program and the Debian package it comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tool {
    pub(crate) command: &'static str,
    pub(crate) package: &'static str,
}

/// The programs found, by command name.
#[derive(Debug)]
pub(crate) struct Tools {
    found: HashMap<&'static str, PathBuf>,
}

impl Tools {
    /// Where `command` is; it was found by [`prepare`].
    pub(crate) fn path(&self, command: &str) -> Result<&Path> {
        self.found
            .get(command)
            .map(PathBuf::as_path)
            .ok_or_else(|| format!("{command} was not looked for (a bug in the bench)"))
    }
}

/// What the build produced: the upstream, and each target's program (in target order).
#[derive(Debug)]
pub(crate) struct Builds {
    pub(crate) upstream: PathBuf,
    pub(crate) programs: Vec<PathBuf>,
}

/// `command` on the PATH, or in /usr/sbin (not on a user's PATH on Debian).
pub(crate) fn find(command: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join(command))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds every program the targets and the mode need, installing the missing ones.
pub(crate) fn prepare(options: &Options) -> Result<Tools> {
    for command in ["taskset", "kill", "getconf"] {
        if find(command).is_none() {
            return Err(format!("{command} is required"));
        }
    }
    let mut needed = vec![Tool {
        command: "wrk",
        package: "wrk",
    }];
    for target in &options.targets {
        if let Program::System { command, package } = target.kind.program(&options.settings) {
            needed.push(Tool { command, package });
        }
    }
    needed.extend(options.mode.tools());
    let mut packages: Vec<&'static str> = Vec::new();
    for tool in needed.iter().filter(|t| find(t.command).is_none()) {
        if !packages.contains(&tool.package) {
            packages.push(tool.package);
        }
    }
    if !packages.is_empty() {
        step(&format!("installing {}", packages.join(" ")));
        apt_install(&packages)?;
    }
    let mut found = HashMap::new();
    for tool in needed {
        let path = find(tool.command).ok_or_else(|| {
            format!(
                "{} is missing (Debian package {})",
                tool.command, tool.package
            )
        })?;
        found.insert(tool.command, path);
    }
    Ok(Tools { found })
}

fn apt_install(packages: &[&'static str]) -> Result<()> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let command = |args: &[&'static str]| -> Vec<&'static str> {
        let mut argv = Vec::new();
        if !root {
            argv.push("sudo");
        }
        argv.extend(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        argv.extend(args);
        argv
    };
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages);
    for argv in [command(&["update", "-qq"]), command(&install)] {
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .status()
            .map_err(|e| format!("cannot run {}: {e}", argv.join(" ")))?;
        if !status.success() {
            return Err(format!("`{}` failed ({status})", argv.join(" ")));
        }
    }
    Ok(())
}

/// The workspace's root: the xtask's parent directory.
pub(crate) fn workspace_root() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest)
}

fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Builds `bench-support` with `PROFILE` and with every profile a target names, with the
/// cargo packages of the targets built with it; then finds each target's program.
pub(crate) fn build(options: &Options, tools: &Tools) -> Result<Builds> {
    let root = workspace_root();
    let target_dir = target_dir(root)?;
    let mut profiles = vec![options.settings.profile.as_str()];
    for profile in options.targets.iter().filter_map(|t| t.build.as_deref()) {
        if !profiles.contains(&profile) {
            profiles.push(profile);
        }
    }
    for profile in &profiles {
        let mut packages = vec!["bench-support".to_owned()];
        for target in &options.targets {
            let program = target.kind.program(&options.settings);
            if let (Some(build), Program::Cargo { package, .. }) = (&target.build, program)
                && build == profile
                && !packages.contains(&package)
            {
                packages.push(package);
            }
        }
        let mut args = vec!["build".to_owned(), "--profile".into(), profile.to_string()];
        for package in &packages {
            args.extend(["-p".into(), package.clone()]);
        }
        step(&format!("cargo {}", args.join(" ")));
        let started = Instant::now();
        let status = Command::new(cargo())
            .args(&args)
            .current_dir(root)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!("`cargo {}` failed ({status})", args.join(" ")));
        }
        println!("built in {} s", started.elapsed().as_secs());
    }

    let upstream = bin_dir(&target_dir, &options.settings.profile).join("upstream");
    let mut programs = Vec::new();
    for target in &options.targets {
        let program = match (target.kind.program(&options.settings), &target.prebuilt) {
            (Program::System { command, .. }, _) => tools.path(command)?.to_owned(),
            (Program::Cargo { .. }, Some(prebuilt)) => prebuilt.clone(),
            (Program::Cargo { bin, .. }, None) => {
                let profile = target.build.as_deref().unwrap_or(&options.settings.profile);
                bin_dir(&target_dir, profile).join(bin)
            }
        };
        if !is_executable(&program) {
            return Err(format!(
                "target `{}`: no executable {}",
                target.label,
                program.display()
            ));
        }
        programs.push(program);
    }
    Ok(Builds { upstream, programs })
}

/// The directory cargo puts `profile`'s binaries in.
fn bin_dir(target_dir: &Path, profile: &str) -> PathBuf {
    target_dir.join(match profile {
        "dev" | "test" => "debug",
        "bench" => "release",
        other => other,
    })
}

/// Cargo's target directory (`cargo metadata`, so that `CARGO_TARGET_DIR` and
/// `build.target-dir` count).
fn target_dir(root: &Path) -> Result<PathBuf> {
    let output = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    json_string(&String::from_utf8_lossy(&output.stdout), "target_directory")
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata printed no target_directory".into())
}

/// The string value of the first `"key":` in a JSON text (cargo metadata prints compact
/// JSON; only `\"` and `\\` occur in a path's escapes on Unix).
fn json_string(json: &str, key: &str) -> Option<String> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = json[at..].trim_start().strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_target_directory_from_cargo_metadata() {
        let json = r#"{"packages":[],"target_directory":"/work/a \"b\"\\c/target","version":1}"#;
        assert_eq!(
            json_string(json, "target_directory").as_deref(),
            Some(r#"/work/a "b"\c/target"#)
        );
        assert_eq!(json_string(json, "workspace_root"), None);
        let dir = target_dir(workspace_root()).unwrap();
        assert!(dir.is_absolute(), "{}", dir.display());
    }

    #[test]
    fn profiles_map_to_cargo_directories() {
        let t = Path::new("/t");
        assert_eq!(bin_dir(t, "dev"), Path::new("/t/debug"));
        assert_eq!(bin_dir(t, "bench"), Path::new("/t/release"));
        assert_eq!(bin_dir(t, "dist"), Path::new("/t/dist"));
    }

    #[test]
    fn finds_programs_on_the_path() {
        assert!(find("sh").is_some());
        assert!(find("no-such-program-for-the-bench").is_none());
    }
}
