//! The response future of [`Edge`](super::Edge).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderValue, Response, header::CONTENT_TYPE};
use pin_project_lite::pin_project;

use super::{body::EdgeBody, refusal::Refusal};
use crate::extract::StainedFuture;

pin_project! {
    /// The response future of [`Edge`](super::Edge): the inner service's response, run
    /// with the request's stain, or the edge's own answer to a request it refused.
    #[must_use = "futures do nothing unless polled"]
    pub struct EdgeFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Passed { #[pin] inner: StainedFuture<F> },
        Refused { refusal: Refusal, grpc: bool },
    }
}

// === impl EdgeFuture ===

impl<F> EdgeFuture<F> {
    pub(crate) fn passed(inner: StainedFuture<F>) -> Self {
        EdgeFuture {
            state: State::Passed { inner },
        }
    }

    /// The edge's own answer: JSON, or a gRPC status to a gRPC request (`grpc`).
    pub(crate) fn refused(refusal: Refusal, grpc: bool) -> Self {
        EdgeFuture {
            state: State::Refused { refusal, grpc },
        }
    }
}

impl<F> fmt::Debug for EdgeFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Passed { .. } => "passed",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("EdgeFuture").field("state", &state).finish()
    }
}

impl<F, B, E> Future for EdgeFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<EdgeBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Passed { inner } => inner
                .poll(cx)
                .map(|result| result.map(|res| res.map(EdgeBody::inner))),
            StateProj::Refused {
                refusal,
                grpc: true,
            } => {
                let mut res = Response::new(EdgeBody::from_answer(Bytes::new()));
                crate::grpc::answer(&mut res, refusal.status(), &refusal.message());
                Poll::Ready(Ok(res))
            }
            StateProj::Refused {
                refusal,
                grpc: false,
            } => {
                let mut res = Response::new(EdgeBody::from_answer(refusal.body()));
                *res.status_mut() = refusal.status();
                res.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                Poll::Ready(Ok(res))
            }
        }
    }
}
