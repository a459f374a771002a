//! Catching a body as it streams to its destination, up to a cap, for a copy (the
//! request's body for the copy's request; in a gateway, the user's answer for a
//! comparison too). The stream is never held back: a chunk is kept by its reference count
//! (nothing copied), and past the cap nothing more is kept.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

/// What was caught of a body.
#[derive(Debug)]
pub enum Caught {
    /// All of it.
    Whole(Bytes),
    /// It was longer than the cap.
    Over,
}

/// The chunks of a body so far, up to a cap.
#[derive(Debug)]
pub struct Catch {
    chunks: Vec<Bytes>,
    len: usize,
    cap: usize,
    over: bool,
}

impl Catch {
    /// Nothing caught yet, keeping up to `cap` bytes.
    #[must_use]
    pub fn new(cap: usize) -> Self {
        Catch {
            chunks: Vec::new(),
            len: 0,
            cap,
            over: false,
        }
    }

    /// Keeps `data`, unless the cap is passed (then nothing is kept any more). Returns
    /// whether the body is still within the cap.
    pub fn feed(&mut self, data: &Bytes) -> bool {
        if self.over {
            return false;
        }
        if self.len + data.len() > self.cap {
            self.over = true;
            self.chunks = Vec::new();
            return false;
        }
        if !data.is_empty() {
            self.len += data.len();
            self.chunks.push(data.clone());
        }
        true
    }

    /// The body, if it was caught whole (the chunks are handed over: a second call finds
    /// none).
    pub fn whole(&mut self) -> Option<Bytes> {
        match self.take() {
            Caught::Whole(body) => Some(body),
            Caught::Over => None,
        }
    }

    /// What was caught (the chunks are handed over: a second call finds none).
    pub fn take(&mut self) -> Caught {
        if self.over {
            return Caught::Over;
        }
        let chunks = std::mem::take(&mut self.chunks);
        Caught::Whole(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.into_iter().next().unwrap_or_default(),
            _ => {
                let mut whole = BytesMut::with_capacity(self.len);
                for chunk in chunks {
                    whole.extend_from_slice(&chunk);
                }
                whole.freeze()
            }
        })
    }
}

/// A request body's tee: the copy gets what was caught once the body ended, or [`Over`]
/// as soon as it passed the cap. A body that fails or is dropped unfinished sends
/// nothing: the copy's side sees its sender gone.
///
/// [`Over`]: Caught::Over
#[derive(Debug)]
pub struct Tee {
    catch: Catch,
    to: Option<oneshot::Sender<Caught>>,
}

impl Tee {
    /// A tee keeping up to `cap` bytes, and where the copy waits for them.
    #[must_use]
    pub fn new(cap: usize) -> (Tee, oneshot::Receiver<Caught>) {
        let (to, from) = oneshot::channel();
        (
            Tee {
                catch: Catch::new(cap),
                to: Some(to),
            },
            from,
        )
    }

    fn feed(&mut self, data: &Bytes) {
        if self.to.is_some()
            && !self.catch.feed(data)
            && let Some(to) = self.to.take()
        {
            // The copy is dropped at once; the body goes on to its destination.
            let _ = to.send(Caught::Over);
        }
    }

    fn end(&mut self) {
        if let Some(to) = self.to.take() {
            let _ = to.send(self.catch.take());
        }
    }
}

pin_project_lite::pin_project! {
    /// A body teed to a copy while it streams on ([`Tee`]); without a tee, the body as it is.
    #[derive(Debug)]
    pub struct Teed<B> {
        #[pin]
        inner: B,
        tee: Option<Box<Tee>>,
    }
}

impl<B> Teed<B> {
    /// `inner`, teed by `tee` when there is one.
    #[must_use]
    pub fn new(inner: B, tee: Option<Tee>) -> Self {
        Teed {
            inner,
            tee: tee.map(Box::new),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Teed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        if let Some(tee) = this.tee.as_mut() {
            match &frame {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        tee.feed(data);
                    }
                    // hyper stops polling a body that says it ended.
                    if this.inner.is_end_stream() {
                        tee.end();
                    }
                }
                None => tee.end(),
                // Failed: the copy goes without (its sender is dropped with the tee).
                Some(Err(_)) => *this.tee = None,
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body(chunks: &'static [&'static [u8]]) -> impl Body<Data = Bytes, Error = std::io::Error> {
        StreamBody::new(futures_util::stream::iter(
            chunks
                .iter()
                .map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(c)))),
        ))
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_caught_whole_and_goes_on_intact() {
        let (tee, caught) = Tee::new(10);
        let teed = Teed::new(body(&[b"abc", b"", b"defg"]), Some(tee));
        let through = teed.collect().await.unwrap().to_bytes();
        assert_eq!(&through[..], b"abcdefg");
        match caught.await.unwrap() {
            Caught::Whole(whole) => assert_eq!(&whole[..], b"abcdefg"),
            Caught::Over => panic!("within the cap"),
        }
    }

    #[tokio::test]
    async fn a_body_over_the_cap_goes_on_intact_and_its_copy_is_told_at_once() {
        let (tee, mut caught) = Tee::new(4);
        let mut teed = Teed::new(body(&[b"abc", b"defg", b"hij"]), Some(tee));
        let first = teed.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"abc");
        assert!(caught.try_recv().is_err(), "nothing yet: within the cap");
        let second = teed.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&second[..], b"defg");
        assert!(
            matches!(caught.try_recv(), Ok(Caught::Over)),
            "told as the cap passed"
        );
        let rest = teed.collect().await.unwrap().to_bytes();
        assert_eq!(&rest[..], b"hij");
    }

    #[tokio::test]
    async fn a_body_dropped_unfinished_sends_nothing() {
        let (tee, caught) = Tee::new(100);
        let mut teed = Teed::new(body(&[b"abc", b"def"]), Some(tee));
        let _ = teed.frame().await;
        drop(teed);
        assert!(caught.await.is_err());
    }
}
