//! The balancer's response future.
//!
//! It drives the chosen endpoint's future, tracks its load (for p2c) and reports the
//! outcome to [passive health](crate::health); or it yields the
//! [`Unroutable`](crate::error::Unroutable) error when no endpoint fits.
//!
//! ```
//! use gray_balance::{Balance, future::ResponseFuture};
//!
//! fn assert_future<F: std::future::Future>() {}
//! assert_future::<ResponseFuture<std::future::Ready<Result<u8, std::io::Error>>>>();
//! ```

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use pin_project_lite::pin_project;
use tower::{
    BoxError,
    load::{CompleteOnResponse, completion::TrackCompletionFuture, peak_ewma, pending_requests},
};

use crate::health::{Classifier, Health};

pin_project! {
    /// The response future of [`Balance`](crate::Balance).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
        health: Option<Arc<Health>>,
        classify: Classifier,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Ewma { #[pin] fut: TrackCompletionFuture<F, CompleteOnResponse, peak_ewma::Handle> },
        Pending { #[pin] fut: TrackCompletionFuture<F, CompleteOnResponse, pending_requests::Handle> },
        Plain { #[pin] fut: F },
        Failed { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn ewma(
        fut: TrackCompletionFuture<F, CompleteOnResponse, peak_ewma::Handle>,
        health: Arc<Health>,
        classify: Classifier,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Ewma { fut },
            health: Some(health),
            classify,
        }
    }

    pub(crate) fn pending(
        fut: TrackCompletionFuture<F, CompleteOnResponse, pending_requests::Handle>,
        health: Arc<Health>,
        classify: Classifier,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Pending { fut },
            health: Some(health),
            classify,
        }
    }

    pub(crate) fn plain(fut: F, health: Arc<Health>, classify: Classifier) -> Self {
        ResponseFuture {
            kind: Kind::Plain { fut },
            health: Some(health),
            classify,
        }
    }

    pub(crate) fn failed(error: BoxError, classify: Classifier) -> Self {
        ResponseFuture {
            kind: Kind::Failed { error: Some(error) },
            health: None,
            classify,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Ewma { .. } => "peak-ewma",
            Kind::Pending { .. } => "pending-requests",
            Kind::Plain { .. } => "round-robin",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = match this.kind.project() {
            KindProj::Ewma { fut } => ready!(fut.poll(cx)),
            KindProj::Pending { fut } => ready!(fut.poll(cx)),
            KindProj::Plain { fut } => ready!(fut.poll(cx)),
            KindProj::Failed { error } => {
                return Poll::Ready(Err(error
                    .take()
                    .unwrap_or_else(|| "response future polled after completion".into())));
            }
        };
        let health = this.health.take();
        Poll::Ready(match result {
            Ok(response) => {
                if let Some(h) = health {
                    h.succeeded();
                }
                Ok(response)
            }
            Err(e) => {
                let e: BoxError = e.into();
                if let Some(h) = health {
                    if (this.classify)(&*e) {
                        h.connection_failed();
                    } else {
                        h.reachable();
                    }
                }
                Err(e)
            }
        })
    }
}
