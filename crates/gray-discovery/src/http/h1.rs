//! HTTP/1.1 to one instance: its connections ([`Conn`]), driven by the requests that use
//! them, and a request's exchange ([`Target::run_h1`]).
//!
//! A hyper HTTP/1 connection is a future that must be polled for the connection to read and
//! write. hyper-util's pooled client spawns a task per connection for that, so each request
//! crosses two tasks and two channels. Here the request's own future polls the connection
//! until the response head arrives, and the response body ([`ResponseBody`]) polls it while
//! the body is read; when the body ends, the connection goes back to the instance's idle
//! list. One task, no hand-off, and nothing to clean up: an idle connection that the
//! instance closed is found closed (and dropped) the next time it is taken.
//!
//! A connection goes back to the idle list only once it no longer holds its request body.
//! An instance may answer before it has read the body (then close): the response ends
//! while the body is still being sent, and nobody would poll an idle connection to send
//! the rest. In a proxy, that body is the client's upload, and the client's connection
//! would wait for an unrelated request to take this one. So such a connection is closed
//! when its response ends, which drops the request body, and the request is over.

use std::{
    future::{Future, poll_fn},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::{Duration, Instant},
};

use bytes::Bytes;
use gray_core::unsent::Unsent;
use http::{Request, Response, StatusCode, Version, header::HOST};
use http_body::Body;
use hyper::{
    client::conn::http1::{Connection, SendRequest},
    rt::{Read, Write},
};
use tokio::time::Sleep;
use tower::BoxError;

use super::{
    body::{Lease, ResponseBody},
    error::Stage,
    pool::Pool,
    sent_body::{BodyProgress, SentBody},
    settings::Settings,
    target::{Deadline, MakeIo, Mode, SendBody, Target, TargetIo},
    transport::{UpstreamIo, open},
    upgrade::{Switched, Upgraded},
};

/// An HTTP/1 connection and the handle that sends requests on it.
pub(crate) struct Conn<IO: Read + Write + Unpin, B: Body + 'static> {
    pub(super) sender: SendRequest<SentBody<B>>,
    pub(super) driver: Connection<UpstreamIo<IO>, SentBody<B>>,
    /// Whether the connection has let go of the last request's body (sent it whole, or
    /// dropped it): only then may it wait idle for the next request.
    pub(super) body_released: Arc<AtomicBool>,
    /// Frames of request bodies sent so far: a body still moving holds off the response
    /// timeout.
    pub(super) body_frames: Arc<AtomicU64>,
    /// The driver finished: the connection is closed (or failed).
    pub(super) ended: bool,
    /// When it was released to the idle list.
    pub(super) idle_since: Instant,
    /// How long it had been idle when a request last took it.
    pub(super) idle_for: Duration,
    /// The pool it returns to, while it is leased.
    pub(super) pool: Option<Arc<Pool<IO, B>>>,
    /// The response timeout of the request in flight, kept for the next request: moving a
    /// registered tokio timer to a later deadline is one atomic operation, where a new timer
    /// per request takes the timer wheel's lock twice (register, deregister).
    pub(super) timer: Option<Pin<Box<Sleep>>>,
}

// === impl Conn ===

impl<IO, B> Conn<IO, B>
where
    IO: Read + Write + Unpin,
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// The HTTP/1 handshake over `io` (it sends nothing).
    pub(crate) async fn handshake(
        io: UpstreamIo<IO>,
        settings: &Settings,
    ) -> Result<Box<Self>, hyper::Error> {
        let (sender, driver) = settings.http1.handshake(io).await?;
        Ok(Box::new(Conn {
            sender,
            driver,
            body_released: Arc::new(AtomicBool::new(true)),
            body_frames: Arc::new(AtomicU64::new(0)),
            ended: false,
            idle_since: super::pool::now(),
            idle_for: Duration::ZERO,
            pool: None,
            timer: None,
        }))
    }

    /// Lets the connection read and write what it can. Never waits.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.ended && Pin::new(&mut self.driver).poll(cx).is_ready() {
            // Closed by the peer, or failed: the request or body in flight sees the error
            // through its own channel.
            self.ended = true;
        }
    }

    /// Whether a new request can be sent now: the connection is open and idle.
    ///
    /// Only a check: it leaves no waker of the task's behind (a no-op one), since the
    /// send that follows drives the connection with the task's own. A waker left in the
    /// connection's request channel here would be woken by that send, a scheduler pass
    /// per request for nothing (at one connection, callgrind: 1 k instructions).
    fn usable(&mut self) -> bool {
        let cx = &mut Context::from_waker(std::task::Waker::noop());
        self.drive(cx);
        !self.ended && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }
}

/// How long a connection must have lain idle for a request taking it to keep a copy of
/// itself, in case the instance closed it meanwhile (see `run_h1`): below common servers'
/// keep-alive timeouts by far, above the gaps of back-to-back traffic.
const STALE_AFTER: Duration = Duration::from_millis(100);

/// Whether `request` may be sent again after its connection closed before any answer: an
/// idempotent method (RFC 9110 §9.2.2) and no body to send.
fn resendable<B: Body>(request: &Request<B>) -> bool {
    request.method().is_idempotent() && request.body().is_end_stream()
}

/// A copy of a request's head, to send it again.
fn head_of(parts: &http::request::Parts) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = parts.method.clone();
    *head.uri_mut() = parts.uri.clone();
    *head.version_mut() = parts.version;
    *head.headers_mut() = parts.headers.clone();
    *head.extensions_mut() = parts.extensions.clone();
    head
}

/// Whether `error` says the connection closed before the response began: what a request
/// meets on an idle connection that the instance closed as it was reused (an incomplete
/// message, a reset, a broken pipe).
fn closed_idle(error: &hyper::Error) -> bool {
    if error.is_incomplete_message() || error.is_canceled() {
        return true;
    }
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = e.source();
    }
    false
}

/// A new connection, as an HTTP/1 request opened it.
pub(super) enum Fresh<IO: Read + Write + Unpin, B: Body + 'static> {
    Http1(Box<Conn<IO, B>>),
    /// ALPN chose HTTP/2 ([`Mode::Alpn`]): the request goes to the HTTP/2 connection.
    Http2,
}

// === impl Target: HTTP/1.1 ===

impl<C: MakeIo<IO>, IO: TargetIo, B: SendBody> Target<C, IO, B> {
    /// A new HTTP/1 connection (what the capped connects of [`Connects`] open).
    pub(super) async fn connect_h1(&mut self) -> Result<Box<Conn<IO, B>>, BoxError> {
        let (io, _) = open(self.connector.clone(), &self.uri, &self.secure).await?;
        Conn::handshake(io, &self.pool.settings)
            .await
            .map_err(|e| self.error(Stage::Handshake, e))
    }

    /// A connection for a request that found no idle one: from the instance's
    /// [`Connects`], once one is free (a connect started here if fewer than the cap run,
    /// or a connection released by another request); over TLS with ALPN to choose
    /// ([`Mode::Alpn`]), a connection of its own, which may turn out to speak HTTP/2.
    pub(super) async fn handed(&mut self) -> Result<Option<Fresh<IO, B>>, BoxError> {
        if self.mode == Mode::Alpn {
            return self.connect().await.map(Some);
        }
        let waiter = self.pool.connects.wait();
        if waiter.start {
            let mut target = self.clone();
            // Bounded like a request's connect, whether or not the request still waits.
            let limit = self.pool.settings.response_timeout;
            tokio::spawn(async move {
                let pool = target.pool.clone();
                loop {
                    let connected = match limit {
                        Some(after) => tokio::time::timeout(after, target.connect_h1())
                            .await
                            .unwrap_or_else(|_| Err(target.timeout(after))),
                        None => target.connect_h1().await,
                    };
                    if !pool.connects.finished(connected, &pool) {
                        break;
                    }
                }
            });
        }
        match waiter.handed.await {
            Ok(handed) => handed.map(|h| h.take().map(Fresh::Http1)),
            Err(_) => Err(self.error(Stage::Connect, "the connect task ended")),
        }
    }

    async fn connect(&mut self) -> Result<Fresh<IO, B>, BoxError> {
        let (io, h2) = open(self.connector.clone(), &self.uri, &self.secure).await?;
        if h2 && self.mode == Mode::Alpn {
            // The instance speaks HTTP/2 again: this connection is not needed.
            self.h2.set_speaks_http1(false);
            return Ok(Fresh::Http2);
        }
        let conn = Conn::handshake(io, &self.pool.settings)
            .await
            .map_err(|e| self.error(Stage::Handshake, e))?;
        Ok(Fresh::Http1(conn))
    }

    /// Sends `request` over HTTP/1.1.
    ///
    /// Not an `async fn`, which keeps its arguments twice in its future (as captured and as
    /// locals): this future is boxed for every request, so it is kept small (about 800
    /// bytes), with the rare connect path in a box of its own.
    pub(crate) fn run_h1(
        mut self,
        mut request: Request<B>,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Response<ResponseBody>, BoxError>> + Send + 'static {
        *request.version_mut() = Version::HTTP_11;
        let added_host = !request.headers().contains_key(HOST);
        if added_host {
            request.headers_mut().insert(HOST, self.host.clone());
        }
        async move {
            // The time the deadline was set from, when there is one: one clock read.
            let now = match deadline {
                Some((at, after)) => (at - after).into_std(),
                None => super::pool::now(),
            };
            // Set once the request was sent on an idle connection that the instance had
            // closed: it goes again, once, on a new connection.
            let mut stale = false;
            loop {
                // An idle connection that is still open, else a new one.
                let mut fresh = false;
                let mut conn = loop {
                    let idle = if stale { None } else { self.pool.take(now) };
                    match idle {
                        Some(mut conn) => {
                            if conn.usable() {
                                break conn;
                            }
                        }
                        None => {
                            fresh = true;
                            // Connecting is rare: a timer of its own, and a box, so that
                            // the request's future stays small.
                            let handed = Box::pin(self.handed());
                            let handed = match deadline {
                                Some((at, after)) => {
                                    match tokio::time::timeout_at(at, handed).await {
                                        Ok(handed) => handed,
                                        Err(_) => return Err(self.timeout(after)),
                                    }
                                }
                                None => handed.await,
                            };
                            match handed {
                                Ok(Some(Fresh::Http1(mut conn))) => {
                                    if conn.usable() {
                                        break conn;
                                    }
                                }
                                Ok(Some(Fresh::Http2)) => {
                                    if added_host {
                                        request.headers_mut().remove(HOST);
                                    }
                                    return self.run_h2(request, deadline).await;
                                }
                                Ok(None) => {}
                                // Nothing was sent: the request goes back to the caller, as
                                // it came (a retrying balancer sends it elsewhere).
                                Err(e) => {
                                    if added_host {
                                        request.headers_mut().remove(HOST);
                                    }
                                    return Err(Box::new(Unsent::new(request, e)));
                                }
                            }
                        }
                    }
                };
                if let Some((at, _)) = deadline {
                    match &mut conn.timer {
                        Some(timer) => timer.as_mut().reset(at),
                        None => conn.timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                conn.body_released.store(false, Ordering::Release);
                let progress = BodyProgress {
                    released: conn.body_released.clone(),
                    frames: conn.body_frames.clone(),
                };
                let mut frames_seen = conn.body_frames.load(Ordering::Relaxed);
                // An idempotent request with no body, on a connection that lay idle for a
                // while: its head and (empty) body are kept, so that it can go again on a
                // new connection if the instance had closed this one (its keep-alive
                // timeout and our reuse racing). A connection taken again at once (busy
                // traffic) is not one an instance's idle timer closes: no copy then.
                let mut kept = None;
                let sent =
                    if !fresh && !stale && conn.idle_for >= STALE_AFTER && resendable(&request) {
                        let (parts, body) = request.into_parts();
                        kept = Some(Box::new((head_of(&parts), body)));
                        Request::from_parts(parts, SentBody::empty(progress))
                    } else {
                        request.map(|body| SentBody::new(body, progress))
                    };
                let sent_body = sent;
                // The answer is delivered only by `conn.drive` (this task drives the
                // connection, nobody else), just before `sent` is polled: so `sent` is
                // polled with a no-op waker, and its channel cannot wake this task in the
                // pass that reads the answer. Unconstrained: tokio's budget would have the
                // channel return `Pending` and wake that no-op waker, losing the wake.
                let mut sent = std::pin::pin!(tokio::task::unconstrained(
                    conn.sender.try_send_request(sent_body)
                ));
                let result = poll_fn(|cx| {
                    conn.drive(cx);
                    let mut check = Context::from_waker(std::task::Waker::noop());
                    if let Poll::Ready(result) = sent.as_mut().poll(&mut check) {
                        return Poll::Ready(Some(result));
                    }
                    let (Some(timer), Some((_, after))) = (&mut conn.timer, deadline) else {
                        return Poll::Pending;
                    };
                    loop {
                        ready!(timer.as_mut().poll(cx));
                        // A request body still being sent, and moving since the timer was set,
                        // is bounded by its own limits (the caller's): the wait for the
                        // answer starts again.
                        let frames = conn.body_frames.load(Ordering::Relaxed);
                        if conn.body_released.load(Ordering::Acquire) || frames == frames_seen {
                            return Poll::Ready(None);
                        }
                        frames_seen = frames;
                        timer.as_mut().reset(tokio::time::Instant::now() + after);
                    }
                })
                .await;
                let Some(result) = result else {
                    // Timed out: dropping the connection closes it (its request is in flight).
                    let after = deadline.map_or(Duration::ZERO, |(_, after)| after);
                    return Err(self.timeout(after));
                };
                match result {
                    // The instance switched protocols (a WebSocket): the connection is the
                    // response's now, never idle again.
                    Ok(response) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                        return Box::pin(self.switched(conn, response, deadline)).await;
                    }
                    Ok(response) => {
                        conn.pool = Some(self.pool.clone());
                        let lease: Box<dyn Lease> = conn;
                        return Ok(response.map(|body| ResponseBody::new(body, Some(lease))));
                    }
                    // Not sent: the idle connection was closed under us. Try another one; a
                    // new connection that cannot take the request is an error.
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if !fresh => {
                            let (parts, body) = unsent.into_parts();
                            let body = body.into_inner().or_else(|| kept.take().map(|k| k.1));
                            let Some(body) = body else {
                                return Err(self.error(Stage::Send, e.into_error()));
                            };
                            request = Request::from_parts(parts, body);
                        }
                        _ => {
                            let error = e.into_error();
                            // Sent on an idle connection the instance had closed, and
                            // nothing came back: once more, on a new connection.
                            match kept.take().map(|k| *k) {
                                Some((head, body)) if closed_idle(&error) => {
                                    stale = true;
                                    request = head.map(|()| body);
                                }
                                _ => return Err(self.error(Stage::Send, error)),
                            }
                        }
                    },
                }
            }
        }
    }

    /// The answer `101 Switching Protocols` on `conn`: once hyper lets go of the
    /// connection (it does when it has read the answer's head), the connection and what
    /// hyper read past the head go with the response ([`upgraded`](super::upgraded)).
    async fn switched(
        self,
        mut conn: Box<Conn<IO, B>>,
        response: Response<hyper::body::Incoming>,
        deadline: Deadline,
    ) -> Result<Response<ResponseBody>, BoxError> {
        let released = poll_fn(|cx| {
            if conn.ended {
                return Poll::Ready(Ok(()));
            }
            let done = ready!(Pin::new(&mut conn.driver).poll(cx));
            conn.ended = true;
            Poll::Ready(done)
        });
        let released = match deadline {
            Some((at, after)) => tokio::time::timeout_at(at, released)
                .await
                .map_err(|_| self.timeout(after))?,
            None => released.await,
        };
        released.map_err(|e| self.error(Stage::Send, e))?;
        let Conn { driver, .. } = *conn;
        let parts = driver.into_parts();
        // Copied: hyper's read buffer is one allocation with the buffer it read the head
        // into, which even a short slice of it would keep for the connection's life.
        let upgraded = Upgraded::new(parts.io, Bytes::copy_from_slice(&parts.read_buf));
        let (mut head, body) = response.into_parts();
        head.extensions.insert(Switched::new(upgraded));
        Ok(Response::from_parts(head, ResponseBody::new(body, None)))
    }
}
