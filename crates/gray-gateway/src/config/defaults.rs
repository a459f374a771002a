//! The defaults of the configuration's keys: the file's serde defaults
//! (`super::file`) and [`Limits::default`](super::Limits) both read them.

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
pub(crate) fn upstream_idle_timeout_ms() -> u64 {
    4000
}
pub(crate) fn upstream_max_idle() -> usize {
    1024
}
pub(crate) fn upstream_http2_keep_alive_timeout_ms() -> u64 {
    20_000
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
/// Copies are made while the users' threads want the CPU at most this share of their time
/// (`mirror_max_busy`).
pub(crate) fn mirror_max_busy() -> f64 {
    0.75
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
pub(crate) fn max_upgraded() -> usize {
    5_000
}
pub(crate) fn upgraded_idle_timeout_ms() -> u64 {
    300_000
}
pub(crate) fn upgraded_close_per_second() -> u32 {
    50
}
