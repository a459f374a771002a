//! HTTP/1.1 upgrades (WebSocket): the connection of a `101 Switching Protocols` answer,
//! handed to the caller ([`upgraded`]) instead of going back to the idle list.
//!
//! A request that asks for an upgrade (`Connection: upgrade` and an `Upgrade` header, as a
//! WebSocket handshake does) goes out like any other, on an idle connection or a new one.
//! When the instance answers `101`, hyper lets go of the connection once the answer's
//! head is read; the connection then leaves the pool for good, and the response carries
//! it, with whatever the instance sent after its head (the first frames of the new
//! protocol), for [`upgraded`] to take. Any other answer is an ordinary response on an
//! ordinary connection. Over HTTP/2 there is no `Upgrade`: an endpoint of an instance
//! that speaks HTTP/2 fails such a request with a [`RequestError`](super::RequestError)
//! that says so (give the endpoints [`Protocol::Http1`](super::Protocol::Http1)).
//!
//! ```
//! use gray_discovery::http::{Upgraded, upgraded};
//!
//! // A response that is no upgrade carries no connection.
//! let mut response = http::Response::new(());
//! let none: Option<Upgraded> = upgraded(&mut response);
//! assert!(none.is_none());
//! ```

use std::{
    fmt, io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Response, header};
use hyper::rt::{Read, ReadBufCursor, Write};

/// The I/O of an upgraded connection, whatever it runs over (TCP, TLS).
trait Io: Read + Write + Unpin + Send {}

impl<T: Read + Write + Unpin + Send> Io for T {}

/// The connection of a `101 Switching Protocols` answer: the bytes the instance sent after
/// its answer's head come first, then the connection's own. It implements hyper's
/// [`Read`] and [`Write`]; wrap it in `hyper_util::rt::TokioIo` for tokio's `AsyncRead`
/// and `AsyncWrite`.
pub struct Upgraded {
    io: Box<dyn Io>,
    ahead: Bytes,
}

impl fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upgraded")
            .field("ahead", &self.ahead.len())
            .finish_non_exhaustive()
    }
}

impl Upgraded {
    pub(crate) fn new<T: Read + Write + Unpin + Send + 'static>(io: T, ahead: Bytes) -> Self {
        Upgraded {
            io: Box::new(io),
            ahead,
        }
    }
}

impl Read for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        if self.ahead.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.ahead.len().min(buf.remaining());
        buf.put_slice(&self.ahead[..n]);
        self.ahead.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl Write for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The extension a `101` response carries its connection in (taken once).
#[derive(Clone)]
pub(crate) struct Switched(Arc<Mutex<Option<Upgraded>>>);

impl Switched {
    pub(crate) fn new(upgraded: Upgraded) -> Self {
        Switched(Arc::new(Mutex::new(Some(upgraded))))
    }
}

/// Takes the upgraded connection out of a `101 Switching Protocols` response of an
/// [`HttpEndpoint`](super::HttpEndpoint) (see [the module](super), *Upgrades*): `None` for any
/// other response, or once taken.
pub fn upgraded<B>(response: &mut Response<B>) -> Option<Upgraded> {
    let switched = response.extensions_mut().remove::<Switched>()?;
    let mut slot = switched.0.lock().unwrap_or_else(|p| p.into_inner());
    slot.take()
}

/// Whether a request's headers ask for an HTTP/1.1 upgrade: an `Upgrade` header and
/// `upgrade` among the `Connection` header's options (RFC 9110 §7.8).
#[must_use]
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|option| option.trim().eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_request_names_upgrade_among_its_connection_options() {
        let mut headers = HeaderMap::new();
        assert!(!is_upgrade_request(&headers));
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(!is_upgrade_request(&headers), "no Connection: upgrade");
        headers.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(is_upgrade_request(&headers));
        headers.remove(header::UPGRADE);
        assert!(!is_upgrade_request(&headers), "no Upgrade header");
    }
}
