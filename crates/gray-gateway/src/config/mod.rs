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

mod file;
#[cfg(test)]
mod tests;
mod transport;
mod upstream;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use gray_balance::{
    Pick,
    health::{Ejection, Probe},
    retry::RetryPolicy,
};
use gray_config::{Document, Format};
use gray_core::CarrierConfig;
use gray_policy::Policy;
use gray_rules::CidrList;
use gray_tower::edge::ForwardedHeader;
use http::HeaderName;

pub use self::transport::UpstreamTransport;
pub(crate) use self::transport::system_tls;
/// A configuration error: the file, the line, the field, and what was wrong.
pub use gray_config::ConfigError;

/// The embedded default instance file, used when the configuration names no source of
/// instances (two services on loopback ports, for trying the gateway out).
pub const DEFAULT_INSTANCES: &str = include_str!("../../instances.toml");

/// The defaults of the configuration's keys.
pub(crate) mod defaults {
    pub(crate) fn head_hold_ms() -> u64 {
        200
    }
    pub(crate) fn upstream_timeout_ms() -> u64 {
        10_000
    }
    pub(crate) fn header_read_timeout_ms() -> u64 {
        10_000
    }
    pub(crate) fn max_header_bytes() -> usize {
        64 * 1024
    }
    pub(crate) fn idle_timeout_ms() -> u64 {
        60_000
    }
    pub(crate) fn max_connections() -> usize {
        10_000
    }
    pub(crate) fn release_buffers_above() -> usize {
        1_000
    }
    pub(crate) fn request_body_timeout_ms() -> u64 {
        30_000
    }
    pub(crate) fn request_body_min_rate() -> u64 {
        500
    }
    pub(crate) fn send_timeout_ms() -> u64 {
        60_000
    }
    pub(crate) fn max_in_flight() -> usize {
        4096
    }
    pub(crate) fn max_cancelled_streams_percent() -> u32 {
        50
    }
    pub(crate) fn upstream_buffer_bytes() -> usize {
        64 * 1024
    }
    pub(crate) fn upstream_max_connects() -> usize {
        8
    }
    pub(crate) fn http2_max_concurrent_streams() -> u32 {
        100
    }
    pub(crate) fn http2_max_send_buf_size() -> usize {
        64 * 1024
    }
    pub(crate) fn http2_stream_window() -> u32 {
        256 * 1024
    }
    pub(crate) fn http2_connection_window() -> u32 {
        1024 * 1024
    }
    pub(crate) fn http2_max_pending_accept_reset_streams() -> usize {
        20
    }
    pub(crate) fn http2_max_local_error_reset_streams() -> usize {
        1024
    }
    pub(crate) fn metrics_max_lanes() -> usize {
        32
    }
    pub(crate) fn handshake_timeout_ms() -> u64 {
        10_000
    }
    pub(crate) fn tls_reload_interval_ms() -> u64 {
        1_000
    }
    #[cfg(feature = "etcd")]
    pub(crate) fn etcd_prefix() -> String {
        "/gray".into()
    }
}

/// The smallest `max_header_bytes`: hyper's smallest read buffer.
const MIN_HEADER_BYTES: usize = 8 * 1024;

/// The whole, checked configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The file it was read from.
    pub source: PathBuf,
    /// The proxy's plaintext address; `None` when only [`tls`](Config::tls) listens.
    pub listen: Option<SocketAddr>,
    /// The proxy's TLS listener (the `[tls]` table), if any.
    pub tls: Option<TlsSettings>,
    /// The admin endpoint's address, if any.
    pub admin: Option<SocketAddr>,
    /// Runtime worker threads (0: one per core; 1: tokio's current-thread scheduler).
    pub workers: usize,
    /// Clients whose own stain is honoured.
    pub trusted_clients: CidrList,
    /// Proxies whose `X-Forwarded-For` / `Forwarded` entries are looked through.
    pub trusted_proxies: CidrList,
    /// The header the trusted proxies write the client address chain in.
    pub forwarded_header: ForwardedHeader,
    /// The carriers read from trusted clients and written for the upstreams.
    pub carriers: Vec<CarrierConfig>,
    /// Extra headers stripped from untrusted clients.
    pub strip: Vec<HeaderName>,
    /// Whether a path whose normalised form leaves its `/{service}` prefix gets a 400.
    pub reject_prefix_escape: bool,
    /// Where the staining rules come from.
    pub rules: Rules,
    /// Where the instances come from.
    pub discovery: Discovery,
    /// The time allowed until an upstream's response headers (then 504).
    pub upstream_timeout: Duration,
    /// How long an upstream's response head waits for the first frame of its body before
    /// it goes to the client: a body that fails within it gets the client a 502 instead of
    /// a closed connection; a streaming response is delayed by at most this (`head_hold_ms`).
    pub head_hold: Duration,
    /// Limits on clients' connections.
    pub limits: Limits,
    /// How many distinct lanes get series of their own in `/metrics`; the others are
    /// counted under `lane="other"`.
    pub metrics_max_lanes: usize,
    /// Whether to write seed 003's `X-Gray-Flag` / `X-Gray-Ip` too.
    pub seed003_headers: bool,
    /// The routed services, sorted by name.
    pub services: Vec<ServiceConfig>,
    /// What the services' rollouts share (`[rollouts]`).
    pub rollouts: RolloutSettings,
}

/// The `[rollouts]` table: what every service's rollout shares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RolloutSettings {
    /// The folder of the rollouts' state files, `<service>.rollout.json` (`state_dir`;
    /// default: the configuration file's folder).
    pub state_dir: PathBuf,
    /// How often each rollout's controller looks at its evidence (`interval_ms`, default
    /// 1000).
    pub interval: Duration,
    /// How many transitions each rollout keeps, with their evidence, for the admin API
    /// (`history`, default 32).
    pub history: usize,
    /// How long a gateway cut off from the shared store (etcd) keeps the weight it has
    /// before it drops the percentage to 0 (`partition_hold_ms`, default 30000); see the
    /// [rollout docs](crate::rollout).
    pub partition_hold: Duration,
    /// The TTL of the lease a gateway holds its leader key and its reports under in etcd
    /// (`lease_ttl_ms`, default 5000, rounded up to whole seconds): when a leader dies,
    /// another gateway leads within this + a third of it (+ etcd's delay in expiring a
    /// lease, up to 500 ms).
    pub lease_ttl: Duration,
}

/// One routed service.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The service name: the first path segment routed to it.
    pub name: String,
    /// Its routing policy.
    pub policy: Policy,
    /// How its balancer picks among ready instances.
    pub pick: Pick,
    /// When a request goes to another instance (`retry`).
    pub retry: RetryPolicy,
    /// How an ejected instance is checked before it comes back (`health_check`).
    pub probe: Probe,
    /// When an instance is ejected, and for how long (`health_check`).
    pub ejection: Ejection,
    /// How its instances are reached: the HTTP version (`protocol`) and TLS (`tls`).
    pub transport: UpstreamTransport,
    /// Whether the service's name is taken off the path before the request is forwarded
    /// (`strip_prefix`, default `true`); `false` for gRPC services, whose path
    /// (`/{package.Service}/{Method}`) starts with the name the service is routed by.
    pub strip_prefix: bool,
    /// Its rollout (`[services.<name>.rollout]`), checked.
    pub rollout: Option<gray_rollout::RolloutConfig>,
}

/// Where the instances come from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Discovery {
    /// A watched file (gray-discovery's format).
    File(PathBuf),
    /// The embedded default file ([`DEFAULT_INSTANCES`]).
    Embedded,
    /// An etcd prefix (feature `etcd`).
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdSettings>),
}

/// Where the staining rules come from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rules {
    /// No rules: every request is baseline unless a trusted client stains it.
    None,
    /// A watched file (TOML, YAML or JSON, by its extension).
    File(PathBuf),
    /// An etcd key (feature `etcd`), read with the `[etcd]` table's client settings.
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdSettings>, String),
}

/// The `[etcd]` table (feature `etcd`).
#[cfg(feature = "etcd")]
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdSettings {
    /// How to reach the cluster.
    pub client: gray_tower::edge::EtcdConfig,
    /// The key prefix, ending in `/`: instances live under `<prefix><service>/<id>`.
    pub prefix: String,
}

/// The `[tls]` table: a listener that terminates TLS; see the [crate docs](crate#tls).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSettings {
    /// Its address.
    pub listen: SocketAddr,
    /// The certificate chain (PEM): the server's certificate first, then its
    /// intermediates.
    pub cert_file: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Client certificates, if they are asked for.
    pub client_certs: Option<ClientCerts>,
    /// The oldest protocol version accepted.
    pub min_version: TlsVersion,
    /// The time a client has to complete its handshake, from the accept (`None`: no
    /// limit beyond `header_read_timeout`).
    pub handshake_timeout: Option<Duration>,
    /// How often the files are looked at for a new version (`None`: never reloaded).
    pub reload_interval: Option<Duration>,
}

/// Client-certificate verification (`client_ca_file`, `client_auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientCerts {
    /// The CA certificates (PEM) a client's certificate must chain to.
    pub ca_file: PathBuf,
    /// Whether a client without a certificate is refused (`client_auth = "required"`, the
    /// default) or served (`"optional"`; a certificate it presents must still verify).
    pub required: bool,
}

/// A TLS protocol version (`min_version = "1.2"` or `"1.3"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[non_exhaustive]
pub enum TlsVersion {
    /// TLS 1.2 (and 1.3).
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

impl std::fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsVersion::Tls12 => "1.2",
            TlsVersion::Tls13 => "1.3",
        })
    }
}

/// Limits on clients' connections; see the [crate docs](crate#limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// The time a connection has to send a complete request head (`None`: no limit).
    pub header_read_timeout: Option<Duration>,
    /// The largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// The time a connection may stay open with no request in flight (`None`: no limit).
    pub idle_timeout: Option<Duration>,
    /// The most client connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// While more client connections than this are open, an idle HTTP/1.1 connection
    /// drops its buffers as soon as it is idle, not a watchdog tick later (0: always).
    pub release_buffers_above: usize,
    /// A request body must progress: its next frame within this time, and on average at
    /// least `request_body_min_rate` bytes a second past it (`None`: no limit).
    pub request_body_timeout: Option<Duration>,
    /// The average rate, in bytes a second, a request body keeps up after
    /// `request_body_timeout` (0: none).
    pub request_body_min_rate: u64,
    /// The time a connection's response bodies may make no progress (the client not
    /// reading) before the connection is closed (`None`: no limit).
    pub send_timeout: Option<Duration>,
    /// Requests in flight to upstreams at once, from all clients (0: no cap); more get 503.
    pub max_in_flight: usize,
    /// Requests in flight at once from one client IP (0: no cap); more get 429.
    pub max_in_flight_per_client: u32,
    /// Requests in flight at once to one instance (0: no cap): the balancer passes over an
    /// instance at the cap, and when every one that fits is at it, the request gets 503.
    pub max_in_flight_per_instance: u32,
    /// The share (percent) of a connection's streams, in windows of 100, that its client
    /// may cancel before their response; more and the connection gets GOAWAY (0: no limit).
    pub max_cancelled_streams_percent: u32,
    /// The read buffer of each upstream connection, in bytes: the largest response head,
    /// and what a response body buffers ahead of a client that does not read.
    pub upstream_buffer_bytes: usize,
    /// Connects to one instance running at once.
    pub upstream_max_connects: usize,
    /// HTTP/2: streams open at once per connection (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2: response bytes buffered per stream, beyond what the client's window takes.
    pub http2_max_send_buf_size: usize,
    /// HTTP/2: the receive window of each stream (request body bytes a client may send
    /// ahead).
    pub http2_stream_window: u32,
    /// HTTP/2: the receive window of each connection.
    pub http2_connection_window: u32,
    /// HTTP/2: streams reset by the client before the gateway accepted them, at once,
    /// before the connection is closed (rapid reset).
    pub http2_max_pending_accept_reset_streams: usize,
    /// HTTP/2: streams the gateway resets for the client's protocol errors before it
    /// closes the connection.
    pub http2_max_local_error_reset_streams: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: millis(defaults::header_read_timeout_ms()),
            max_header_bytes: defaults::max_header_bytes(),
            idle_timeout: millis(defaults::idle_timeout_ms()),
            max_connections: defaults::max_connections(),
            release_buffers_above: defaults::release_buffers_above(),
            request_body_timeout: millis(defaults::request_body_timeout_ms()),
            request_body_min_rate: defaults::request_body_min_rate(),
            send_timeout: millis(defaults::send_timeout_ms()),
            max_in_flight: defaults::max_in_flight(),
            max_in_flight_per_client: 0,
            max_in_flight_per_instance: 0,
            max_cancelled_streams_percent: defaults::max_cancelled_streams_percent(),
            upstream_buffer_bytes: defaults::upstream_buffer_bytes(),
            upstream_max_connects: defaults::upstream_max_connects(),
            http2_max_concurrent_streams: defaults::http2_max_concurrent_streams(),
            http2_max_send_buf_size: defaults::http2_max_send_buf_size(),
            http2_stream_window: defaults::http2_stream_window(),
            http2_connection_window: defaults::http2_connection_window(),
            http2_max_pending_accept_reset_streams:
                defaults::http2_max_pending_accept_reset_streams(),
            http2_max_local_error_reset_streams: defaults::http2_max_local_error_reset_streams(),
        }
    }
}

/// `None` for 0.
fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Why an edge refuses `own_lane`.
const NO_OWN_LANE: &str = "a gateway has no own lane: every request it routes carries the stain \
    the edge decided (baseline when no rule fires), so an own lane would never apply; stain \
    requests with a rule instead";

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(
                &path.display().to_string(),
                format_args!("cannot read it: {e}"),
            )
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks `text`, read from `path` (relative paths are resolved against
    /// its folder).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let source = path.display().to_string();
        let doc = Document::new(text, Format::Toml, &source);
        let raw: file::File = doc.parse().map_err(|e| located(&doc, e))?;
        let err = |field: &str, message: &dyn std::fmt::Display| doc.error(field, message);
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };

        let trusted_clients =
            CidrList::parse(&raw.trusted_clients).map_err(|e| err("trusted_clients", &e))?;
        let trusted_proxies =
            CidrList::parse(&raw.trusted_proxies).map_err(|e| err("trusted_proxies", &e))?;
        let mut strip = Vec::with_capacity(raw.strip.len());
        for (i, name) in raw.strip.iter().enumerate() {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                err(
                    &format!("strip[{i}]"),
                    &format_args!("expected a valid HTTP header name, found {name:?}"),
                )
            })?;
            strip.push(header);
        }
        if raw.max_header_bytes < MIN_HEADER_BYTES {
            return Err(err(
                "max_header_bytes",
                &format_args!(
                    "expected at least {MIN_HEADER_BYTES} (hyper's smallest read buffer), found {}",
                    raw.max_header_bytes
                ),
            ));
        }
        if raw.max_connections == 0 {
            return Err(err("max_connections", &"expected at least 1"));
        }
        if raw.max_cancelled_streams_percent > 100 {
            return Err(err(
                "max_cancelled_streams_percent",
                &format_args!(
                    "expected 0 to 100, found {}",
                    raw.max_cancelled_streams_percent
                ),
            ));
        }
        if raw.upstream_buffer_bytes < MIN_HEADER_BYTES {
            return Err(err(
                "upstream_buffer_bytes",
                &format_args!(
                    "expected at least {MIN_HEADER_BYTES} (hyper's smallest read buffer), found {}",
                    raw.upstream_buffer_bytes
                ),
            ));
        }
        for (field, value) in [
            ("upstream_max_connects", raw.upstream_max_connects),
            (
                "http2_max_concurrent_streams",
                raw.http2_max_concurrent_streams as usize,
            ),
            ("http2_max_send_buf_size", raw.http2_max_send_buf_size),
        ] {
            if value == 0 {
                return Err(err(field, &"expected at least 1"));
            }
        }
        for (field, value) in [
            ("http2_stream_window", raw.http2_stream_window),
            ("http2_connection_window", raw.http2_connection_window),
        ] {
            if !(65_535..=0x7fff_ffff).contains(&value) {
                return Err(err(
                    field,
                    &format_args!("expected 65535 to 2147483647 (HTTP/2's bounds), found {value}"),
                ));
            }
        }

        let (discovery, rules) = sources(&doc, &raw, &resolve)?;
        let tls = tls(&doc, &raw, &resolve)?;

        if raw.services.is_empty() {
            return Err(err(
                "services",
                &"expected at least one `[services.<name>]` table",
            ));
        }
        let mut services = Vec::with_capacity(raw.services.len());
        for (name, table) in raw.services {
            let field = |f: &str| format!("services.{name}.{f}");
            if name.is_empty() || name.contains('/') || name.chars().any(char::is_whitespace) {
                return Err(err(
                    &format!("services.{name}"),
                    &"a service name is one path segment",
                ));
            }
            let policy = Policy::try_from(table.policy).map_err(|e| err(&field(e.field()), &e))?;
            if policy.own_lane().is_some() {
                return Err(err(&field("own_lane"), &NO_OWN_LANE));
            }
            let retry = upstream::retry(&doc, &name, table.extra.retry.as_ref())?;
            let (probe, ejection) =
                upstream::health(&doc, &name, table.extra.health_check.as_ref())?;
            let transport = transport::transport(
                &doc,
                &name,
                table.extra.protocol,
                table.extra.tls.as_ref(),
                base,
            )?;
            if transport.tls.is_some()
                && matches!(
                    probe.check(),
                    gray_balance::health::Check::Http { .. }
                        | gray_balance::health::Check::Grpc { .. }
                )
            {
                return Err(err(
                    &field("health_check.kind"),
                    &"the HTTP and gRPC checks speak cleartext, and this service's instances \
                      speak TLS (its `tls` table): use `kind = \"connect\"`",
                ));
            }
            let rollout = match table.extra.rollout {
                Some(rollout) => {
                    rollout
                        .validate()
                        .map_err(|e| err(&field(&format!("rollout.{}", e.field())), &e))?;
                    Some(rollout)
                }
                None => None,
            };
            services.push(ServiceConfig {
                rollout,
                name,
                transport,
                strip_prefix: table.extra.strip_prefix.unwrap_or(true),
                policy,
                pick: table.extra.pick.unwrap_or_default(),
                retry,
                probe,
                ejection,
            });
        }
        Ok(Config {
            source: path.to_owned(),
            listen: raw.listen,
            tls,
            admin: raw.admin,
            workers: raw.workers,
            trusted_clients,
            trusted_proxies,
            forwarded_header: raw.forwarded_header,
            carriers: raw.carriers.unwrap_or_else(default_carriers),
            strip,
            reject_prefix_escape: raw.reject_prefix_escape,
            rules,
            discovery,
            upstream_timeout: Duration::from_millis(raw.upstream_timeout_ms.max(1)),
            head_hold: Duration::from_millis(raw.head_hold_ms),
            limits: Limits {
                header_read_timeout: millis(raw.header_read_timeout_ms),
                max_header_bytes: raw.max_header_bytes,
                idle_timeout: millis(raw.idle_timeout_ms),
                max_connections: raw.max_connections,
                release_buffers_above: raw.release_buffers_above,
                request_body_timeout: millis(raw.request_body_timeout_ms),
                request_body_min_rate: raw.request_body_min_rate,
                send_timeout: millis(raw.send_timeout_ms),
                max_in_flight: raw.max_in_flight,
                max_in_flight_per_client: raw.max_in_flight_per_client,
                max_in_flight_per_instance: raw.max_in_flight_per_instance,
                max_cancelled_streams_percent: raw.max_cancelled_streams_percent,
                upstream_buffer_bytes: raw.upstream_buffer_bytes,
                upstream_max_connects: raw.upstream_max_connects,
                http2_max_concurrent_streams: raw.http2_max_concurrent_streams,
                http2_max_send_buf_size: raw.http2_max_send_buf_size,
                http2_stream_window: raw.http2_stream_window,
                http2_connection_window: raw.http2_connection_window,
                http2_max_pending_accept_reset_streams: raw.http2_max_pending_accept_reset_streams,
                http2_max_local_error_reset_streams: raw.http2_max_local_error_reset_streams,
            },
            metrics_max_lanes: raw.metrics_max_lanes,
            seed003_headers: raw.seed003_headers,
            services,
            rollouts: rollout_settings(&doc, raw.rollouts.unwrap_or_default(), base, &resolve)?,
        })
    }
}

/// The `[rollouts]` table, checked.
fn rollout_settings(
    doc: &Document<'_>,
    raw: file::Rollouts,
    base: &Path,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<RolloutSettings, ConfigError> {
    let interval = raw.interval_ms.unwrap_or(1000);
    if interval == 0 {
        return Err(doc.error("rollouts.interval_ms", "expected at least 1"));
    }
    let history = raw.history.unwrap_or(32);
    if history == 0 {
        return Err(doc.error("rollouts.history", "expected at least 1"));
    }
    let partition_hold = raw.partition_hold_ms.unwrap_or(30_000);
    if partition_hold == 0 {
        return Err(doc.error("rollouts.partition_hold_ms", "expected at least 1"));
    }
    let lease_ttl = raw.lease_ttl_ms.unwrap_or(5_000);
    if lease_ttl < 1_000 {
        return Err(doc.error(
            "rollouts.lease_ttl_ms",
            "expected at least 1000 (etcd's leases count whole seconds)",
        ));
    }
    Ok(RolloutSettings {
        state_dir: raw.state_dir.map_or_else(|| base.to_owned(), resolve),
        interval: Duration::from_millis(interval),
        history,
        partition_hold: Duration::from_millis(partition_hold),
        lease_ttl: Duration::from_millis(lease_ttl),
    })
}

impl Config {
    /// An error at `field` of the configuration file (read again to find the field's
    /// line): for checks that need more than the file, such as a rollout's rule, which
    /// must be a sticky-percentage rule of the rules.
    pub fn field_error(&self, field: &str, message: &dyn std::fmt::Display) -> ConfigError {
        let source = self.source.display().to_string();
        let text = std::fs::read_to_string(&self.source).unwrap_or_default();
        Document::new(&text, Format::Toml, &source).error(field, message)
    }

    /// Checks every service's rollout against `rules`: its rule must be a
    /// sticky-percentage rule there.
    pub fn check_rollouts(&self, rules: &gray_rules::RuleSet) -> Result<(), ConfigError> {
        for service in &self.services {
            if let Some(rollout) = &service.rollout {
                if let Err(e) = rules.sticky_rule(&rollout.rule) {
                    let field = format!("services.{}.rollout.rule", service.name);
                    return Err(self.field_error(&field, &format_args!("{e}")));
                }
            }
        }
        Ok(())
    }
}

/// The default carriers: `x-gray-lane` and `x-gray-info`, as [`gray_core::Carriers::default`]
/// reads and writes them.
#[must_use]
pub fn default_carriers() -> Vec<CarrierConfig> {
    vec![CarrierConfig::lane(), CarrierConfig::route()]
}

/// An error that lost its place on the way is placed again: serde buffers internally
/// tagged enums (`carriers`) and flattened tables (`[etcd]`), so an unknown key inside them
/// is reported at the enclosing table, without the key's line.
fn located(doc: &Document<'_>, e: ConfigError) -> ConfigError {
    let Some(field) = e.field() else {
        return e;
    };
    // gray-source's etcd settings name a field of their own: `field `user`: …`.
    if let Some((inner, rest)) = e
        .message()
        .strip_prefix("field `")
        .and_then(|m| m.split_once("`: "))
    {
        let placed = doc.error(&format!("{field}.{inner}"), rest);
        if placed.line().is_some() {
            return placed;
        }
    }
    let unknown = e
        .message()
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(key, _)| key);
    if let Some(key) = unknown.filter(|key| !field.ends_with(&format!(".{key}"))) {
        // The table as a value, to find where under `field` the key is.
        if let Ok(whole) = doc.parse::<serde_json::Value>() {
            if let Some(path) = find_key(&whole, field, key) {
                return doc.error(&path, e.message());
            }
        }
    }
    match e.line() {
        None => doc.error(field, e.message()),
        Some(_) => e,
    }
}

/// The dotted path of the first `key` found under `field` in `whole`, depth first.
fn find_key(whole: &serde_json::Value, field: &str, key: &str) -> Option<String> {
    fn walk(value: &serde_json::Value, path: String, key: &str) -> Option<String> {
        match value {
            serde_json::Value::Object(map) => {
                if map.contains_key(key) {
                    return Some(format!("{path}.{key}"));
                }
                map.iter()
                    .find_map(|(k, v)| walk(v, format!("{path}.{k}"), key))
            }
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, format!("{path}[{i}]"), key)),
            _ => None,
        }
    }
    let mut value = whole;
    for part in field.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        value = value.get(name)?;
        if let Some(i) = index {
            value = value.get(i)?;
        }
    }
    walk(value, field.to_owned(), key)
}

/// Refuses the table `table` of `doc`, at its line, when the binary was built without
/// gray-gateway's feature `feature` (`compiled` is `cfg!(feature = ..)`: a parameter, so that
/// a build with every feature tests the refusal too).
fn needs_feature(
    doc: &Document<'_>,
    table: &str,
    feature: &str,
    compiled: bool,
) -> Result<(), ConfigError> {
    if compiled {
        return Ok(());
    }
    Err(doc.error(
        table,
        format_args!(
            "the `[{table}]` table needs gray-gateway's `{feature}` feature, which this binary \
             was built without (cargo build -p gray-gateway --features {feature})"
        ),
    ))
}

/// The `[tls]` table, and whether something listens at all.
fn tls(
    doc: &Document<'_>,
    raw: &file::File,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<Option<TlsSettings>, ConfigError> {
    let Some(table) = &raw.tls else {
        if raw.listen.is_none() {
            return Err(doc.error(
                "listen",
                "missing field `listen`: the proxy needs `listen`, or a `[tls]` table with its own `listen`, or both",
            ));
        }
        return Ok(None);
    };
    needs_feature(doc, "tls", "tls", cfg!(feature = "tls"))?;
    // Port 0 picks a free port for each: the same address twice is fine then.
    if raw.listen == Some(table.listen) && table.listen.port() != 0 {
        return Err(doc.error(
            "tls.listen",
            format_args!(
                "{} is `listen` too: the plaintext and the TLS listeners need addresses of their own",
                table.listen
            ),
        ));
    }
    let client_certs = match (&table.client_ca_file, table.client_auth) {
        (Some(ca), auth) => Some(ClientCerts {
            ca_file: resolve(ca.clone()),
            required: !matches!(auth, Some(file::ClientAuth::Optional)),
        }),
        (None, Some(_)) => {
            return Err(doc.error(
                "tls.client_auth",
                "needs `client_ca_file`: the CA certificates client certificates are verified with",
            ));
        }
        (None, None) => None,
    };
    Ok(Some(TlsSettings {
        listen: table.listen,
        cert_file: resolve(table.cert_file.clone()),
        key_file: resolve(table.key_file.clone()),
        client_certs,
        min_version: table.min_version,
        handshake_timeout: millis(table.handshake_timeout_ms),
        reload_interval: millis(table.reload_interval_ms),
    }))
}

/// Where the instances and the rules come from.
fn sources(
    doc: &Document<'_>,
    raw: &file::File,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<(Discovery, Rules), ConfigError> {
    let rules_file = raw.rules.clone().map(resolve);
    let instances = raw.instances.clone().map(resolve);
    if raw.etcd.is_some() {
        needs_feature(doc, "etcd", "etcd", cfg!(feature = "etcd"))?;
    }
    #[cfg(feature = "etcd")]
    if let Some(etcd) = &raw.etcd {
        if instances.is_some() {
            return Err(doc.error("etcd", "give either `instances` or `[etcd]`, not both"));
        }
        if etcd.client.tls().is_some() {
            needs_feature(doc, "etcd.tls", "etcd-tls", cfg!(feature = "etcd-tls"))?;
        }
        let settings = EtcdSettings {
            client: etcd.client.clone(),
            prefix: format!("{}/", etcd.prefix.trim_end_matches('/')),
        };
        let rules = match (rules_file, &etcd.rules_key) {
            (Some(_), Some(_)) => {
                return Err(doc.error(
                    "etcd.rules_key",
                    "give either `rules` or `etcd.rules_key`, not both",
                ));
            }
            (Some(file), None) => Rules::File(file),
            (None, Some(key)) => Rules::Etcd(Box::new(settings.clone()), key.clone()),
            (None, None) => Rules::None,
        };
        return Ok((Discovery::Etcd(Box::new(settings)), rules));
    }
    let _ = doc;
    let rules = rules_file.map_or(Rules::None, Rules::File);
    let discovery = instances.map_or(Discovery::Embedded, Discovery::File);
    Ok((discovery, rules))
}
