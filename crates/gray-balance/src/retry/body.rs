//! [`ReplayBody`]: a request body that can be sent again.

use std::{
    error::Error,
    fmt,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll, Waker},
};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tower::BoxError;

/// A copy of a body polled after the buffer passed its cap: the request cannot be sent
/// again, and is not.
#[derive(Debug)]
pub struct Capped;

impl fmt::Display for Capped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body outgrew the replay buffer and cannot be sent again")
    }
}

impl Error for Capped {}

/// The request body of a [`Retry`](super::Retry): the body the caller gave, and what is
/// needed to send it again.
///
/// - A body that was empty when the request came (a `GET`) is sent again as empty: no
///   buffer, no allocation.
/// - A body that is kept for a retry (see [`Copies`](super::Copies)) is buffered as it is
///   sent, up to the [cap](super::RetryPolicy::with_max_replay_bytes), in a buffer its
///   copies share (as linkerd2-proxy's `ReplayBody`): the data chunks are reference-counted,
///   not copied. A copy replays the chunks, then reads on where the first stopped. A body
///   whose size hint is already over the cap, or that outgrew it while being sent, is not
///   sent again.
/// - Any other body is passed through once. It can still be sent elsewhere when the
///   endpoint hands it back unsent ([`Unsent`](gray_core::unsent::Unsent)), since nothing
///   of it was read.
pub struct ReplayBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    Empty,
    Once(B),
    Buffered {
        /// The buffer and the rest of the body, while this copy is the one being sent.
        /// Boxed: a request moves through its layers' futures by value, and most carry no
        /// body to keep.
        state: Option<Box<Buffer<B>>>,
        shared: Arc<Handoff<B>>,
        /// The next buffered chunk to replay: `None` for the first copy, which reads the
        /// body, and for a copy once it has replayed every chunk.
        replay: Option<usize>,
        replay_trailers: bool,
    },
}

/// What the copies of a buffered body share: the buffer, handed from one copy to the
/// next.
struct Handoff<B> {
    /// The state, when no copy holds it, and a copy waiting for it.
    parked: Mutex<(Option<Box<Buffer<B>>>, Option<Waker>)>,
    size_hint: SizeHint,
}

/// A buffered body: the chunks sent so far (up to the cap), and the rest unread.
struct Buffer<B> {
    chunks: Vec<Bytes>,
    /// Bytes buffered, and the cap.
    buffered: usize,
    cap: usize,
    capped: bool,
    trailers: Option<HeaderMap>,
    /// The body's unread rest; `None` once it ended.
    rest: Option<B>,
}

impl<B> Handoff<B> {
    fn lock(&self) -> MutexGuard<'_, (Option<Box<Buffer<B>>>, Option<Waker>)> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<B: Body> ReplayBody<B> {
    /// `body`, sent once.
    pub fn once(body: B) -> Self {
        if body.is_end_stream() {
            return ReplayBody { kind: Kind::Empty };
        }
        ReplayBody {
            kind: Kind::Once(body),
        }
    }

    /// `body`, buffered for a copy up to `cap` bytes; sent once when its size hint says it
    /// is larger. An empty body needs no buffer.
    pub fn buffered(body: B, cap: usize) -> Self {
        if body.is_end_stream() {
            return ReplayBody { kind: Kind::Empty };
        }
        let size_hint = body.size_hint();
        if size_hint.lower() > cap as u64 {
            return ReplayBody {
                kind: Kind::Once(body),
            };
        }
        ReplayBody {
            kind: Kind::Buffered {
                state: Some(Box::new(Buffer {
                    chunks: Vec::new(),
                    buffered: 0,
                    cap,
                    capped: false,
                    trailers: None,
                    rest: Some(body),
                })),
                shared: Arc::new(Handoff {
                    parked: Mutex::new((None, None)),
                    size_hint,
                }),
                replay: None,
                replay_trailers: false,
            },
        }
    }
}

impl<B> ReplayBody<B> {
    /// A copy that sends the same bytes again, or `None`: a body sent once, or one that
    /// outgrew the cap.
    pub fn try_clone(&self) -> Option<Self> {
        match &self.kind {
            Kind::Empty => Some(ReplayBody { kind: Kind::Empty }),
            Kind::Once(_) => None,
            Kind::Buffered { state, shared, .. } => {
                let capped = match state {
                    Some(state) => state.capped,
                    None => shared.lock().0.as_ref().is_some_and(|s| s.capped),
                };
                (!capped).then(|| ReplayBody {
                    kind: Kind::Buffered {
                        state: None,
                        shared: shared.clone(),
                        replay: Some(0),
                        replay_trailers: true,
                    },
                })
            }
        }
    }

    /// `true` for a body that was empty from the start.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(self.kind, Kind::Empty)
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Empty => "empty",
            Kind::Once(_) => "once",
            Kind::Buffered { .. } => "buffered",
        };
        f.debug_struct("ReplayBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B> Drop for ReplayBody<B> {
    /// A copy that held the state hands it to the next copy.
    fn drop(&mut self) {
        if let Kind::Buffered { state, shared, .. } = &mut self.kind
            && let Some(state) = state.take()
        {
            let mut parked = shared.lock();
            parked.0 = Some(state);
            if let Some(waker) = parked.1.take() {
                waker.wake();
            }
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match &mut this.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Once(body) => Pin::new(body).poll_frame(cx).map(|frame| {
                frame.map(|frame| {
                    frame
                        .map(|frame| frame.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(Into::into)
                })
            }),
            Kind::Buffered {
                state,
                shared,
                replay,
                replay_trailers,
            } => {
                if state.is_none() {
                    // The copy sent before must have let go of it.
                    let mut parked = shared.lock();
                    match parked.0.take() {
                        Some(taken) => *state = Some(taken),
                        None => {
                            parked.1 = Some(cx.waker().clone());
                            return Poll::Pending;
                        }
                    }
                }
                let Some(state) = state.as_mut() else {
                    return Poll::Pending;
                };
                if let Some(next) = *replay {
                    if let Some(chunk) = state.chunks.get(next) {
                        *replay = Some(next + 1);
                        return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
                    }
                    *replay = None;
                }
                if state.capped && *replay_trailers {
                    return Poll::Ready(Some(Err(Capped.into())));
                }
                if std::mem::take(replay_trailers)
                    && let Some(trailers) = &state.trailers
                {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
                }
                state.poll_rest(cx)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Once(body) => body.is_end_stream(),
            Kind::Buffered {
                state,
                replay,
                replay_trailers,
                ..
            } => match state {
                Some(state) => {
                    replay.is_none_or(|next| next >= state.chunks.len())
                        && !(*replay_trailers && state.trailers.is_some())
                        && state.rest.as_ref().is_none_or(Body::is_end_stream)
                }
                None => false,
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Once(body) => body.size_hint(),
            Kind::Buffered { shared, .. } => shared.size_hint,
        }
    }
}

impl<B> Buffer<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    /// Reads on from the body, buffering what it reads while under the cap.
    fn poll_rest(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match std::task::ready!(Pin::new(rest).poll_frame(cx)) {
            None => {
                self.rest = None;
                return Poll::Ready(None);
            }
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(mut data) => {
                let bytes = data.copy_to_bytes(data.remaining());
                if !self.capped {
                    self.buffered += bytes.len();
                    if self.buffered > self.cap {
                        // Too large to send again: this copy goes on, no other will.
                        self.capped = true;
                        self.chunks = Vec::new();
                    } else {
                        self.chunks.push(bytes.clone());
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Err(frame) => match frame.into_trailers() {
                Ok(trailers) => {
                    self.trailers = Some(trailers.clone());
                    self.rest = None;
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                // A frame of a kind http-body does not know yet: nothing to send.
                Err(_) => Poll::Ready(None),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, Empty, Full, StreamBody};

    use super::*;

    fn chunks(
        parts: &[&'static str],
    ) -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>
    {
        let frames: Vec<_> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn read<B>(body: ReplayBody<B>) -> Result<Bytes, BoxError>
    where
        B: Body + Unpin,
        B::Error: Into<BoxError>,
    {
        Ok(body.collect().await?.to_bytes())
    }

    #[tokio::test]
    async fn a_copy_replays_what_was_sent_and_reads_on() {
        let body = ReplayBody::buffered(chunks(&["ab", "cd", "ef"]), 64);
        let copy = body.try_clone().expect("under the cap");
        // The first send reads only part of it, then is dropped (the connection broke).
        let mut first = body;
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "ab");
        drop(first);
        let again = copy.try_clone().expect("a copy of a copy");
        assert_eq!(read(copy).await.unwrap(), "abcdef");
        // The whole body is buffered now.
        assert_eq!(read(again).await.unwrap(), "abcdef");
    }

    #[tokio::test]
    async fn a_body_over_the_cap_is_not_sent_again() {
        // Known too large from its size hint: passed through, no copy.
        let large = ReplayBody::buffered(Full::new(Bytes::from(vec![0; 100])), 64);
        assert!(large.try_clone().is_none());
        assert_eq!(read(large).await.unwrap().len(), 100);
        // Grows past the cap while sent: the first send completes, its copies fail.
        let body = ReplayBody::buffered(chunks(&["0123456789", "0123456789"]), 15);
        let copy = body.try_clone().expect("under the cap so far");
        assert_eq!(read(body).await.unwrap(), "01234567890123456789");
        assert!(copy.try_clone().is_none(), "capped");
        let err = read(copy).await.unwrap_err();
        assert!(err.is::<Capped>(), "{err}");
    }

    #[tokio::test]
    async fn empty_and_once() {
        let empty = ReplayBody::buffered(Empty::<Bytes>::new(), 64);
        assert!(empty.is_empty() && empty.is_end_stream());
        assert!(empty.try_clone().is_some_and(|c| c.is_empty()));
        let once = ReplayBody::once(chunks(&["x"]));
        assert!(once.try_clone().is_none());
        assert_eq!(read(once).await.unwrap(), "x");
    }
}
