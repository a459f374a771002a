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
//! preset = "seed-000"                # ... with its gray_core::matching::PolicyConfig keys
//! fallback = "baseline"
//! pick = "peak-ewma"                 # or "round-robin", "pending-requests"
//! ```
//!
//! Relative paths are relative to the configuration file. Without `instances` and
//! `[etcd]`, the embedded default instance file (`instances.toml` next to this example's
//! sources) is written to a temporary file and watched there.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use gray_balance::Pick;
use gray_core::{
    Policy,
    config::{Document, Format},
    matching::WithPolicy,
    rules::CidrList,
};
use serde::Deserialize;

/// The embedded default instance file.
pub const DEFAULT_INSTANCES: &str = include_str!("../instances.toml");

/// A configuration error: the file, the line, the field, and what was wrong.
pub use gray_core::config::ConfigError;

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

/// A `[services.<name>]` table: the policy's keys and the gateway's own, nothing else.
type RawService = WithPolicy<ServiceKeys>;

/// The gateway's own keys of a service table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceKeys {
    pick: Option<String>,
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
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                &path.display().to_string(),
                format_args!("cannot read it: {e}"),
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates `text`, read from `path` (relative paths are resolved against
    /// its folder).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let doc = Document::new(text, Format::Toml, &source);
        let raw: RawConfig = doc.parse()?;
        let err = |field: &str, message: String| doc.error(field, message);
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
            let pick = match service.extra.pick.as_deref() {
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
                .map_err(|e| err(&field(e.field()), e.to_string()))?;
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
            bad_fallback.starts_with(
                "gw.toml:3:12: field `services.orders.fallback`: unknown variant `sometimes`"
            ),
            "{bad_fallback}"
        );

        // A typo inside a service table is refused with its line (issue 10).
        let typo = Config::parse(
            "listen = \"127.0.0.1:1\"\n[services.orders]\npick = \"round-robin\"\nfalback = \"any\"\n",
            Path::new("gw.toml"),
        )
        .unwrap_err();
        assert_eq!(typo.line(), Some(4), "{typo}");
        assert_eq!(typo.field(), Some("services.orders.falback"), "{typo}");
        assert!(
            typo.message()
                .starts_with("unknown field `falback`, expected one of `pick`, `name`, `preset`"),
            "{typo}"
        );

        let bad_preset = Config::parse(
            "listen = \"127.0.0.1:1\"\n[services.orders]\npreset = \"seed-9\"\n",
            Path::new("gw.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad_preset.starts_with(
                "gw.toml:3:10: field `services.orders.preset`: expected one of `seed-000`"
            ),
            "{bad_preset}"
        );
        let same_keys = Config::parse(
            "listen = \"127.0.0.1:1\"\n[services.orders]\nlane_key = \"k\"\nflag_key = \"k\"\n",
            Path::new("gw.toml"),
        )
        .unwrap_err();
        assert_eq!(
            (same_keys.line(), same_keys.field()),
            (Some(4), Some("services.orders.flag_key")),
            "{same_keys}"
        );

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
            unknown.starts_with("gw.toml:2:1: field `listen_port`: unknown field `listen_port`"),
            "{unknown}"
        );
    }
}
