//! Retries where they are safe: a request that an instance could not take goes to another
//! instance that fits the same stain.
//!
//! [`Retry`] is a service over a [`Balance`](crate::Balance) of HTTP endpoints (a layer:
//! [`RetryLayer`]); gray's reqwest routing (`reqwest::RouteMiddleware`) retries the same
//! way. Both follow the balancer's [`RetryPolicy`]
//! ([`BalanceLayer::with_retry`](crate::BalanceLayer::with_retry)) and share its budget
//! and its counts ([`Balance::retries`](crate::Balance::retries)).
//!
//! # Which requests are retried
//!
//! A request is sent again, to another endpoint of the same policy walk (the endpoints
//! it tried count as ejected for its next pick, so it falls back when they were the
//! only ones that fit), when its attempt failed with:
//!
//! - **nothing sent** (a [`Failure::Refused`](crate::health::Failure::Refused) or [`Failure::Unsent`](crate::health::Failure::Unsent) connection, or an
//!   endpoint whose readiness failed): whatever its method, since nothing reached the
//!   instance. A refusal also takes the endpoint out of every pick at once (see
//!   [`health`](crate::health));
//! - **a broken connection before the response head** ([`Failure::Broken`](crate::health::Failure::Broken)): only an
//!   idempotent request (RFC 9110's `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`
//!   by default; [`RetryPolicy::with_idempotent`]), and only once.
//!
//! Never retried: a request that got a response (any status), a request whose response
//! head arrived (the balancer's future has returned; nothing of the response reached
//! the caller before), an error that says nothing about the connection (a timeout), and
//! a request whose body cannot be sent again (over the cap). At most
//! [`max_retries`](RetryPolicy::with_max_retries) retries per request (2 by default).
//!
//! # The budget
//!
//! Retries are bounded by a budget per balancer: at most
//! [`budget_percent`](RetryPolicy::with_budget_percent) % of the requests of the last
//! [`window`](RetryPolicy::with_budget_window) (20 % of 10 s), plus
//! [`min_per_second`](RetryPolicy::with_min_per_second) retries per second (10), so a
//! sick service is not hit twice as hard. A retry the budget refuses fails with the
//! attempt's error, and is counted. The budget counts each request once, in two relaxed
//! atomic operations on a slot of the current second: no lock.
//!
//! # Bodies and copies
//!
//! To send a request again, the retry needs it again. An endpoint that fails before
//! sending anything may hand the request back inside its error
//! ([`Unsent`](gray_core::unsent::Unsent); gray-discovery's HTTP endpoints do): such a
//! request is retried as it is, body and all, and nothing was copied beforehand. A
//! request that may be retried after it was sent (an idempotent one), and every request
//! under [`Copies::All`] (for endpoints that drop a request they could not send, such as
//! tonic's `Channel`), is copied as each attempt is called, and the copy is kept while
//! that attempt is in flight: its head (method, URI, headers, extensions) and its body
//! through a [`ReplayBody`] that buffers what it sends, up to
//! [`max_replay_bytes`](RetryPolicy::with_max_replay_bytes) (64 KiB); beyond, the request
//! is not retried. The endpoints of a `Retry` take `http::Request<ReplayBody<B>>`.
//!
//! So a request that is not copied (a non-idempotent one, or any request when
//! [idempotent retries](RetryPolicy::with_idempotent) are off) costs a retrying balancer
//! what it costs a plain one, plus the budget's count: no allocation (the crate's
//! allocation test counts it). An empty body (a `GET`'s) is never buffered.
//!
//! Every retry is logged at debug level (target `gray::balance`: service, endpoint,
//! reason, attempt) and counted by reason ([`RetryStats`]).
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, io, sync::Arc, task::{Context, Poll}};
//! use gray_balance::{BalanceLayer, retry::{Copies, ReplayBody, Retry, RetryPolicy}};
//! use gray_core::{Labelled, Labels};
//! use gray_policy::Policy;
//! use tower::{BoxError, Service, ServiceExt, discover::Change};
//!
//! /// An endpoint whose instance is down (it refuses connections), or up.
//! #[derive(Clone)]
//! struct Endpoint { up: bool, labels: Arc<Labels> }
//!
//! impl Labelled for Endpoint {
//!     fn labels(&self) -> &Labels { &self.labels }
//! }
//!
//! impl Service<http::Request<ReplayBody<String>>> for Endpoint {
//!     type Response = &'static str;
//!     type Error = io::Error;
//!     type Future = Ready<Result<&'static str, io::Error>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: http::Request<ReplayBody<String>>) -> Self::Future {
//!         ready(if self.up { Ok("served") } else { Err(io::ErrorKind::ConnectionRefused.into()) })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let endpoints = futures_util::stream::iter([
//!     Ok::<_, Infallible>(Change::Insert(1, Endpoint { up: false, labels: Arc::default() })),
//!     Ok(Change::Insert(2, Endpoint { up: true, labels: Arc::default() })),
//! ]);
//! // These endpoints drop a request they could not send: every request is copied.
//! let balance = BalanceLayer::new("svc", Policy::new())
//!     .with_retry(RetryPolicy::new().with_copies(Copies::All))
//!     .build(endpoints);
//! let retry = Retry::new(balance.clone());
//! // Every request is served, whichever endpoint it went to first.
//! for _ in 0..4 {
//!     let request = http::Request::post("/orders").body("order".to_owned())?;
//!     assert_eq!(retry.clone().oneshot(request).await?, "served");
//! }
//! assert!(balance.retries().refused <= 1, "the dead one is out after its first refusal");
//! # Ok(())
//! # }
//! ```

mod body;
mod budget;
mod counters;
mod future;
mod policy;
mod service;

pub(crate) use self::counters::Retries;
pub use self::{
    body::{Capped, ReplayBody},
    counters::RetryStats,
    future::RetryFuture,
    policy::{Copies, RetryPolicy},
    service::{Retry, RetryLayer},
};
