//! A request body sent on an HTTP/1 connection ([`SentBody`]): it tells the connection
//! when the connection has let go of it, and how far it got ([`BodyProgress`]), so that a
//! connection goes back to the idle list only once it no longer holds a body (see
//! [`h1`](super::h1)), and a body still moving holds off the response timeout.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
};

use http_body::{Body, Frame, SizeHint};

pin_project_lite::pin_project! {
    /// A request body that tells its connection when the connection has let go of it: once
    /// written whole (or abandoned), hyper drops it.
    pub(crate) struct SentBody<B> {
        #[pin]
        inner: Sent<B>,
        progress: BodyProgress,
    }
}

pin_project_lite::pin_project! {
    #[project = SentProj]
    enum Sent<B> {
        /// The request's body, sent as it streams.
        Body { #[pin] body: B },
        /// An empty body, kept by the request (see [`SentBody::empty`]).
        Empty,
    }
}

/// What a request body tells its connection: that the connection let go of it (set when
/// dropped), and how far it got (its frames, counted meanwhile).
pub(crate) struct BodyProgress {
    /// Set once the body is dropped: written whole, or abandoned.
    pub(crate) released: Arc<AtomicBool>,
    /// Frames of request bodies sent on the connection so far.
    pub(crate) frames: Arc<AtomicU64>,
}

// === impl BodyProgress ===

impl Drop for BodyProgress {
    fn drop(&mut self) {
        self.released.store(true, Ordering::Release);
    }
}

// === impl SentBody ===

impl<B> SentBody<B> {
    /// `inner`, reporting to `progress`.
    pub(crate) fn new(inner: B, progress: BodyProgress) -> Self {
        SentBody {
            inner: Sent::Body { body: inner },
            progress,
        }
    }

    /// An empty body in place of one the request keeps (a body that was at its end
    /// already): the request can then be sent again, on another connection, if this one
    /// turns out to have been closed by the instance while it lay idle.
    pub(crate) fn empty(progress: BodyProgress) -> Self {
        SentBody {
            inner: Sent::Empty,
            progress,
        }
    }

    /// The body, unwrapped (a request hyper handed back unsent); `None` for an
    /// [`empty`](Self::empty) one, whose body the request kept.
    pub(crate) fn into_inner(self) -> Option<B> {
        match self.inner {
            Sent::Body { body } => Some(body),
            Sent::Empty => None,
        }
    }
}

impl<B: Body> Body for SentBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let SentProj::Body { body } = this.inner.project() else {
            return Poll::Ready(None);
        };
        let frame = ready!(body.poll_frame(cx));
        if let Some(Ok(_)) = frame {
            this.progress.frames.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Sent::Body { body } => body.is_end_stream(),
            Sent::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Sent::Body { body } => body.size_hint(),
            Sent::Empty => SizeHint::with_exact(0),
        }
    }
}
