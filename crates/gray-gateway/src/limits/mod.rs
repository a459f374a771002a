//! What a client may cost the gateway, beyond its connections ([`serve`](crate::serve)):
//! request bodies that must keep moving ([`Paced`]).

mod body;
mod cancel;
mod fd;
mod flight;
mod warn;

use hyper_util::rt::TokioExecutor;

use crate::config::Limits;

pub(crate) use body::{Paced, SlowBody};
pub(crate) use cancel::Cancels;
pub(crate) use fd::fit as fit_descriptors;
pub use fd::raise_nofile_limit;
pub(crate) use flight::{Flight, InFlight, Refused};
pub(crate) use warn::{Warning, warn};

/// Applies the HTTP/2 limits: streams per connection, the response bytes a stream may
/// buffer beyond its client's window (a stalled reader holds at most that), the receive
/// windows (request bytes a client may send ahead), and hyper's reset-stream limits.
pub(crate) fn http2(
    builder: &mut hyper::server::conn::http2::Builder<TokioExecutor>,
    limits: &Limits,
) {
    builder
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_send_buf_size(limits.http2_max_send_buf_size)
        .initial_stream_window_size(limits.http2_stream_window)
        .initial_connection_window_size(limits.http2_connection_window)
        .max_pending_accept_reset_streams(limits.http2_max_pending_accept_reset_streams)
        .max_local_error_reset_streams(limits.http2_max_local_error_reset_streams);
}

/// A client's request body, as the gateway forwards it: paced, and teed to a mirror's copy
/// when it is copied.
pub(crate) type ClientBody = crate::mirror::Teed<Paced<hyper::body::Incoming>>;
