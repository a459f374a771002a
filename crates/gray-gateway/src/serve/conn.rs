//! A client connection once its handshake is done: HTTP/2 (the client's first bytes are
//! the HTTP/2 preface: prior knowledge, or ALPN `h2` over TLS) served by hyper for the
//! connection's life, or HTTP/1.1 served in **bursts**, parked between them.
//!
//! hyper keeps an HTTP/1.1 connection's read buffer and write buffer (8 KiB each at
//! first) for the connection's life, with no setting to release them while it is idle:
//! 17.6 kB per idle keep-alive connection, where nginx keeps about 0.5 kB. So a burst is
//! one hyper connection over the client's socket, run while the client sends; once the
//! connection has nothing left to do until its client sends again
//! ([`ConnState::parkable`](super::state::ConnState::parkable):
//! the last request had no body, its response is finished and flushed, and the last read
//! found nothing), the hyper connection is closed gracefully without shutting the socket
//! down, and dropped with its buffers. The socket is then **parked**: the task waits for
//! it to become readable holding no buffer at all, then starts the next burst with
//! whatever hyper had read ahead (a pipelined request) replayed first. A connection whose
//! last request had a body is not parked until a request without one has been served:
//! hyper may still be reading or discarding that body.
//!
//! The client sees nothing of this: the same connection, keep-alive, no `Connection:
//! close`. Limits are unchanged: the watchdog's head and idle timeouts span bursts, and a
//! drain closes a parked connection at once (it is idle), as it does one that has not
//! sent its first byte yet, and shuts a running burst down gracefully.

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tower::Service;

use super::{
    Server,
    counted::{Adapter, Counted},
    observed::ObservedIo,
};
use crate::drain::Member;

/// What a connection's errors are.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The first bytes of every HTTP/2 connection.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A client connection ready for HTTP: its socket, or its TLS stream over the socket.
pub(crate) trait ClientIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Ready once the client's socket has bytes to read, or is closed or failed: where a
    /// parked connection waits, holding no buffer.
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

impl ClientIo for TcpStream {
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }
}

/// Serves `io` with `service`, as HTTP/2 or as HTTP/1.1 in bursts (see the
/// [module docs](self)), as a member of the server's drain, until the client or a limit
/// closes it.
///
/// One async fn, and the service wrapped by the caller: an async fn keeps its arguments
/// for its whole life, so a connection's task would hold a second copy of each in a
/// nested one.
pub(super) async fn serve<I, S, B>(
    server: &Server,
    mut io: I,
    mut service: Adapter<Counted<S>>,
    mut member: Member,
) -> Result<(), BoxError>
where
    I: ClientIo,
    S: Service<Request, Response = http::Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Unpin
        + 'static,
    S::Future: Send + 'static,
    B: Body + super::counted::Answered + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let state = service.service.state.clone();
    // A connection that has sent nothing yet is idle: a drain closes it at once (a client's
    // pool may hold one it opened in a race and never used).
    let drained = poll_fn(|cx| match member.poll_closing(cx, None) {
        true => Poll::Ready(()),
        false => Poll::Pending,
    });
    let (h2, mut prefix) = tokio::select! {
        biased;
        read = read_version(&mut io) => read?,
        () = drained => return Ok(()),
    };
    if h2 {
        state.serving_http2();
        let io = TokioIo::new(ObservedIo::new(Prefixed::new(io, prefix), state.clone()));
        let conn = server.http2.serve_connection(io, service);
        return Ok(member
            .watch(conn)
            .with_cancels(state.cancels().clone())
            .await?);
    }
    if prefix.is_empty() {
        // Closed before its first byte.
        return Ok(());
    }
    loop {
        if prefix.is_empty() {
            // Parked: nothing buffered until the client sends (or closes).
            let (parked, drain) = (&mut io, &mut member);
            let closing = poll_fn(move |cx| {
                if drain.poll_closing(cx, None) {
                    return Poll::Ready(true);
                }
                // An error is hyper's to read and report.
                parked.poll_read_ready(cx).map(|_| false)
            })
            .await;
            if closing {
                return Ok(());
            }
        }
        state.unpark();
        let io_ = TokioIo::new(ObservedIo::new(Prefixed::new(io, prefix), state.clone()));
        let mut conn = Box::pin(server.http1.serve_connection(io_, service));
        let (mut shutting_down, mut registered) = (false, false);
        let parked = poll_fn(|cx| {
            if !registered {
                state.register(cx.waker());
                registered = true;
            }
            if !shutting_down && member.poll_closing(cx, None) {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
            }
            match conn.as_mut().poll(cx) {
                Poll::Ready(done) => Poll::Ready(Some(done)),
                Poll::Pending if !shutting_down && state.parkable(|| server.crowded()).is_ok() => {
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        if let Some(done) = parked {
            done?;
            // An upgrade: hyper wrote the `101` and let go of the connection, which is a
            // tunnel to the instance from now on (`crate::upgrade`).
            if let Some(mut tunnel) = state.take_tunnel()
                && let Some(upstream) = tunnel.take_upstream()
            {
                let parts = Pin::into_inner(conn).into_parts();
                let (inner, unread) = parts.io.into_inner().into_inner().into_parts();
                let mut ahead = BytesMut::with_capacity(unread.len() + parts.read_buf.len());
                ahead.extend_from_slice(&unread);
                ahead.extend_from_slice(&parts.read_buf);
                let client = Prefixed::new(inner, ahead.freeze());
                // Boxed: this task's future is as large as its largest state, and every
                // connection, parked ones too, would carry a tunnel's room.
                let upstream = TokioIo::new(upstream);
                Box::pin(crate::upgrade::tunnel::run(
                    *tunnel,
                    client,
                    upstream,
                    &mut member,
                ))
                .await;
            }
            return Ok(());
        }
        // Idle between requests: closing it gracefully ends the burst at once, and
        // `without_shutdown` hands the socket back instead of shutting it down.
        conn.as_mut().graceful_shutdown();
        let parts = Box::pin(Pin::into_inner(conn).without_shutdown()).await?;
        let (inner, unread) = parts.io.into_inner().into_inner().into_parts();
        io = inner;
        service = parts.service;
        // What hyper read ahead, copied: its read buffer shares one allocation with the
        // buffer this burst drops, which even an empty slice of it would keep alive.
        let mut ahead = BytesMut::with_capacity(unread.len() + parts.read_buf.len());
        ahead.extend_from_slice(&unread);
        ahead.extend_from_slice(&parts.read_buf);
        prefix = ahead.freeze();
        #[cfg(test)]
        if prefix.is_empty() {
            state.parked();
        }
    }
}

/// A request as the client's connection delivers it.
type Request = http::Request<Incoming>;

/// Reads the connection's first bytes, up to the length of the HTTP/2 preface or to the
/// first byte that differs from it: whether the client speaks HTTP/2, and the bytes read.
async fn read_version<I: AsyncRead + Unpin>(io: &mut I) -> io::Result<(bool, Bytes)> {
    let mut buf = [0; PREFACE.len()];
    let mut n = 0;
    while n < buf.len() {
        let read = io.read(&mut buf[n..]).await?;
        if read == 0 {
            break;
        }
        n += read;
        if buf[..n] != PREFACE[..n] {
            return Ok((false, Bytes::copy_from_slice(&buf[..n])));
        }
    }
    Ok((n == PREFACE.len(), Bytes::copy_from_slice(&buf[..n])))
}

// === Prefixed ===

/// A connection with bytes already read from it, which reads return first.
struct Prefixed<I> {
    io: I,
    prefix: Bytes,
}

impl<I> Prefixed<I> {
    fn new(io: I, prefix: Bytes) -> Self {
        Prefixed { io, prefix }
    }

    /// The connection, and what is left of the prefix.
    fn into_parts(self) -> (I, Bytes) {
        (self.io, self.prefix)
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
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

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
