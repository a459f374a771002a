//! The command line: which targets, which mode, and the [`settings`] (each also an
//! environment variable).

use std::{fmt::Write as _, path::PathBuf};

use super::{
    Result,
    kinds::{self, Kind, Program},
    modes::{self, Mode},
    settings::{self, Settings, is_name},
};

/// The targets run when `--targets` is not given, in this order.
const DEFAULT_TARGETS: &str = "nginx,haproxy,gateway,bare";

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Command {
    Help,
    Run(Box<Options>),
}

/// A run's targets, mode and settings.
#[derive(Debug)]
pub(crate) struct Options {
    /// In the order they run.
    pub(crate) targets: Vec<TargetSpec>,
    pub(crate) mode: &'static dyn Mode,
    /// Keep the temp directory even when the run succeeds.
    pub(crate) keep: bool,
    pub(crate) settings: Settings,
}

/// One target as `--targets` names it: `KIND`, `KIND@PROFILE` or `KIND#LABEL`.
#[derive(Debug)]
pub(crate) struct TargetSpec {
    /// As written in `--targets`: what the tables call it.
    pub(crate) label: String,
    pub(crate) kind: &'static dyn Kind,
    /// The cargo profile it is built with (Rust targets without a prebuilt binary).
    pub(crate) build: Option<String>,
    /// The binary it runs without a build (`#LABEL`'s `BIN_<LABEL>`, or `GATEWAY_BIN`).
    pub(crate) prebuilt: Option<PathBuf>,
}

// === impl Options ===

impl Options {
    /// The reference targets present in this run, in `REFS` order.
    pub(crate) fn refs(&self) -> Vec<&str> {
        let refs = self.settings.refs.iter().map(String::as_str);
        refs.filter(|r| self.targets.iter().any(|t| t.label == *r))
            .collect()
    }
}

/// Parses the arguments after `bench-gateway`; `env` reads an environment variable.
pub(crate) fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Command> {
    let mut targets = DEFAULT_TARGETS.to_owned();
    let mut mode: Option<&'static dyn Mode> = None;
    let mut keep = false;
    let mut flags: Vec<(&'static str, String)> = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || match &inline {
            Some(value) => Ok(value.clone()),
            None => args
                .next()
                .cloned()
                .ok_or_else(|| format!("`{flag}` expects a value")),
        };
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--targets" => targets = value()?,
            "--keep" => keep = true,
            _ => {
                if let Some(chosen) = modes::MODES.iter().find(|m| m.flag() == Some(flag)) {
                    if let Some(previous) = mode.and_then(|m| m.flag()) {
                        return Err(format!("`{previous}` and `{flag}` exclude each other"));
                    }
                    mode = Some(*chosen);
                } else if let Some(name) = settings::named_by(flag) {
                    flags.push((name, value()?));
                } else {
                    return Err(format!("unknown argument `{arg}`"));
                }
            }
        }
    }
    let settings = Settings::read(&flags, env)?;
    let targets = parse_targets(&targets, &settings, env)?;
    let mode = mode.unwrap_or(modes::MODES[0]);
    Ok(Command::Run(Box::new(Options {
        targets,
        mode,
        keep,
        settings,
    })))
}

fn parse_targets(
    list: &str,
    settings: &Settings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<TargetSpec>> {
    let mut targets: Vec<TargetSpec> = Vec::new();
    for label in list.split(',').filter(|t| !t.is_empty()) {
        if targets.iter().any(|t| t.label == label) {
            return Err(format!("target `{label}` is named twice"));
        }
        let (name, suffix) = match label.find(['@', '#']) {
            Some(at) => (&label[..at], Some((label.as_bytes()[at], &label[at + 1..]))),
            None => (label, None),
        };
        let Some(kind) = kinds::find(name) else {
            let names: Vec<_> = kinds::KINDS.iter().map(|k| k.name()).collect();
            return Err(format!(
                "unknown target `{label}` ({}; Rust ones may end in @PROFILE or #LABEL)",
                names.join(", ")
            ));
        };
        let (cargo, own_prebuilt) = match kind.program(settings) {
            Program::Cargo { prebuilt, .. } => (true, prebuilt),
            Program::System { .. } => (false, None),
        };
        if !cargo && suffix.is_some() {
            return Err(format!(
                "target `{label}`: only Rust targets take a @PROFILE or a #LABEL"
            ));
        }
        let (build, prebuilt) = match suffix {
            Some((b'#', tag)) => {
                if !is_name(tag, "_") {
                    return Err(format!(
                        "target `{label}`: `{tag}` is not a label (a-z, 0-9, _)"
                    ));
                }
                let var = format!("BIN_{}", tag.to_ascii_uppercase());
                match env(&var) {
                    Some(bin) if !bin.is_empty() => (None, Some(PathBuf::from(bin))),
                    _ => return Err(format!("target `{label}`: set {var} to the binary it runs")),
                }
            }
            Some((_, profile)) => {
                if !is_name(profile, "_-") {
                    return Err(format!(
                        "target `{label}`: `{profile}` is not a cargo profile name"
                    ));
                }
                (Some(profile.to_owned()), None)
            }
            None if !cargo => (None, None),
            None => match own_prebuilt {
                Some(bin) => (None, Some(bin)),
                None => (Some(settings.profile.clone()), None),
            },
        };
        targets.push(TargetSpec {
            label: label.to_owned(),
            kind,
            build,
            prebuilt,
        });
    }
    if targets.is_empty() {
        return Err("--targets is empty".into());
    }
    Ok(targets)
}

/// `--help`: the targets and modes from their registries, and every setting.
pub(crate) fn help() -> String {
    let mut out = String::from(
        "What the gray gateway costs per request, side by side with nginx, HAProxy and a minimal\n\
         hyper proxy doing the same header routing.\n\n\
         usage: cargo xtask bench-gateway [--targets LIST] [--instructions | --syscalls] [--keep] [SETTINGS]\n",
    );
    let _ = writeln!(
        out,
        "\nTargets (--targets, comma-separated, in the order they run; default {DEFAULT_TARGETS}):"
    );
    for kind in kinds::KINDS {
        push_entry(&mut out, kind.name(), kind.about(), 12);
    }
    out.push_str(
        "A Rust target may name a cargo profile, `gateway@release`, to compare builds in one\n\
         interleaved run (`--targets nginx,gateway,gateway@release`); without one it is built with\n\
         PROFILE. `KIND#LABEL` runs a prebuilt binary of that kind, named by the environment\n\
         variable BIN_<LABEL> (upper case), to compare two versions of the code in one run:\n\
         `BIN_BEFORE=/tmp/gray-gateway.before cargo xtask bench-gateway --targets gateway#before,gateway,bare`.\n\
         \nModes:\n",
    );
    for mode in modes::MODES {
        push_entry(
            &mut out,
            mode.flag().unwrap_or("(default)"),
            mode.about(),
            16,
        );
    }
    push_entry(
        &mut out,
        "--keep",
        "keep the temp directory (configurations, logs, callgrind dumps, perf output;\n\
         it is kept anyway on failure)",
        16,
    );
    settings::push_help(&mut out);
    out
}

/// `  name      about`, the about's further lines aligned under its first.
fn push_entry(out: &mut String, name: &str, about: &str, width: usize) {
    let mut lines = about.lines();
    let first = lines.next().unwrap_or("");
    if name.chars().count() > width {
        let _ = writeln!(out, "  {name}\n  {:width$}  {first}", "");
    } else {
        let _ = writeln!(out, "  {name:width$}  {first}");
    }
    for line in lines {
        let _ = writeln!(out, "  {:width$}  {}", "", line.trim_start());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Options> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        match parse(&args, &env)? {
            Command::Run(options) => Ok(*options),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_are_the_four_targets_in_cpu_mode() {
        let options = run(&[], &[]).unwrap();
        let labels: Vec<_> = options.targets.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["nginx", "haproxy", "gateway", "bare"]);
        assert_eq!(options.mode.flag(), None);
        assert_eq!(options.refs(), ["nginx", "bare"]);
        let s = &options.settings;
        assert_eq!(
            (s.rounds, s.duration, s.warmup, s.connections),
            (5, 5, 2, 64)
        );
        assert_eq!(s.profile, "dist");
        let gateway = &options.targets[2];
        assert_eq!(gateway.build.as_deref(), Some("dist"));
        assert_eq!(options.targets[0].build, None);
    }

    #[test]
    fn flags_and_environment_set_the_same_settings_the_flag_winning() {
        let options = run(
            &["--rounds", "3", "--duration=4"],
            &[("ROUNDS", "7"), ("WARMUP", "0")],
        );
        let s = options.unwrap().settings;
        assert_eq!((s.rounds, s.duration, s.warmup), (3, 4, 0));
        let s = run(&[], &[("ROUNDS", "3"), ("DURATION", "")])
            .unwrap()
            .settings;
        assert_eq!((s.rounds, s.duration), (3, 5), "an empty variable is unset");
        let s = run(&["--ins-top", "4", "--profile", "profiling"], &[])
            .unwrap()
            .settings;
        assert_eq!((s.ins_top, s.profile.as_str()), (4, "profiling"));
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let err = run(&["--rounds", "0"], &[]).unwrap_err();
        assert!(err.contains("ROUNDS must be at least 1"), "{err}");
        let err = run(&[], &[("CONNECTIONS", "-3")]).unwrap_err();
        assert!(
            err.contains("CONNECTIONS must be a non-negative integer"),
            "{err}"
        );
        let err = run(&[], &[("PROFILE", "Dist")]).unwrap_err();
        assert!(err.contains("PROFILE"), "{err}");
        let err = run(&["--rounds"], &[]).unwrap_err();
        assert!(err.contains("`--rounds` expects a value"), "{err}");
        let err = run(&["--round", "3"], &[]).unwrap_err();
        assert!(err.contains("unknown argument `--round`"), "{err}");
    }

    #[test]
    fn modes_exclude_each_other() {
        let options = run(&["--instructions"], &[]).unwrap();
        assert_eq!(options.mode.flag(), Some("--instructions"));
        let err = run(&["--instructions", "--syscalls"], &[]).unwrap_err();
        assert!(err.contains("exclude each other"), "{err}");
    }

    #[test]
    fn profiles_and_labels_pick_the_binary() {
        let options = run(
            &[
                "--targets",
                "gateway#before,gateway,gateway@release,bare-gray",
            ],
            &[("BIN_BEFORE", "/tmp/gw.before"), ("PROFILE", "profiling")],
        )
        .unwrap();
        let t = &options.targets;
        assert_eq!(t[0].prebuilt.as_deref(), Some("/tmp/gw.before".as_ref()));
        assert_eq!(t[0].build, None);
        assert_eq!(t[1].build.as_deref(), Some("profiling"));
        assert_eq!(t[2].build.as_deref(), Some("release"));
        assert_eq!(t[3].kind.name(), "bare-gray");
        assert_eq!(options.refs(), Vec::<&str>::new());

        // GATEWAY_BIN replaces the build of the plain `gateway` target only.
        let options = run(
            &["--targets", "gateway,gateway@release"],
            &[("GATEWAY_BIN", "/opt/gw")],
        )
        .unwrap();
        assert_eq!(
            options.targets[0].prebuilt.as_deref(),
            Some("/opt/gw".as_ref())
        );
        assert_eq!(options.targets[0].build, None);
        assert_eq!(options.targets[1].build.as_deref(), Some("release"));
    }

    #[test]
    fn bad_targets_say_why() {
        for (targets, expected) in [
            ("nginx,squid", "unknown target `squid`"),
            ("nginx,nginx", "named twice"),
            ("nginx@release", "only Rust targets"),
            ("haproxy#old", "only Rust targets"),
            ("gateway#Old", "is not a label"),
            ("gateway#old", "set BIN_OLD"),
            ("gateway@Rel", "is not a cargo profile name"),
            ("", "--targets is empty"),
        ] {
            let err = run(&["--targets", targets], &[]).unwrap_err();
            assert!(err.contains(expected), "{targets}: {err}");
        }
    }

    #[test]
    fn help_lists_every_target_mode_and_setting() {
        let help = help();
        for kind in kinds::KINDS {
            assert!(
                help.contains(&format!("\n  {:12}  ", kind.name())),
                "{}",
                kind.name()
            );
        }
        for mode in modes::MODES.iter().filter_map(|m| m.flag()) {
            assert!(help.contains(mode), "{mode}");
        }
        assert!(help.contains("--rounds N, ROUNDS [5]"), "{help}");
    }
}
