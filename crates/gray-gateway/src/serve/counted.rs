//! The connection's service as hyper calls it ([`Adapter`]), telling the connection's
//! [`ConnState`] of its requests ([`Counted`]) and their responses ([`CountedBody`]),
//! each through the request's [`Exchange`].

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use http_body_util::{Either, Full};

use crate::upstream::Answerer;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use pin_project_lite::pin_project;
use tower::Service;

use super::state::{ConnState, Exchange};

/// The connection's service, telling its [`ConnState`] of each request.
#[derive(Debug, Clone)]
pub(super) struct Counted<S> {
    pub(super) inner: S,
    pub(super) state: Arc<ConnState>,
    pub(super) peer: SocketAddr,
}

impl<S, B> Service<Request<Incoming>> for Counted<S>
where
    S: Service<Request<Incoming>, Response = Response<B>>,
    B: Answered,
{
    type Response = Response<CountedBody<B>>;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        // An upgrade asked for (WebSocket): noted before the edge strips `Upgrade` as a
        // hop-by-hop header (`crate::upgrade`).
        if req.version() == http::Version::HTTP_11
            && gray_discovery::http::is_upgrade_request(req.headers())
            && let Some(protocol) = req.headers().get(http::header::UPGRADE).cloned()
        {
            req.extensions_mut().insert(crate::upgrade::Offer {
                protocol,
                handoff: super::Handoff(self.state.clone()),
            });
        }
        let (flight, goaway) = self.state.begin(
            req.body().is_end_stream(),
            req.version() == http::Version::HTTP_2,
        );
        if goaway {
            let peer = self.peer;
            crate::limits::warn(crate::limits::Warning::Cancelling, |suppressed| {
                tracing::warn!(%peer, suppressed, "GOAWAY: the client cancels most of its streams (max_cancelled_streams_percent)");
            });
        }
        CountedFuture {
            inner: self.inner.call(req),
            flight: Some(flight),
        }
    }
}

pin_project! {
    /// The response future of [`Counted`]: moves the request's flight into the body.
    pub(super) struct CountedFuture<F> {
        #[pin]
        inner: F,
        flight: Option<Exchange>,
    }
}

impl<F, B, E> Future for CountedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Answered,
{
    type Output = Result<Response<CountedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx))?;
        let answerer = res.body().answered_by().cloned();
        let flight = this.flight.take().map(|mut flight| {
            flight.response_began();
            Sending {
                flight,
                answerer,
                ended: false,
            }
        });
        Poll::Ready(Ok(res.map(|inner| CountedBody { inner, flight })))
    }
}

/// A response body that can tell who answered it: the instance of an upstream response,
/// `None` for the gateway's own answers.
pub(crate) trait Answered {
    /// The service and instance that answered, if an upstream did.
    fn answered_by(&self) -> Option<&Answerer>;
}

impl Answered for Full<bytes::Bytes> {
    fn answered_by(&self) -> Option<&Answerer> {
        None
    }
}

impl<L: Answered, R: Answered> Answered for Either<L, R> {
    fn answered_by(&self) -> Option<&Answerer> {
        match self {
            Either::Left(l) => l.answered_by(),
            Either::Right(r) => r.answered_by(),
        }
    }
}

impl<B: Answered> Answered for gray_tower::edge::EdgeBody<B> {
    fn answered_by(&self) -> Option<&Answerer> {
        self.get_ref()?.answered_by()
    }
}

pin_project! {
    /// A response body that ends its request's flight when dropped.
    #[derive(Debug)]
    pub(crate) struct CountedBody<B> {
        #[pin]
        inner: B,
        flight: Option<Sending>,
    }
}

/// A response body's flight while it is sent, and who answered it, to name should
/// `send_timeout` cut it.
#[derive(Debug)]
pub(crate) struct Sending {
    flight: Exchange,
    answerer: Option<Answerer>,
    ended: bool,
}

impl Drop for Sending {
    /// A body dropped unfinished because the watchdog closed its connection for
    /// `send_timeout` is logged (WARN, at a bounded rate) with its service and instance.
    fn drop(&mut self) {
        if self.ended || !self.flight.send_expired() {
            return;
        }
        let (service, instance) = self
            .answerer
            .as_ref()
            .map_or(("-", "-"), |o| (o.service(), o.instance()));
        crate::limits::warn(crate::limits::Warning::SendTimeout, |suppressed| {
            tracing::warn!(
                service,
                instance,
                suppressed,
                "a response was cut: its client read nothing of it for send_timeout_ms"
            );
        });
    }
}

impl<B: Body> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(sending) = this.flight.as_mut() {
            match &frame {
                Some(Ok(_)) => sending.flight.frame_sent(),
                None => sending.ended = true,
                Some(Err(_)) => {}
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

/// The connection's tower service as hyper calls it: each request goes through a clone of
/// it, called at once when it is ready (the proxy stack always is), else through
/// `Oneshot`.
#[derive(Clone)]
pub(super) struct Adapter<S> {
    pub(super) service: S,
}

impl<S> hyper::service::Service<Request<Incoming>> for Adapter<S>
where
    S: Service<Request<Incoming>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        futures_util::future::Either<S::Future, tower::util::Oneshot<S, Request<Incoming>>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        use tower::ServiceExt;
        let mut service = self.service.clone();
        let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
        match service.poll_ready(&mut noop) {
            Poll::Ready(Ok(())) => futures_util::future::Either::Left(service.call(req)),
            _ => futures_util::future::Either::Right(service.oneshot(req)),
        }
    }
}
