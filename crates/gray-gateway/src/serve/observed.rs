//! A client connection's I/O ([`ObservedIo`]: its socket, or its TLS stream), telling the
//! connection's [`ConnState`] when a read finds nothing, when bytes arrive, and whether
//! what was written is flushed: what [`ConnState::parkable`] and the head timeout read.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::state::ConnState;

pin_project! {
    /// A connection (its socket, or its TLS stream), telling its [`ConnState`] what its
    /// reads and writes do.
    pub(super) struct ObservedIo<I> {
        #[pin]
        io: I,
        state: Arc<ConnState>,
    }
}

impl<I> ObservedIo<I> {
    /// `io`, telling `state`.
    pub(super) fn new(io: I, state: Arc<ConnState>) -> Self {
        ObservedIo { io, state }
    }

    /// The connection, unwrapped.
    pub(super) fn into_inner(self) -> I {
        self.io
    }
}

impl<I: AsyncRead> AsyncRead for ObservedIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let Poll::Ready(read) = this.io.poll_read(cx, buf) else {
            this.state.read_pending(true);
            return Poll::Pending;
        };
        this.state.read_pending(false);
        read?;
        if buf.filled().len() > before {
            this.state.bytes_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite> AsyncWrite for ObservedIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.state.unflushed(true);
        this.io.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.project();
        ready!(this.io.poll_flush(cx))?;
        this.state.unflushed(false);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        this.state.unflushed(true);
        this.io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
