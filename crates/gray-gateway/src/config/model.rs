//! The checked configuration, as the gateway uses it: [`Config`] and the settings it is
//! made of. Reading and checking a file into it is `super::parse`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use gray_balance::{
    Pick,
    health::{Ejection, Probe},
    retry::RetryPolicy,
};
use gray_core::{CarrierConfig, Lane};
use gray_policy::Policy;
use gray_rules::CidrList;
use gray_tower::edge::ForwardedHeader;
use http::{HeaderName, Method};

use super::{UpstreamTransport, defaults};

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
    /// Who may use the admin address (`admin_token`, `admin_token_file`,
    /// `admin_token_for_reads`).
    pub admin_access: super::AdminAccess,
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
    /// The scheduling priority of the mirrors' copies' thread (`mirror_priority`).
    pub mirror_priority: MirrorPriority,
    /// Copies are made only while the threads serving the users want the CPU at most this
    /// share of their time (`mirror_max_busy`, in (0, 1]; 1: always).
    pub mirror_max_busy: f64,
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
    /// How often the leader saves a rollout's state when nothing transitions
    /// (`save_every_ms`, default 15000); a transition is saved at once. Other gateways'
    /// views of the evidence are that old at most.
    pub save_every: Duration,
    /// How often a gateway publishes its report when it changed (`report_every_ms`,
    /// default 15000, but at most a third of the rollout's `stale_ms`: 10 s with its
    /// default); a report with news against gray is published at the next look. See the
    /// [rollout docs](crate::rollout).
    pub report_every: Duration,
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
    /// Its mirror (`[services.<name>.mirror]`): copies of baseline's requests to a lane.
    pub mirror: Option<MirrorConfig>,
}

/// Where the instances come from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Discovery {
    /// A watched file (gray-discovery's format).
    File(PathBuf),
    /// The embedded default file ([`DEFAULT_INSTANCES`](super::DEFAULT_INSTANCES)).
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
    /// How long an upstream HTTP/1.1 connection may stay idle before it is closed instead
    /// of reused (`upstream_idle_timeout_ms`, default 4 s: below common servers'
    /// keep-alive timeouts).
    pub upstream_idle_timeout: Duration,
    /// Idle upstream HTTP/1.1 connections kept over every instance together
    /// (`upstream_max_idle`, default 1024): each is a socket, counted in the descriptor
    /// budget (see the [gateway docs](crate#limits)).
    pub upstream_max_idle: usize,
    /// HTTP/2 keep-alive PINGs to the instances: after this long without a frame from an
    /// instance on its connection, idle or not
    /// (`upstream_http2_keep_alive_interval_ms`, default 0: none); see the
    /// [gateway docs](crate#limits).
    pub upstream_http2_keep_alive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed and the instance
    /// ejected (`upstream_http2_keep_alive_timeout_ms`, default 20000).
    pub upstream_http2_keep_alive_timeout: Duration,
    /// Upgraded connections (WebSocket) open at once (`max_upgraded`, default 5000; 0: no
    /// cap); more upgrade requests get 503. They count in `max_connections` too.
    pub max_upgraded: usize,
    /// How long an upgraded connection may carry no byte either way before it is closed,
    /// within twice this long (`upgraded_idle_timeout_ms`, default 300000; `None`: no
    /// limit). A WebSocket's own
    /// pings count as traffic.
    pub upgraded_idle_timeout: Option<Duration>,
    /// How many upgraded connections a rollback closes a second, with the WebSocket close
    /// code 1012 (`upgraded_close_per_second`, default 50; at least 1).
    pub upgraded_close_per_second: u32,
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
            upstream_idle_timeout: Duration::from_millis(defaults::upstream_idle_timeout_ms()),
            upstream_max_idle: defaults::upstream_max_idle(),
            upstream_http2_keep_alive_interval: None,
            upstream_http2_keep_alive_timeout: Duration::from_millis(
                defaults::upstream_http2_keep_alive_timeout_ms(),
            ),
            max_upgraded: defaults::max_upgraded(),
            upgraded_idle_timeout: millis(defaults::upgraded_idle_timeout_ms()),
            upgraded_close_per_second: defaults::upgraded_close_per_second(),
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
pub(super) fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// A service's mirror, checked: where its copies go and what bounds them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MirrorConfig {
    /// The lane whose instances get the copies (`lane`); never baseline.
    pub lane: Lane,
    /// The share of baseline's requests copied, 0 to 100 (`percent`, default 100).
    pub percent: f64,
    /// The methods copied (`methods`, default `["GET", "HEAD"]`: safe methods only).
    pub methods: Vec<Method>,
    /// A request body is teed up to this many bytes; a longer one gets no copy
    /// (`max_body_bytes`, default 65536).
    pub max_body_bytes: usize,
    /// Copies in flight at once; beyond it a copy is dropped (`max_in_flight`, default 256).
    pub max_in_flight: usize,
    /// The time a copy has for its whole answer (`timeout_ms`, default 5000).
    pub timeout: Duration,
    /// The bytes of each answer's body compared; longer bodies are compared by status and
    /// headers only (`max_compare_bytes`, default 1 MiB).
    pub max_compare_bytes: usize,
    /// Response headers never compared, beside those known to vary (`ignore_headers`).
    pub ignore_headers: Vec<HeaderName>,
    /// JSON fields never compared, as JSON pointers (`/meta/request_id`, `/items/*/ts`:
    /// `*` is any key or index) (`ignore_fields`).
    pub ignore_fields: Vec<String>,
    /// The share of copies of safe methods that also go to a second baseline instance,
    /// whose answer teaches the judge the noise and is its null, 0 to 100
    /// (`control_percent`, default 20).
    pub control_percent: f64,
    /// The judge's bound on a false alarm (`alpha`, default 0.05).
    pub alpha: f64,
    /// A difference is noise once this many controls showed it (`noise_min`, default 2).
    pub noise_min: u64,
}

/// The scheduling priority of the thread the mirrors' copies run on
/// (`mirror_priority = "low" | "normal"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum MirrorPriority {
    /// The lowest (nice 19): copies get only the CPU nothing else wants; on a saturated
    /// machine they fall behind and are dropped (the default).
    #[default]
    Low,
    /// The gateway's own: copies compete with the users' requests for the CPU (for a host
    /// with CPU to spare, where every copy should be judged).
    Normal,
}
