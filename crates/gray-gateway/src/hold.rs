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

use crate::upstream::Tally;

/// A response head held until its body's first frame; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Hold {
    response: Option<(Response<ResponseBody>, Tally)>,
    /// Set on the first poll that finds no frame (with a bound above zero).
    timer: Option<Pin<Box<Sleep>>>,
}

/// What came of a [`Hold`].
// Returned once per request and moved on at once: boxing the response would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Held {
    /// The head goes to the client, with the body's first frame (or its end) in front of
    /// the rest, or as it is once the bound elapsed.
    Released(Response<HeldBody>, Tally),
    /// The body failed before its first frame.
    Failed(hyper::Error, Tally),
}

// === impl Hold ===

impl Hold {
    pub(crate) fn new(response: Response<ResponseBody>, tally: Tally) -> Self {
        Hold {
            response: Some((response, tally)),
            timer: None,
        }
    }

    /// Polls the body for its first frame, for at most `bound` since the first poll.
    /// `None` once it has resolved.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, bound: Duration) -> Poll<Option<Held>> {
        let Some((response, _)) = self.response.as_mut() else {
            return Poll::Ready(None);
        };
        let (first, ended) = match Pin::new(response.body_mut()).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => (Some(frame), false),
            Poll::Ready(None) => (None, true),
            Poll::Ready(Some(Err(e))) => {
                return Poll::Ready(self.response.take().map(|(_, t)| Held::Failed(e, t)));
            }
            Poll::Pending => {
                if !bound.is_zero() {
                    let timer = self
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(bound)));
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                (None, false)
            }
        };
        Poll::Ready(self.response.take().map(|(response, tally)| {
            let response = response.map(|rest| HeldBody {
                first,
                // An ended body has released its connection: it is not polled again.
                rest: (!ended).then_some(rest),
            });
            Held::Released(response, tally)
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
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
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
