//! The settings: each an environment variable and a flag of the same name (`ROUNDS=3` or
//! `--rounds 3`; the flag wins), listed in [`SETTINGS`] with its default.

use std::{fmt::Write as _, path::PathBuf};

use super::Result;

/// One setting: its environment variable (the flag is the same name in lower case with
/// dashes: `INS_DURATION` is `--ins-duration`), its default, and what it is.
#[derive(Debug)]
struct Spec {
    env: &'static str,
    /// What the flag's value is, for `--help`.
    value: &'static str,
    default: &'static str,
    about: &'static str,
}

const SETTINGS: &[Spec] = &[
    Spec {
        env: "ROUNDS",
        value: "N",
        default: "5",
        about: "rounds per target, interleaved: nginx, haproxy, gateway, bare, nginx, ...",
    },
    Spec {
        env: "DURATION",
        value: "SECONDS",
        default: "5",
        about: "seconds per round (wrk has no request count: rounds are fixed-duration)",
    },
    Spec {
        env: "WARMUP",
        value: "SECONDS",
        default: "2",
        about: "seconds of unmeasured load per target before the first round",
    },
    Spec {
        env: "CONNECTIONS",
        value: "N",
        default: "64",
        about: "wrk connections (one wrk thread)",
    },
    Spec {
        env: "NEW_CONNECTIONS",
        value: "0|1",
        default: "0",
        about: "1: every request on a new connection (wrk sends `Connection: close`): with the\n\
                TLS targets, a full handshake per request",
    },
    Spec {
        env: "PROXY_CPU",
        value: "CPU",
        default: "0",
        about: "CPU for the targets",
    },
    Spec {
        env: "LOAD_CPU",
        value: "CPU",
        default: "1",
        about: "CPU for wrk and the four upstreams",
    },
    Spec {
        env: "PROFILE",
        value: "NAME",
        default: "dist",
        about: "cargo profile of the Rust targets (the workspace's shipping profile;\n\
                `profiling` is the same code with line tables, for --instructions)",
    },
    Spec {
        env: "GATEWAY_PACKAGE",
        value: "PACKAGE",
        default: "gray-gateway",
        about: "cargo package of the gateway",
    },
    Spec {
        env: "GATEWAY_BIN_NAME",
        value: "NAME",
        default: "gray-gateway",
        about: "the gateway package's binary",
    },
    Spec {
        env: "GATEWAY_BIN",
        value: "PATH",
        default: "",
        about: "a prebuilt gateway binary for the `gateway` target (no build)",
    },
    Spec {
        env: "GATEWAY_LOG",
        value: "FILTER",
        default: "warn",
        about: "RUST_LOG for the gateway (per-request logs would measure the terminal)",
    },
    Spec {
        env: "GATEWAY_CONFIG",
        value: "TOML",
        default: "",
        about: "top-level keys added to the gateway targets' configuration\n        (`GATEWAY_CONFIG='release_buffers_above = 0'`)",
    },
    Spec {
        env: "REFS",
        value: "LIST",
        default: "nginx,bare",
        about: "the targets every other is divided by (those present)",
    },
    Spec {
        env: "INS_DURATION",
        value: "SECONDS",
        default: "5",
        about: "--instructions: seconds of the measured wrk run per target",
    },
    Spec {
        env: "INS_WARMUP",
        value: "SECONDS",
        default: "3",
        about: "--instructions: seconds of unmeasured load per target before it",
    },
    Spec {
        env: "INS_TOP",
        value: "N",
        default: "12",
        about: "--instructions: functions and crates listed per target",
    },
    Spec {
        env: "INS_CACHE_SIM",
        value: "0|1",
        default: "0",
        about: "--instructions: 1 also simulates the caches (callgrind --cache-sim=yes):\n\
                data and instruction references and misses per request, first level and\n\
                last level; the VM has no hardware counters, and time per instruction\n\
                follows memory touched",
    },
    Spec {
        env: "SYS_DURATION",
        value: "SECONDS",
        default: "5",
        about: "--syscalls: seconds of the measured wrk run per target",
    },
    Spec {
        env: "IDLE_CONNECTIONS",
        value: "N",
        default: "8000",
        about: "--idle-memory: idle keep-alive connections opened per listener",
    },
    Spec {
        env: "IDLE_SETTLE",
        value: "SECONDS",
        default: "6",
        about: "--idle-memory: how long the connections stay idle before memory is read (the gateway\n        drops an idle connection's buffers 2.5 to 5 s after its last response)",
    },
    Spec {
        env: "SYS_TOP",
        value: "N",
        default: "8",
        about: "--syscalls: system calls listed per target",
    },
];

/// The settings of [`SETTINGS`], parsed.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) rounds: u64,
    pub(crate) duration: u64,
    pub(crate) warmup: u64,
    pub(crate) connections: u64,
    /// Every request on a new connection.
    pub(crate) new_connections: bool,
    pub(crate) proxy_cpu: u64,
    pub(crate) load_cpu: u64,
    pub(crate) profile: String,
    pub(crate) gateway_package: String,
    pub(crate) gateway_bin_name: String,
    pub(crate) gateway_bin: Option<PathBuf>,
    pub(crate) gateway_log: String,
    pub(crate) gateway_config: String,
    /// As given; `Options::refs` keeps those that are targets.
    pub(crate) refs: Vec<String>,
    pub(crate) ins_duration: u64,
    pub(crate) ins_warmup: u64,
    pub(crate) ins_top: usize,
    /// `--cache-sim=yes` under callgrind.
    pub(crate) ins_cache_sim: bool,
    pub(crate) sys_duration: u64,
    pub(crate) sys_top: usize,
    pub(crate) idle_connections: u64,
    pub(crate) idle_settle: u64,
}

// === impl Settings ===

impl Settings {
    /// Reads every setting: from `flags` (a setting's name and the value its flag was given,
    /// the last one winning), else from `env`, else its default. An empty value is unset.
    pub(crate) fn read(
        flags: &[(&'static str, String)],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self> {
        let get = |name: &str| {
            let flag = flags.iter().rev().find(|(n, _)| *n == name);
            let value = flag.map(|(_, v)| v.clone()).or_else(|| env(name));
            match value {
                Some(value) if !value.is_empty() => value,
                _ => SETTINGS
                    .iter()
                    .find(|s| s.env == name)
                    .map_or("", |s| s.default)
                    .to_owned(),
            }
        };
        let number = |name: &str, min: u64| -> Result<u64> {
            let raw = get(name);
            match raw.parse::<u64>() {
                Ok(n) if n >= min && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
                Ok(_) if min > 0 => Err(format!("{name} must be at least {min}, got `{raw}`")),
                _ => Err(format!(
                    "{name} must be a non-negative integer, got `{raw}`"
                )),
            }
        };
        let profile = get("PROFILE");
        if !is_name(&profile, "_-") {
            return Err(format!(
                "PROFILE must name a cargo profile, got `{profile}`"
            ));
        }
        let gateway_bin = Some(get("GATEWAY_BIN"))
            .filter(|bin| !bin.is_empty())
            .map(PathBuf::from);
        Ok(Settings {
            rounds: number("ROUNDS", 1)?,
            duration: number("DURATION", 1)?,
            warmup: number("WARMUP", 0)?,
            connections: number("CONNECTIONS", 1)?,
            new_connections: match get("NEW_CONNECTIONS").as_str() {
                "0" => false,
                "1" => true,
                other => return Err(format!("NEW_CONNECTIONS must be 0 or 1, got `{other}`")),
            },
            proxy_cpu: number("PROXY_CPU", 0)?,
            load_cpu: number("LOAD_CPU", 0)?,
            profile,
            gateway_package: get("GATEWAY_PACKAGE"),
            gateway_bin_name: get("GATEWAY_BIN_NAME"),
            gateway_bin,
            gateway_log: get("GATEWAY_LOG"),
            gateway_config: get("GATEWAY_CONFIG"),
            refs: get("REFS").split(',').map(str::to_owned).collect(),
            ins_duration: number("INS_DURATION", 1)?,
            ins_warmup: number("INS_WARMUP", 0)?,
            ins_top: number("INS_TOP", 0)? as usize,
            ins_cache_sim: match get("INS_CACHE_SIM").as_str() {
                "0" => false,
                "1" => true,
                other => return Err(format!("INS_CACHE_SIM must be 0 or 1, got `{other}`")),
            },
            sys_duration: number("SYS_DURATION", 1)?,
            sys_top: number("SYS_TOP", 0)? as usize,
            idle_connections: number("IDLE_CONNECTIONS", 1)?,
            idle_settle: number("IDLE_SETTLE", 0)?,
        })
    }
}

/// The setting whose flag is `flag` (`--ins-duration` → `INS_DURATION`).
pub(crate) fn named_by(flag: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .map(|s| s.env)
        .find(|env| flag_of(env) == flag)
}

/// `INS_DURATION` → `--ins-duration`.
fn flag_of(env: &str) -> String {
    format!("--{}", env.to_ascii_lowercase().replace('_', "-"))
}

/// Appends the settings' `--help` section to `out`.
pub(crate) fn push_help(out: &mut String) {
    out.push_str(
        "\nSettings: a flag, or the environment variable of the same name (the flag wins);\n\
         defaults in brackets:\n",
    );
    for spec in SETTINGS {
        let _ = writeln!(
            out,
            "  {} {}, {} [{}]",
            flag_of(spec.env),
            spec.value,
            spec.env,
            if spec.default.is_empty() {
                "unset"
            } else {
                spec.default
            }
        );
        for line in spec.about.lines() {
            let _ = writeln!(out, "        {}", line.trim_start());
        }
    }
}

/// `[a-z][a-z0-9<extra>]*`.
pub(crate) fn is_name(s: &str, extra: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_a_flag_and_a_help_entry() {
        let mut help = String::new();
        push_help(&mut help);
        for spec in SETTINGS {
            assert_eq!(named_by(&flag_of(spec.env)), Some(spec.env));
            let entry = format!("{} {}, {} [", flag_of(spec.env), spec.value, spec.env);
            assert!(help.contains(&entry), "{entry}");
        }
        assert!(
            help.contains("  --ins-duration SECONDS, INS_DURATION [5]\n"),
            "{help}"
        );
        assert_eq!(named_by("--round"), None);
    }

    #[test]
    fn names_are_lower_case_words() {
        assert!(is_name("profiling", "_-") && is_name("a1_b-c", "_-"));
        assert!(!is_name("Dist", "_-") && !is_name("1st", "_") && !is_name("a-b", "_"));
        assert!(!is_name("", "_"));
    }
}
