//! A request body as hyper's HTTP/2 client takes it ([`H2Body`]): `Unpin` whatever the
//! body, and able to give the body back while hyper has not polled it, so that a request
//! hyper hands back unsent (its connection closed, or began shutting down with `GOAWAY`)
//! can go back to the caller whole ([`Unsent`](gray_core::unsent::Unsent)) and on to
//! another instance.
//!
//! hyper's HTTP/2 client needs an `Unpin` body; a `Pin<Box<B>>` is one, but a body pinned
//! can never be moved out again. `H2Body` keeps it in a plain `Box` until its first
//! `poll_frame`, and pins it then (`Box::into_pin`: the box moves, not the body).

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use http_body::{Body, Frame, SizeHint};

/// See the [module docs](self).
pub(crate) enum H2Body<B> {
    /// Not polled yet: the body can be taken back. `None` only for a moment, in
    /// `poll_frame`.
    Fresh(Option<Box<B>>),
    /// Polled: sent (in part), pinned for good.
    Pinned(Pin<Box<B>>),
}

impl<B> H2Body<B> {
    pub(crate) fn new(body: B) -> Self {
        H2Body::Fresh(Some(Box::new(body)))
    }

    /// The body, if hyper never polled it.
    pub(crate) fn into_inner(self) -> Option<B> {
        match self {
            H2Body::Fresh(Some(body)) => Some(*body),
            _ => None,
        }
    }
}

impl<B: Body> Body for H2Body<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if let H2Body::Fresh(body) = this {
            let Some(body) = body.take() else {
                return Poll::Ready(None);
            };
            *this = H2Body::Pinned(Box::into_pin(body));
        }
        match this {
            H2Body::Pinned(body) => body.as_mut().poll_frame(cx),
            H2Body::Fresh(_) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            H2Body::Fresh(Some(body)) => body.is_end_stream(),
            H2Body::Fresh(None) => true,
            H2Body::Pinned(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            H2Body::Fresh(Some(body)) => body.size_hint(),
            H2Body::Fresh(None) => SizeHint::with_exact(0),
            H2Body::Pinned(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[tokio::test]
    async fn given_back_until_polled_then_streamed_as_it_was() {
        let body = H2Body::new(Full::new(Bytes::from_static(b"abc")));
        assert_eq!(body.size_hint().exact(), Some(3));
        let back = body.into_inner().expect("never polled: given back");
        let mut body = H2Body::new(back);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        assert!(body.is_end_stream());
        assert!(body.into_inner().is_none(), "polled: pinned for good");
    }
}
