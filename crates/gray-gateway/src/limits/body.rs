//! A request body that must keep moving: its next frame within `request_body_timeout`, and
//! past that, on average at least `request_body_min_rate` bytes a second (Apache's
//! `RequestReadTimeout body=…,MinRate=…`; nginx's `client_body_timeout` is the first half).
//!
//! The deadline starts `timeout` after the body is first polled; each data frame of `n`
//! bytes moves it `n / min_rate` seconds later, never further than `timeout` from now. A
//! body that misses it fails with [`SlowBody`]: the upstream request is abandoned (its
//! connection closed) and the client gets `408 Request Timeout`. A fast body costs a clock
//! read per frame; a timer is registered only once the body has to wait for its client.
//!
//! Every error of the body, a [`SlowBody`] or the client's connection failing under it
//! (an abandoned upload, a reset stream), is marked as the client's
//! ([`ClientAborted`](gray_core::aborted::ClientAborted)): the upstream send it breaks
//! counts against no instance's health, and the proxy answers it as a client abort.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use gray_core::aborted::ClientAborted;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::BoxError;

/// A request body with a progress deadline; see the [module docs](self).
pub(crate) struct Paced<B> {
    inner: B,
    pace: Option<Pace>,
}

/// The limits of one body, and where it stands.
struct Pace {
    timeout: Duration,
    /// Bytes a second past the timeout (0: none).
    min_rate: u64,
    /// Set when the body is first polled.
    deadline: Option<Instant>,
    /// Registered once the body waits for its client; moved to `deadline` when it fires.
    timer: Option<Pin<Box<Sleep>>>,
}

/// Why a request body was cut: it did not keep the pace its limits ask.
#[derive(Debug)]
pub(crate) struct SlowBody {
    timeout: Duration,
    min_rate: u64,
}

// === impl SlowBody ===

impl fmt::Display for SlowBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body made too little progress (request_body_timeout {:?}",
            self.timeout
        )?;
        if self.min_rate > 0 {
            write!(f, ", request_body_min_rate {} bytes/s", self.min_rate)?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for SlowBody {}

// === impl Paced ===

impl<B> Paced<B> {
    /// `inner`, cut when it misses its deadline; `timeout` `None` sets no limit.
    pub(crate) fn new(inner: B, timeout: Option<Duration>, min_rate: u64) -> Self {
        Paced {
            inner,
            pace: timeout.map(|timeout| Pace {
                timeout,
                min_rate,
                deadline: None,
                timer: None,
            }),
        }
    }
}

impl Pace {
    /// A data frame of `len` bytes arrived at `now`.
    fn progress(&mut self, len: usize, now: Instant) {
        let latest = now + self.timeout;
        let moved = match (self.deadline, self.min_rate) {
            (Some(deadline), rate) if rate > 0 => {
                let credit = Duration::from_secs_f64(len as f64 / rate as f64);
                (deadline + credit).min(latest)
            }
            _ => latest,
        };
        self.deadline = Some(moved);
    }

    /// The body waits for its client: whether its deadline has passed.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        timer.as_mut().poll(cx).is_ready()
    }
}

/// A client body's error, marked as the client's ([`ClientAborted`]): the upstream send
/// it breaks then counts against no instance (gray-balance's `classify`).
fn aborted(error: impl Into<BoxError>) -> BoxError {
    Box::new(ClientAborted::new(error))
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(pace) = &mut this.pace else {
            return Pin::new(&mut this.inner).poll_frame(cx).map_err(aborted);
        };
        if pace.deadline.is_none() {
            pace.deadline = Some(Instant::now() + pace.timeout);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                    pace.progress(data.map_or(0, Bytes::len), Instant::now());
                }
                Poll::Ready(frame.map(|f| f.map_err(aborted)))
            }
            Poll::Pending => {
                if pace.expired(cx) {
                    let error = SlowBody {
                        timeout: pace.timeout,
                        min_rate: pace.min_rate,
                    };
                    // Ends the body: it is not polled again.
                    this.pace = None;
                    return Poll::Ready(Some(Err(aborted(error))));
                }
                Poll::Pending
            }
        }
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

    #[test]
    fn each_byte_buys_time_up_to_the_timeout() {
        let now = Instant::now();
        let mut pace = Pace {
            timeout: Duration::from_secs(10),
            min_rate: 100,
            deadline: Some(now + Duration::from_secs(10)),
            timer: None,
        };
        // 100 bytes a second from now: one more second.
        pace.progress(100, now);
        assert_eq!(
            pace.deadline,
            Some(now + Duration::from_secs(10)),
            "capped at now + timeout"
        );
        let later = now + Duration::from_secs(5);
        pace.progress(100, later);
        assert_eq!(pace.deadline, Some(now + Duration::from_secs(11)));
        // A byte a second buys 10 ms a second: seven seconds on, the deadline has passed.
        let mut at = later;
        for _ in 0..7 {
            at += Duration::from_secs(1);
            pace.progress(1, at);
        }
        assert_eq!(pace.deadline, Some(now + Duration::from_millis(11_070)));
        assert!(pace.deadline.unwrap() < at);
    }

    #[test]
    fn without_a_rate_the_next_frame_is_due_within_the_timeout() {
        let now = Instant::now();
        let mut pace = Pace {
            timeout: Duration::from_secs(2),
            min_rate: 0,
            deadline: Some(now),
            timer: None,
        };
        pace.progress(1, now + Duration::from_secs(7));
        assert_eq!(pace.deadline, Some(now + Duration::from_secs(9)));
    }
}
