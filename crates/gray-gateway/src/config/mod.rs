//! The gateway's configuration file (TOML): [`Config::load`] reads and checks it.
//!
//! Every table rejects unknown keys, enumerations are read by serde, and every mistake is
//! reported with the file, the line, the column and the field, the way compilers do:
//!
//! ```text
//! gateway.toml:12:1: field `services.orders.falback`: unknown field `falback`, expected one of `pick`, `name`, `preset`, …
//! ```
//!
//! The keys, their defaults and their meaning are in the [crate docs](crate#configuration).
//! Relative paths are relative to the configuration file's folder.
//!
//! ```
//! use std::{path::Path, time::Duration};
//! use gray_gateway::config::{Config, Discovery};
//!
//! let config = Config::parse(
//!     r#"
//! listen = "127.0.0.1:8080"
//! instances = "instances.toml"
//! header_read_timeout_ms = 2000
//!
//! [services.orders]
//! preset = "seed-000"
//! pick = "round-robin"
//! "#,
//!     Path::new("/etc/gray/gateway.toml"),
//! )?;
//! assert!(matches!(&config.discovery, Discovery::File(p) if p == Path::new("/etc/gray/instances.toml")));
//! assert_eq!(config.limits.header_read_timeout, Some(Duration::from_secs(2)));
//! // A policy is named after its preset; without one it is `default` (or its `name`).
//! assert_eq!(config.services[0].policy.name(), "seed-000");
//!
//! let typo = Config::parse(
//!     "listen = \"127.0.0.1:8080\"\n[services.orders]\nfalback = \"any\"\n",
//!     Path::new("gateway.toml"),
//! )
//! .unwrap_err();
//! assert_eq!((typo.line(), typo.field()), (Some(3), Some("services.orders.falback")));
//! # Ok::<(), gray_gateway::config::ConfigError>(())
//! ```

mod admin;
mod defaults;
mod file;
mod mirror;
mod model;
mod parse;
#[cfg(test)]
mod tests;
mod transport;
mod upstream;

#[cfg(feature = "etcd")]
pub use self::model::EtcdSettings;
pub(crate) use self::transport::system_tls;
pub use self::{
    admin::{AdminAccess, AdminToken},
    model::{
        ClientCerts, Config, Discovery, Limits, MirrorConfig, MirrorPriority, RolloutSettings,
        Rules, ServiceConfig, TlsSettings, TlsVersion,
    },
    parse::default_carriers,
    transport::UpstreamTransport,
};
/// A configuration error: the file, the line, the field, and what was wrong.
pub use gray_config::ConfigError;

/// The embedded default instance file, used when the configuration names no source of
/// instances (two services on loopback ports, for trying the gateway out).
pub const DEFAULT_INSTANCES: &str = include_str!("../../instances.toml");
