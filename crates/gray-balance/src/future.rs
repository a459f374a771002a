//! The balancer's response future.
//!
//! It holds a clone of the picked endpoint and the request; it waits for the endpoint's
//! readiness (in the caller's task), calls it, and reports the outcome to the endpoint's
//! load and [passive health](crate::health). Or it yields the
//! [`Unroutable`](crate::error::Unroutable) error when no endpoint fits.
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, task::{Context, Poll}};
//! use gray_balance::future::BalanceFuture;
//! use tower::{Service, util::ServiceFn};
//!
//! fn assert_future<F: std::future::Future>() {}
//! type Endpoint = ServiceFn<fn(u8) -> Ready<Result<u8, Infallible>>>;
//! assert_future::<BalanceFuture<Endpoint, u8>>();
//! ```

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use crate::meter::{Completion, Ticket};

/// The former name of [`BalanceFuture`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `BalanceFuture` (one name for one thing); removed in 0.4.0"
)]
pub type ResponseFuture<S, Req> = BalanceFuture<S, Req>;

pin_project! {
    /// The response future of [`Balance`](crate::Balance).
    #[must_use = "futures do nothing unless polled"]
    pub struct BalanceFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req, S::Future>,
        ticket: Option<Ticket>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        // Waiting for the endpoint's readiness.
        Ready { service: S, request: Option<Req> },
        Called { #[pin] future: F },
        Failed { error: Option<BoxError> },
    }
}

impl<S: Service<Req>, Req> BalanceFuture<S, Req> {
    pub(crate) fn new(service: S, request: Req, ticket: Ticket) -> Self {
        BalanceFuture {
            state: State::Ready {
                service,
                request: Some(request),
            },
            ticket: Some(ticket),
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        BalanceFuture {
            state: State::Failed { error: Some(error) },
            ticket: None,
        }
    }
}

impl<S: Service<Req>, Req> fmt::Debug for BalanceFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready { .. } => "waiting for the endpoint's readiness",
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("BalanceFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, Req> Future for BalanceFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let future = match this.state.as_mut().project() {
                StateProj::Ready { service, request } => {
                    if let Err(e) = ready!(service.poll_ready(cx)) {
                        if let Some(mut ticket) = this.ticket.take() {
                            ticket.finish(Completion::Unready);
                        }
                        return Poll::Ready(Err(e.into()));
                    }
                    let Some(request) = request.take() else {
                        return Poll::Ready(Err("response future polled after completion".into()));
                    };
                    service.call(request)
                }
                StateProj::Called { future } => {
                    let result = ready!(future.poll(cx)).map_err(Into::into);
                    if let Some(mut ticket) = this.ticket.take() {
                        let completion = match &result {
                            Ok(_) => Completion::Success,
                            Err(e) => {
                                Completion::Failed((ticket.meter().feedback().classify)(&**e))
                            }
                        };
                        ticket.finish(completion);
                    }
                    this.state.set(State::Failed { error: None });
                    return Poll::Ready(result);
                }
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "response future polled after completion".into())));
                }
            };
            this.state.set(State::Called { future });
        }
    }
}
