//! The gateway's configuration file (TOML).
//!
//! ```toml
//! listen = "127.0.0.1:8080"          # the proxy
//! admin = "127.0.0.1:9901"           # /explain, /metrics, /healthz
//! workers = 1                        # tokio worker threads (0: one per core)
//! trusted_clients = ["127.0.0.1/32"] # stains sent by these clients are honoured
//! trusted_proxies = ["10.0.0.0/8"]   # X-Forwarded-For / Forwarded hops to look through
//! rules = "rules.toml"               # staining rules, reloaded live (optional)
//! instances = "instances.toml"       # discovery file, reloaded live (optional)
//! upstream_timeout_ms = 10000        # until the upstream's response headers
//! seed003_headers = false            # also write X-Gray-Flag / X-Gray-Ip
//!
//! [etcd]                             # discovery from etcd instead of `instances`
//! endpoints = ["127.0.0.1:2379"]
//! prefix = "/gray"
//!
//! [services.orders]                  # one table per routed service: /orders/** ...
//! preset = "seed-000"                # ... with its gray_core::matching::PolicyConfig
//! fallback = "baseline"
//! pick = "peak-ewma"                 # or "round-robin", "pending-requests"
//! ```
//!
//! Relative paths are relative to the configuration file. Without `instances` and
//! `[etcd]`, the embedded default instance file (`instances.toml` next to this example's
//! sources) is written to a temporary file and watched there.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use gray_balance::Pick;
use gray_core::{Policy, matching::PolicyConfig, rules::CidrList};
use serde::Deserialize;

/// The embedded default instance file.
pub const DEFAULT_INSTANCES: &str = include_str!("../instances.toml");

/// A configuration error: the file, the field, and what was wrong.
#[derive(Debug)]
pub struct ConfigError {
    /// The configuration file.
    pub file: PathBuf,
    /// The field, dotted (`services.orders.pick`); empty for the file as a whole.
    pub field: String,
    /// What was wrong and what was expected.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}: field `{}`: {}",
                self.file.display(),
                self.field,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: SocketAddr,
    admin: Option<SocketAddr>,
    #[serde(default)]
    workers: usize,
    #[serde(default)]
    trusted_clients: Vec<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    rules: Option<PathBuf>,
    instances: Option<PathBuf>,
    etcd: Option<EtcdConfig>,
    #[serde(default = "default_timeout")]
    upstream_timeout_ms: u64,
    #[serde(default)]
    seed003_headers: bool,
    #[serde(default)]
    services: BTreeMap<String, RawService>,
}

fn default_timeout() -> u64 {
    10_000
}

#[derive(Debug, Deserialize)]
struct RawService {
    pick: Option<String>,
    #[serde(flatten)]
    policy: PolicyConfig,
}

/// Discovery from etcd.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// The etcd client endpoints (`127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// The key prefix: instances live under `<prefix>/<service>/<instance-id>`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
}

fn default_prefix() -> String {
    "/gray".into()
}

/// Where the instances come from.
#[derive(Debug, Clone)]
pub enum Discovery {
    /// A watched file.
    File(PathBuf),
    /// The embedded default file.
    Embedded,
    /// etcd.
    Etcd(EtcdConfig),
}

/// One routed service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The service name: the first path segment routed to it.
    pub name: String,
    /// Its routing policy.
    pub policy: Policy,
    /// How its balancer picks among ready instances.
    pub pick: Pick,
}

/// The whole, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from.
    pub source: PathBuf,
    /// The proxy's address.
    pub listen: SocketAddr,
    /// The admin endpoint's address, if any.
    pub admin: Option<SocketAddr>,
    /// Runtime worker threads (0: one per core).
    pub workers: usize,
    /// Clients whose own stain is honoured.
    pub trusted_clients: CidrList,
    /// Proxies whose `X-Forwarded-For` / `Forwarded` entries are looked through.
    pub trusted_proxies: CidrList,
    /// The staining rules file, watched.
    pub rules: Option<PathBuf>,
    /// Where the instances come from.
    pub discovery: Discovery,
    /// The time allowed until an upstream's response headers.
    pub upstream_timeout: Duration,
    /// Whether to write seed 003's `X-Gray-Flag` / `X-Gray-Ip` too.
    pub seed003_headers: bool,
    /// The routed services.
    pub services: Vec<ServiceConfig>,
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            field: String::new(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`, read from `path` (relative paths are resolved against
    /// its folder).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let err = |field: &str, message: String| ConfigError {
            file: path.to_owned(),
            field: field.to_owned(),
            message,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let message = match e.span() {
                Some(span) => {
                    let line = text.as_bytes()[..span.start.min(text.len())]
                        .iter()
                        .filter(|&&b| b == b'\n')
                        .count()
                        + 1;
                    format!("line {line}: {}", e.message())
                }
                None => e.message().to_owned(),
            };
            err("", message)
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let trusted_clients = CidrList::parse(&raw.trusted_clients)
            .map_err(|e| err("trusted_clients", e.to_string()))?;
        let trusted_proxies = CidrList::parse(&raw.trusted_proxies)
            .map_err(|e| err("trusted_proxies", e.to_string()))?;
        let discovery = match (raw.instances, raw.etcd) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "etcd",
                    "give either `instances` or `[etcd]`, not both".into(),
                ));
            }
            (Some(file), None) => Discovery::File(resolve(file)),
            (None, Some(etcd)) => {
                if etcd.endpoints.is_empty() {
                    return Err(err(
                        "etcd.endpoints",
                        "expected at least one endpoint".into(),
                    ));
                }
                Discovery::Etcd(etcd)
            }
            (None, None) => Discovery::Embedded,
        };
        if raw.services.is_empty() {
            return Err(err(
                "services",
                "expected at least one `[services.<name>]` table".into(),
            ));
        }
        let mut services = Vec::new();
        for (name, service) in raw.services {
            let field = |f: &str| format!("services.{name}.{f}");
            if name.is_empty() || name.contains('/') {
                return Err(err(
                    &format!("services.{name}"),
                    "a service name is one path segment".into(),
                ));
            }
            let pick = match service.pick.as_deref() {
                None | Some("peak-ewma") => Pick::default(),
                Some("round-robin") => Pick::RoundRobin,
                Some("pending-requests") => Pick::PendingRequests,
                Some(other) => {
                    return Err(err(
                        &field("pick"),
                        format!(
                            "expected `peak-ewma`, `round-robin` or `pending-requests`, found `{other}`"
                        ),
                    ));
                }
            };
            let mut policy_config = service.policy;
            if policy_config.name.is_none() {
                policy_config.name = Some(name.clone());
            }
            let policy = Policy::try_from(policy_config)
                .map_err(|e| err(&format!("services.{name}"), e.to_string()))?;
            services.push(ServiceConfig { name, policy, pick });
        }
        Ok(Config {
            source: path.to_owned(),
            listen: raw.listen,
            admin: raw.admin,
            workers: raw.workers,
            trusted_clients,
            trusted_proxies,
            rules: raw.rules.map(resolve),
            discovery,
            upstream_timeout: Duration::from_millis(raw.upstream_timeout_ms.max(1)),
            seed003_headers: raw.seed003_headers,
            services,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_config_parses() {
        let cfg = Config::parse(
            r#"
listen = "127.0.0.1:8080"
admin = "127.0.0.1:9901"
trusted_clients = ["127.0.0.1/32"]
rules = "rules.toml"
instances = "/abs/instances.toml"
[services.orders]
preset = "seed-000"
fallback = "baseline"
pick = "round-robin"
"#,
            Path::new("/etc/gray/gateway.toml"),
        )
        .unwrap();
        assert_eq!(cfg.rules.unwrap(), Path::new("/etc/gray/rules.toml"));
        assert_eq!(cfg.services[0].name, "orders");
        assert_eq!(cfg.services[0].pick, Pick::RoundRobin);
        assert!(
            matches!(cfg.discovery, Discovery::File(ref p) if p == Path::new("/abs/instances.toml"))
        );
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let bad_fallback = Config::parse(
            "listen = \"127.0.0.1:1\"\n[services.orders]\nfallback = \"sometimes\"\n",
            Path::new("gw.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad_fallback.starts_with("gw.toml: field `services.orders`"),
            "{bad_fallback}"
        );
        assert!(bad_fallback.contains("fallback"), "{bad_fallback}");

        let bad_cidr = Config::parse(
            "listen = \"127.0.0.1:1\"\ntrusted_clients = [\"nope\"]\n[services.a]\n",
            Path::new("gw.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(bad_cidr.contains("field `trusted_clients`"), "{bad_cidr}");

        let unknown = Config::parse(
            "listen = \"127.0.0.1:1\"\nlisten_port = 3\n[services.a]\n",
            Path::new("gw.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            unknown.contains("line 2") && unknown.contains("listen_port"),
            "{unknown}"
        );
    }
}
