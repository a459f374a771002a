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
        inner: B,
        progress: BodyProgress,
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
        SentBody { inner, progress }
    }

    /// The body, unwrapped (a request hyper handed back unsent).
    pub(crate) fn into_inner(self) -> B {
        self.inner
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
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(_)) = frame {
            this.progress.frames.fetch_add(1, Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
