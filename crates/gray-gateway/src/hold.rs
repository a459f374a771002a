//! Holding an upstream's response head until its body's first frame, so that an upstream
//! that fails between the two gets the client a `502` rather than a closed connection.
//!
//! Once hyper has written a response head to the client, a body that fails can only end
//! the connection: the client sees a reset and cannot tell a broken upstream from a broken
//! network. So the proxy reads the body's first frame (or its end) before it hands the
//! head to hyper, and answers `502` when the body fails first. The wait is bounded
//! ([`Config::head_hold`](crate::config::Config::head_hold), `head_hold_ms`, 200 ms by
//! default): a streaming response (server-sent events, a long poll) whose first frame
//! comes later gets its head when the bound elapses, and then streams as before. Most
//! responses arrive with their first frame in the same read as their head: for them the
//! hold costs one poll of the body, and no timer is set.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use gray_discovery::http::ResponseBody;
use http::Response;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::{
    mirror::AnswerTee,
    upstream::{Answerer, Tally},
};

/// What a response's body showed first.
#[derive(Debug)]
pub(crate) enum First {
    /// Its first frame.
    Frame(Frame<Bytes>),
    /// Its end: it was empty.
    End,
    /// An error: it failed before its first frame.
    Failed(hyper::Error),
    /// Nothing within the bound: the head goes on without it.
    Nothing,
}

/// Polls `body` once for what it shows first. Most responses bring their first frame
/// with their head: the proxy calls this as soon as the head arrives, and holds nothing.
pub(crate) fn poll_first(body: &mut ResponseBody, cx: &mut Context<'_>) -> Poll<First> {
    Pin::new(body).poll_frame(cx).map(|frame| match frame {
        Some(Ok(frame)) => First::Frame(frame),
        Some(Err(e)) => First::Failed(e),
        None => First::End,
    })
}

/// A response head held until its body's first frame, for at most its bound; see the
/// [module docs](self).
#[derive(Debug)]
pub(crate) struct Hold {
    /// Boxed, as the timer: a hold is rare, and the proxy's response future, which has
    /// room for one, moves through the layers by value.
    response: Option<Box<(Response<ResponseBody>, Tally)>>,
    timer: Pin<Box<Sleep>>,
}

// === impl Hold ===

impl Hold {
    /// Holds `response`, whose body showed nothing yet, for at most `bound`.
    pub(crate) fn new(response: Response<ResponseBody>, tally: Tally, bound: Duration) -> Self {
        Hold {
            response: Some(Box::new((response, tally))),
            timer: Box::pin(tokio::time::sleep(bound)),
        }
    }

    /// What the body showed first (or [`First::Nothing`] once the bound elapsed), with the
    /// response and its tally. `None` once it has resolved.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<(First, Response<ResponseBody>, Tally)>> {
        let Some(held) = self.response.as_mut() else {
            return Poll::Ready(None);
        };
        let first = match poll_first(held.0.body_mut(), cx) {
            Poll::Ready(first) => first,
            Poll::Pending => {
                if self.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                First::Nothing
            }
        };
        Poll::Ready(self.response.take().map(|held| {
            let (response, tally) = *held;
            (first, response, tally)
        }))
    }
}

/// The body of a response whose head was held: the first frame, already read, then the
/// rest.
#[derive(Debug)]
pub(crate) struct HeldBody {
    first: Option<Frame<Bytes>>,
    /// `None` once the body is known to have ended.
    rest: Option<ResponseBody>,
    /// The response of a gRPC call: an upstream failure mid-stream ends it with the
    /// status gRPC gives a lost transport (`UNAVAILABLE`) in trailers, not a reset.
    grpc: bool,
    /// Who answered (for the log of a body `send_timeout` cuts).
    answerer: Answerer,
    /// The tee of a mirrored request's answer, for its copy's comparison.
    tee: Option<Box<AnswerTee>>,
}

impl HeldBody {
    /// `rest`, after what it showed first (not [`First::Failed`], which gets no body);
    /// `grpc` for the response of a gRPC call, answered by `answerer`.
    pub(crate) fn new(first: First, rest: ResponseBody, grpc: bool, answerer: Answerer) -> Self {
        let (first, rest) = match first {
            First::Frame(frame) => (Some(frame), Some(rest)),
            // An ended body has released its connection: it is not polled again.
            First::End => (None, None),
            First::Nothing | First::Failed(_) => (None, Some(rest)),
        };
        HeldBody {
            first,
            rest,
            grpc,
            answerer,
            tee: None,
        }
    }

    /// The whole body, when it is all here already: its first frame was its only one (or
    /// it had none).
    pub(crate) fn whole(&self) -> Option<Bytes> {
        if !self.rest.as_ref().is_none_or(Body::is_end_stream) {
            return None;
        }
        match &self.first {
            None => Some(Bytes::new()),
            Some(frame) => frame.data_ref().cloned(),
        }
    }

    /// This body, teed for a mirror's comparison by `tee`.
    pub(crate) fn with_tee(mut self, tee: Option<Box<AnswerTee>>) -> Self {
        self.tee = tee;
        // A body that ended is not polled.
        if self.is_end_stream()
            && let Some(tee) = self.tee.as_mut()
        {
            tee.end();
        }
        self
    }

    /// The next frame (the first, already read, then the rest's).
    fn next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        match std::task::ready!(Pin::new(rest).poll_frame(cx)) {
            Some(Err(error)) if self.grpc => {
                // The instance's connection or stream went away mid-call: gRPC clients
                // retry `UNAVAILABLE` (a reset would reach them as `INTERNAL`).
                self.rest = None;
                tracing::warn!(error = %error, "gRPC upstream failed mid-stream: ended with UNAVAILABLE");
                // The answer did not finish: its copy is not judged.
                self.tee = None;
                Poll::Ready(Some(Ok(Frame::trailers(unavailable(&error)))))
            }
            frame => Poll::Ready(frame),
        }
    }
}

impl crate::serve::Answered for HeldBody {
    fn answered_by(&self) -> Option<&Answerer> {
        Some(&self.answerer)
    }
}
/// The trailers of a gRPC call whose upstream failed with `error` mid-stream.
fn unavailable(error: &hyper::Error) -> http::HeaderMap {
    let message = format!("the upstream failed mid-stream: {error}");
    gray_tower::grpc::status_trailers(14, &message)
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = std::task::ready!(this.next_frame(cx));
        if this.tee.is_some() {
            let ended = match &frame {
                Some(Ok(frame)) => {
                    if let (Some(tee), Some(data)) = (this.tee.as_mut(), frame.data_ref()) {
                        tee.feed(data);
                    }
                    // hyper stops polling a body that says it ended.
                    this.is_end_stream()
                }
                None => true,
                // Failed: the answer did not finish, its copy is not judged.
                Some(Err(_)) => {
                    this.tee = None;
                    false
                }
            };
            if ended && let Some(tee) = this.tee.as_mut() {
                tee.end();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self
            .rest
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
        if let Some(data) = self.first.as_ref().and_then(Frame::data_ref) {
            let len = data.len() as u64;
            // Upper first: each setter checks the bounds stay ordered.
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper.saturating_add(len));
            }
            hint.set_lower(hint.lower().saturating_add(len));
        }
        hint
    }
}
