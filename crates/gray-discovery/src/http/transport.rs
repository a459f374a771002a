//! What a connection runs over: the connector's IO, or TLS over it; and opening one.

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use tower::BoxError;
use tower_service::Service;

use super::error::{RequestError, Stage};

/// A connection's IO: the connector's, or (feature `tls`) a TLS session over it. Boxed,
/// a TLS session keeps a plain connection's allocation small.
pub(crate) enum UpstreamIo<IO> {
    Plain(IO),
    #[cfg(feature = "tls")]
    Tls(Box<super::tls::Stream<IO>>),
}

// === impl UpstreamIo ===

impl<IO: Read + Write + Unpin> Read for UpstreamIo<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl<IO: Read + Write + Unpin> Write for UpstreamIo<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_flush(cx),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(io) => io.is_write_vectored(),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            UpstreamIo::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }
}

/// How one instance's connections are secured, decided once when its endpoint is made.
#[derive(Clone)]
pub(crate) enum Secure {
    /// The connector's IO as it is.
    Plain,
    /// TLS over it (feature `tls`).
    #[cfg(feature = "tls")]
    Tls(super::tls::Target),
    /// The instance needs TLS and these endpoints cannot give it: every connection fails
    /// with this reason, before anything is sent.
    Refused(Arc<str>),
}

// === impl Secure ===

impl Secure {
    /// Whether connections run TLS (and so can negotiate HTTP/2 by ALPN).
    pub(crate) fn is_tls(&self) -> bool {
        !matches!(self, Secure::Plain)
    }
}

/// A new connection to `uri` through `connector`, secured as `secure` says, and whether
/// ALPN chose HTTP/2 on it.
pub(crate) async fn open<C>(
    mut connector: C,
    uri: &Uri,
    secure: &Secure,
) -> Result<(UpstreamIo<C::Response>, bool), RequestError>
where
    C: Service<Uri>,
    C::Error: Into<BoxError>,
    C::Response: Read + Write + Unpin,
{
    let error = |stage, e| RequestError::new(stage, uri.clone(), e);
    if let Secure::Refused(reason) = secure {
        return Err(error(Stage::Tls, BoxError::from(&**reason)));
    }
    poll_fn(|cx| connector.poll_ready(cx))
        .await
        .map_err(|e| error(Stage::Connect, e.into()))?;
    let io = connector
        .call(uri.clone())
        .await
        .map_err(|e| error(Stage::Connect, e.into()))?;
    match secure {
        #[cfg(feature = "tls")]
        Secure::Tls(target) => {
            let (stream, h2) = target
                .handshake(io)
                .await
                .map_err(|e| error(Stage::Tls, e.into()))?;
            Ok((UpstreamIo::Tls(Box::new(stream)), h2))
        }
        _ => Ok((UpstreamIo::Plain(io), false)),
    }
}
