//! [`RetryFuture`]: one request through a [`Retry`](super::Retry), attempt after attempt.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use gray_core::unsent::Unsent;
use http::Request;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use super::{ReplayBody, service::copy};
use crate::{
    Balance, RequestStain,
    health::Failure,
    index::{Entry, Tried},
    meter::{Completion, Ticket},
    pick::Routed,
};

pin_project! {
    /// The response future of [`Retry`](super::Retry): it waits for the picked endpoint's
    /// readiness, calls it, reports the outcome to its load and health, and when the
    /// attempt failed where that is safe, picks another endpoint and sends the request
    /// again.
    #[must_use = "futures do nothing unless polled"]
    #[project = RetryFutureProj]
    pub struct RetryFuture<K, S, B>
    where
        K: Send,
        K: Sync,
        S: Service<Request<ReplayBody<B>>>,
        S: Send,
        S: Sync,
    {
        #[pin]
        state: State<S, Request<ReplayBody<B>>, S::Future>,
        ticket: Option<Ticket<Entry<K, S>>>,
        // The balancer, while the request may still be retried.
        balance: Option<Balance<K, S>>,
        // A copy of each attempt's request is kept while it is in flight.
        keep: bool,
        idempotent: bool,
        retries: u32,
        tried: Tried,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req, F> {
        // Waiting for the endpoint's readiness.
        Ready { service: S, request: Option<Req> },
        // The copy to send again, when one is kept: made as the attempt is called, so that
        // the future holds one request at a time (it moves through the layers by value).
        Called { #[pin] future: F, copy: Option<Req> },
        Failed { error: Option<BoxError> },
    }
}

impl<K, S, B> RetryFuture<K, S, B>
where
    K: Send + Sync,
    S: Service<Request<ReplayBody<B>>> + Send + Sync,
{
    pub(super) fn new(
        service: S,
        request: Request<ReplayBody<B>>,
        ticket: Ticket<Entry<K, S>>,
        balance: Option<Balance<K, S>>,
        keep: bool,
        idempotent: bool,
    ) -> Self {
        RetryFuture {
            state: State::Ready {
                service,
                request: Some(request),
            },
            ticket: Some(ticket),
            balance,
            keep,
            idempotent,
            retries: 0,
            tried: Tried::NONE,
        }
    }

    pub(super) fn failed(error: BoxError) -> Self {
        RetryFuture {
            state: State::Failed { error: Some(error) },
            ticket: None,
            balance: None,
            keep: false,
            idempotent: false,
            retries: 0,
            tried: Tried::NONE,
        }
    }
}

impl<K, S, B> fmt::Debug for RetryFuture<K, S, B>
where
    K: Send + Sync,
    S: Service<Request<ReplayBody<B>>> + Send + Sync,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Ready { .. } => "waiting for the endpoint's readiness",
            State::Called { .. } => "called",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("RetryFuture")
            .field("state", &state)
            .field("retries", &self.retries)
            .finish()
    }
}

impl<K, S, B> Future for RetryFuture<K, S, B>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Service<Request<ReplayBody<B>>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    B: 'static,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let (failure, error, request) = match this.state.as_mut().project() {
                StateProj::Ready { service, request } => match ready!(service.poll_ready(cx)) {
                    Ok(()) => {
                        let Some(request) = request.take() else {
                            return Poll::Ready(Err(
                                "response future polled after completion".into()
                            ));
                        };
                        let copy = match *this.keep {
                            true => copy(&request),
                            false => None,
                        };
                        let future = service.call(request);
                        this.state.set(State::Called { future, copy });
                        continue;
                    }
                    // Never called: nothing was sent, and the request is still here.
                    Err(e) => {
                        if let Some(ticket) = this.ticket.as_mut() {
                            ticket.finish(Completion::Unready);
                        }
                        (Failure::Unsent, e.into(), request.take())
                    }
                },
                StateProj::Called { future, copy } => match ready!(future.poll(cx)) {
                    Ok(response) => {
                        if let Some(mut ticket) = this.ticket.take() {
                            ticket.finish(Completion::Success);
                        }
                        this.state.set(State::Failed { error: None });
                        return Poll::Ready(Ok(response));
                    }
                    Err(e) => {
                        let e: BoxError = e.into();
                        let mut failure = Failure::Other;
                        if let Some(ticket) = this.ticket.as_mut() {
                            failure = (ticket.meter().feedback().classify)(&*e);
                            ticket.finish(Completion::Failed(failure));
                        }
                        // An endpoint that sent nothing may have handed the request back;
                        // else the copy, if one was kept.
                        let handed = match failure.nothing_sent() {
                            true => Unsent::find(&*e).and_then(Unsent::take),
                            false => None,
                        };
                        (failure, e, handed.or_else(|| copy.take()))
                    }
                },
                StateProj::Failed { error } => {
                    return Poll::Ready(Err(error
                        .take()
                        .unwrap_or_else(|| "response future polled after completion".into())));
                }
            };
            match again(&mut this, failure, &error, request) {
                Some((service, request)) => this.state.set(State::Ready {
                    service,
                    request: Some(request),
                }),
                None => {
                    this.state.set(State::Failed { error: None });
                    return Poll::Ready(Err(error));
                }
            }
        }
    }
}

/// The next attempt after one that failed with `failure` (`error`), if the policy, the
/// budget and the endpoints allow one: the endpoint, and `request` (handed back by the
/// endpoint, else the attempt's copy).
fn again<K, S, B>(
    this: &mut RetryFutureProj<'_, K, S, B>,
    failure: Failure,
    error: &BoxError,
    request: Option<Request<ReplayBody<B>>>,
) -> Option<(S, Request<ReplayBody<B>>)>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Service<Request<ReplayBody<B>>> + Clone + Send + Sync + 'static,
{
    let balance = this.balance.as_ref()?;
    let ticket = this.ticket.take()?;
    let retries = &balance.inner.retries;
    if !retries.eligible(failure, *this.idempotent, *this.retries) {
        return None;
    }
    let failed = ticket.meter().id();
    let mut request = request?;
    if !this.tried.push(failed) {
        return None;
    }
    let chosen = balance.choose_for(request.gray_stain(), this.tried).ok()?;
    let now = match chosen.start {
        0 => balance.inner.router.clock.now(),
        start => start,
    };
    if !retries.withdraw(failure, now) {
        tracing::debug!(
            target: "gray::balance",
            service = %balance.service_name(),
            endpoint = ?ticket.owner().key,
            reason = failure.as_str(),
            error = %error,
            "no retry: the retry budget is spent",
        );
        return None;
    }
    *this.retries += 1;
    tracing::debug!(
        target: "gray::balance",
        service = %balance.service_name(),
        endpoint = ?ticket.owner().key,
        next = ?chosen.ticket.owner().key,
        reason = failure.as_str(),
        retry = *this.retries,
        error = %error,
        "retrying on another endpoint",
    );
    request.extensions_mut().remove::<Routed>();
    if let Some(routed) = chosen.routed {
        request.record_routed(routed);
    }
    *this.ticket = Some(chosen.ticket);
    Some((chosen.service, request))
}
