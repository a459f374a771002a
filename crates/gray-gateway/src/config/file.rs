//! The configuration file as serde reads it: every table rejects unknown keys.

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf};

use gray_balance::Pick;
use gray_core::CarrierConfig;
use gray_policy::WithPolicy;
use gray_tower::edge::ForwardedHeader;

use super::TlsVersion;
use serde::Deserialize;

use super::defaults;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) listen: Option<SocketAddr>,
    pub(super) admin: Option<SocketAddr>,
    pub(super) admin_token: Option<String>,
    pub(super) admin_token_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) admin_token_for_reads: bool,
    #[serde(default)]
    pub(super) workers: usize,
    #[serde(default)]
    pub(super) trusted_clients: Vec<String>,
    #[serde(default)]
    pub(super) trusted_proxies: Vec<String>,
    #[serde(default)]
    pub(super) forwarded_header: ForwardedHeader,
    pub(super) carriers: Option<Vec<CarrierConfig>>,
    #[serde(default)]
    pub(super) strip: Vec<String>,
    #[serde(default = "yes")]
    pub(super) reject_prefix_escape: bool,
    pub(super) rules: Option<PathBuf>,
    pub(super) instances: Option<PathBuf>,
    pub(super) etcd: Option<Etcd>,
    pub(super) tls: Option<Tls>,
    #[serde(default = "defaults::upstream_timeout_ms")]
    pub(super) upstream_timeout_ms: u64,
    #[serde(default = "defaults::head_hold_ms")]
    pub(super) head_hold_ms: u64,
    #[serde(default = "defaults::header_read_timeout_ms")]
    pub(super) header_read_timeout_ms: u64,
    #[serde(default = "defaults::max_header_bytes")]
    pub(super) max_header_bytes: usize,
    #[serde(default = "defaults::idle_timeout_ms")]
    pub(super) idle_timeout_ms: u64,
    #[serde(default = "defaults::max_connections")]
    pub(super) max_connections: usize,
    #[serde(default = "defaults::release_buffers_above")]
    pub(super) release_buffers_above: usize,
    #[serde(default = "defaults::request_body_timeout_ms")]
    pub(super) request_body_timeout_ms: u64,
    #[serde(default = "defaults::request_body_min_rate")]
    pub(super) request_body_min_rate: u64,
    #[serde(default = "defaults::send_timeout_ms")]
    pub(super) send_timeout_ms: u64,
    #[serde(default = "defaults::max_in_flight")]
    pub(super) max_in_flight: usize,
    #[serde(default)]
    pub(super) max_in_flight_per_client: u32,
    #[serde(default)]
    pub(super) max_in_flight_per_instance: u32,
    #[serde(default = "defaults::max_cancelled_streams_percent")]
    pub(super) max_cancelled_streams_percent: u32,
    #[serde(default = "defaults::upstream_buffer_bytes")]
    pub(super) upstream_buffer_bytes: usize,
    #[serde(default = "defaults::upstream_max_connects")]
    pub(super) upstream_max_connects: usize,
    #[serde(default = "defaults::upstream_idle_timeout_ms")]
    pub(super) upstream_idle_timeout_ms: u64,
    #[serde(default = "defaults::upstream_max_idle")]
    pub(super) upstream_max_idle: usize,
    #[serde(default)]
    pub(super) upstream_http2_keep_alive_interval_ms: u64,
    #[serde(default = "defaults::upstream_http2_keep_alive_timeout_ms")]
    pub(super) upstream_http2_keep_alive_timeout_ms: u64,
    #[serde(default = "defaults::max_upgraded")]
    pub(super) max_upgraded: usize,
    #[serde(default = "defaults::upgraded_idle_timeout_ms")]
    pub(super) upgraded_idle_timeout_ms: u64,
    #[serde(default = "defaults::upgraded_close_per_second")]
    pub(super) upgraded_close_per_second: u32,
    #[serde(default = "defaults::http2_max_concurrent_streams")]
    pub(super) http2_max_concurrent_streams: u32,
    #[serde(default = "defaults::http2_max_send_buf_size")]
    pub(super) http2_max_send_buf_size: usize,
    #[serde(default = "defaults::http2_stream_window")]
    pub(super) http2_stream_window: u32,
    #[serde(default = "defaults::http2_connection_window")]
    pub(super) http2_connection_window: u32,
    #[serde(default = "defaults::http2_max_pending_accept_reset_streams")]
    pub(super) http2_max_pending_accept_reset_streams: usize,
    #[serde(default = "defaults::http2_max_local_error_reset_streams")]
    pub(super) http2_max_local_error_reset_streams: usize,
    #[serde(default = "defaults::metrics_max_lanes")]
    pub(super) metrics_max_lanes: usize,
    #[serde(default)]
    pub(super) seed003_headers: bool,
    #[serde(default)]
    pub(super) mirror_priority: super::MirrorPriority,
    #[serde(default = "defaults::mirror_max_busy")]
    pub(super) mirror_max_busy: f64,
    #[serde(default)]
    pub(super) services: BTreeMap<String, WithPolicy<ServiceKeys>>,
    pub(super) rollouts: Option<Rollouts>,
}

/// The `[rollouts]` table: what every service's rollout shares.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Rollouts {
    pub(super) state_dir: Option<PathBuf>,
    pub(super) interval_ms: Option<u64>,
    pub(super) history: Option<usize>,
    pub(super) partition_hold_ms: Option<u64>,
    pub(super) lease_ttl_ms: Option<u64>,
    pub(super) save_every_ms: Option<u64>,
    pub(super) report_every_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

/// The gateway's own keys of a `[services.<name>]` table, beside the policy's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServiceKeys {
    pub(super) pick: Option<Pick>,
    pub(super) retry: Option<super::upstream::RetryKeys>,
    pub(super) health_check: Option<super::upstream::HealthKeys>,
    pub(super) protocol: Option<super::transport::ProtocolKey>,
    pub(super) tls: Option<super::transport::TlsKeys>,
    pub(super) strip_prefix: Option<bool>,
    pub(super) rollout: Option<gray_rollout::RolloutConfig>,
    pub(super) mirror: Option<super::mirror::MirrorKeys>,
}

/// The `[tls]` table: a TLS listener (read whatever the features; refused by the checks
/// without the `tls` feature).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Tls {
    pub(super) listen: SocketAddr,
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
    pub(super) client_ca_file: Option<PathBuf>,
    pub(super) client_auth: Option<ClientAuth>,
    #[serde(default)]
    pub(super) min_version: TlsVersion,
    #[serde(default = "defaults::handshake_timeout_ms")]
    pub(super) handshake_timeout_ms: u64,
    #[serde(default = "defaults::tls_reload_interval_ms")]
    pub(super) reload_interval_ms: u64,
}

/// `client_auth`: whether a client must present a certificate.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum ClientAuth {
    Required,
    Optional,
}

/// The `[etcd]` table: etcd's client settings (gray-source's `EtcdConfig`, flattened) and
/// where the gateway's data lives.
#[cfg(feature = "etcd")]
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Etcd {
    #[serde(default = "defaults::etcd_prefix")]
    pub(super) prefix: String,
    pub(super) rules_key: Option<String>,
    #[serde(flatten)]
    pub(super) client: gray_tower::edge::EtcdConfig,
}

/// Without the `etcd` feature, an `[etcd]` table is read whole and rejected by the checks.
#[cfg(not(feature = "etcd"))]
pub(super) type Etcd = serde::de::IgnoredAny;
