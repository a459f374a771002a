//! The body of a response from an instance.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A leased HTTP/1 connection, as the response body sees it: something to drive, then
/// release.
pub(crate) trait Lease: Send {
    fn drive(&mut self, cx: &mut Context<'_>);
    fn release(self: Box<Self>);
}

/// The body of a response from an instance: hyper's body, and (HTTP/1) the connection it
/// arrives on, which reading the body drives. When the body ends the connection is reused;
/// when the body is dropped before its end, the connection is closed. Over HTTP/2 the
/// shared connection runs on a task of its own, and dropping the body resets its stream
/// only. Trailers (gRPC's `grpc-status`) are frames of the body, passed on as they come.
pub struct ResponseBody {
    inner: Incoming,
    lease: Option<Box<dyn Lease>>,
}

// === impl ResponseBody ===

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("leased", &self.lease.is_some())
            .finish()
    }
}

impl ResponseBody {
    pub(crate) fn new(inner: Incoming, lease: Option<Box<dyn Lease>>) -> Self {
        let mut body = ResponseBody { inner, lease };
        body.release_if_done();
        body
    }

    fn release_if_done(&mut self) {
        if self.inner.is_end_stream()
            && let Some(lease) = self.lease.take()
        {
            lease.release();
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(lease) = &mut this.lease {
            lease.drive(cx);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            None => {
                if let Some(lease) = this.lease.take() {
                    lease.release();
                }
            }
            Some(Ok(_)) => this.release_if_done(),
            // The connection failed: dropping the lease closes it.
            Some(Err(_)) => this.lease = None,
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
