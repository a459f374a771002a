//! The body of the edge's responses: the inner service's, or the edge's own answer.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of an [`Edge`](super::Edge) response: the inner service's body, or the
    /// edge's own answer (a small JSON object, for a request it refused; see the
    /// [module docs](super#what-the-edge-answers-itself)).
    ///
    /// It is an [`http_body::Body`] whenever the inner body is one whose data can be made
    /// from [`Bytes`]: hyper, tonic and axum bodies all are. Under axum, a
    /// `Response<EdgeBody<axum::body::Body>>` is `IntoResponse`, so an `Edge<Router>` is a
    /// router's fallback service (`Router::new().fallback_service(edge.layer(router))`),
    /// or is served after `.map_response(IntoResponse::into_response)`.
    ///
    /// ```
    /// use gray_tower::edge::EdgeBody;
    ///
    /// let passed = EdgeBody::inner("the service's body");
    /// assert!(!passed.is_answer());
    /// assert_eq!(passed.into_inner(), Some("the service's body"));
    /// ```
    pub struct EdgeBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Answer { data: Option<Bytes> },
    }
}

// === impl EdgeBody ===

impl<B> EdgeBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        EdgeBody {
            kind: Kind::Inner { body },
        }
    }

    /// The edge's own answer.
    pub(crate) fn from_answer(data: Bytes) -> Self {
        EdgeBody {
            kind: Kind::Answer { data: Some(data) },
        }
    }

    /// Whether this is the edge's own answer (the request never reached the inner service).
    #[must_use]
    pub fn is_answer(&self) -> bool {
        matches!(self.kind, Kind::Answer { .. })
    }

    /// The edge's own answer, a JSON object (`{"error": …, "reason": …, "detail": …}`),
    /// until it is read as a body; `None` for the inner service's body.
    #[must_use]
    pub fn answer(&self) -> Option<&[u8]> {
        match &self.kind {
            Kind::Answer { data } => data.as_deref(),
            Kind::Inner { .. } => None,
        }
    }

    /// A reference to the inner service's body; `None` for the edge's own answer.
    #[must_use]
    pub fn get_ref(&self) -> Option<&B> {
        match &self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Answer { .. } => None,
        }
    }

    /// The inner service's body; `None` for the edge's own answer.
    #[must_use]
    pub fn into_inner(self) -> Option<B> {
        match self.kind {
            Kind::Inner { body } => Some(body),
            Kind::Answer { .. } => None,
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for EdgeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body } => f.debug_tuple("EdgeBody::Inner").field(body).finish(),
            Kind::Answer { data } => f.debug_tuple("EdgeBody::Answer").field(data).finish(),
        }
    }
}

impl<B> Body for EdgeBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Answer { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Answer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    /// A one-frame body of `Bytes`.
    struct Once(Option<Bytes>);

    impl Body for Once {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.take().map(|d| Ok(Frame::data(d))))
        }
    }

    fn frames<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Vec<Bytes>
    where
        B::Error: fmt::Debug,
    {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(frame.expect("no error").into_data().expect("data"));
        }
        out
    }

    #[test]
    fn an_answer_is_one_frame_of_known_length() {
        let body = EdgeBody::<Once>::from_answer(Bytes::from_static(b"{\"error\":\"x\"}"));
        assert_eq!(body.size_hint().exact(), Some(13));
        assert!(!body.is_end_stream());
        assert!(body.is_answer());
        assert_eq!(body.answer(), Some(&b"{\"error\":\"x\"}"[..]));
        assert_eq!(frames(body), [Bytes::from_static(b"{\"error\":\"x\"}")]);
    }

    #[test]
    fn the_inner_body_passes_through() {
        let body = EdgeBody::inner(Once(Some(Bytes::from_static(b"inner"))));
        assert!(!body.is_answer());
        assert_eq!(frames(body), [Bytes::from_static(b"inner")]);
    }
}
