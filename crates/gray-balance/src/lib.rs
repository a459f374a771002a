//! A per-request, label-aware tower load balancer for gray (canary) releases, shared by
//! any number of concurrent callers.
//!
//! tower's `p2c::Balance` picks an endpoint in `poll_ready`, before it has seen the
//! request, so it cannot route by the request's stain. [`Balance`] decides in `call`, in
//! the caller's task:
//!
//! 1. it reads the request's [`Stain`](gray_core::Stain) from the request extensions
//!    ([`RequestStain`]), else from the task-local ([`gray_core::task::current`]: this
//!    works because the pick runs in the caller's task, not in a `Buffer`'s worker),
//!    else it uses the policy's own lane (seed 000: a request made by the instance itself),
//!    as it does for an [unstained](gray_core::Stain::unstained) stain (an inbound request
//!    without any carrier, behind gray-tower's `ExtractStainLayer`);
//! 2. it walks the [`Policy`]'s chain of subsets (the pinned version,
//!    the lane, baseline, all, as the fallback allows; see [`gray_policy`]) over
//!    an index of ready endpoints per subset: finding the subset and picking from it costs
//!    the same for 10 or 10,000 endpoints, takes no lock and allocates nothing;
//! 3. it picks among the ready endpoints of that subset: a new endpoint's probe first
//!    (below), else by its [`Strategy`]: power of two choices over a Peak-EWMA cost (the
//!    default), or the requests in flight, or round-robin ([`Pick`] names them), or a
//!    strategy of your own ([`BalanceLayer::with_strategy`]; see [`strategy`]);
//! 4. it returns a future that waits for a clone of that endpoint to be ready, calls it
//!    and reports the outcome (round-trip time, connection errors) to the endpoint's
//!    atomics;
//! 5. when nothing fits, including when the service has no instance at all, the future
//!    fails at once with [`Unroutable`](error::Unroutable), naming the service, the lane
//!    and the policy.
//!
//! # One balancer, many callers
//!
//! A [`Balance`] is a handle: clone it into every task, connection or client that calls
//! the service; no `Buffer` and no mutex. A background task, the [`Driver`], owns the
//! index: it applies every discovery `Change` as it arrives, whether or not requests flow,
//! and ejections, readmissions and the end of probing, and publishes an immutable
//! snapshot of the index through `arc-swap` after each batch. A request loads the
//! snapshot (no lock, no reference count), walks and picks over it, and updates a few
//! atomics. [`BalanceLayer::build`] (and [`Layer::layer`](tower_layer::Layer::layer))
//! spawn the driver on the current tokio runtime; [`BalanceLayer::pair`] returns it for
//! you to spawn. It ends when the last handle is dropped. The changes the stream has ready
//! when the balancer is built (a static list, a file already read) are applied before the
//! constructor returns.
//!
//! Clients that send requests themselves (reqwest, which keeps its own connections) use
//! [`Balance::pick`]: the same decision, and a [`Picked`] endpoint to report the outcome
//! to. The `reqwest` module (feature `reqwest`) does this for
//! `http://<service>/…` URLs.
//!
//! # Readiness
//!
//! [`Balance`]'s `poll_ready` is always ready: it cannot reserve an endpoint before it
//! knows the request's stain. The picked endpoint's own `poll_ready` is awaited in the
//! response future, in the caller's task, on the clone that serves the request; the
//! request counts as in flight for that endpoint from the pick on, so concurrent picks
//! spread.
//!
//! An endpoint is *unready* when its `poll_ready` failed: the request fails with that
//! error, and the endpoint leaves the ready lists at once, still counted as present, until
//! the ejection backoff brings it back. The policy's
//! [`OnUnready`] says what a subset whose present
//! endpoints are all unready means: fail fast (`Fail`, the default: `Unroutable` with
//! reason `Unready`) or fall back as if it were empty (`Fallback`). Ejected endpoints
//! count as absent, so a subset whose endpoints are all ejected falls back whatever
//! `OnUnready` says.
//!
//! # New endpoints
//!
//! Peak-EWMA assumes a default round trip (30 ms) for an endpoint it has not measured, so
//! at low request rates p2c would keep choosing a measured endpoint over a new one. So
//! every endpoint that joins (or comes back from ejection) is *probing* until it has
//! completed 3 requests: with [`Pick::PeakEwma`] and [`Pick::PendingRequests`], a pick
//! first looks at the probing endpoints of its subset (the first 4 of them) and sends the
//! request to one that has no probe in flight. While probing, each measured round trip
//! replaces the estimate (the first request pays for the connection); after, Peak-EWMA
//! applies. So, with requests one at a time, a new endpoint gets the next request routed
//! to its subset once the endpoints that joined that subset before it have had their 3
//! probes: **N = 1** for a single new endpoint, at most `3 × k + 1` when `k` probing
//! endpoints are ahead of it (the background task takes a measured endpoint out of the
//! probing list between two requests). Probes go one at a time per endpoint, so a slow
//! new endpoint is not flooded: besides its probe, p2c sees it at the default cost.
//! [`Pick::RoundRobin`] needs no probe: an endpoint of a subset of `n` gets one of every
//! `n` requests. A strategy of your own gets probing unless its
//! [`probes`](Strategy::probes) says no.
//!
//! # Passive health and re-admission
//!
//! Consecutive connection errors eject an endpoint for a growing backoff, and one refused
//! connection ejects it at once; ejected endpoints count as absent for the fallback. An
//! ejected endpoint comes back once a [probe](health::Probe) run by the driver passes (a
//! TCP connect by default, or an HTTP or gRPC health check), not through a user's request.
//! See [`health`].
//!
//! # Retries
//!
//! [`retry::Retry`] (a layer over a balancer of HTTP endpoints) and the reqwest routing
//! send a request that an instance could not take to another instance of the same walk:
//! any request that was not sent at all (a refused connection), an idempotent one whose
//! connection broke before its response head, under a budget (20 % of the requests of
//! 10 s, plus 10 per second, by default; [`BalanceLayer::with_retry`]). A request that is
//! not copied costs nothing more (no allocation); an idempotent one is copied before it is
//! sent. See [`retry`].
//!
//! # Explanation
//!
//! Every decision emits a `tracing` event at debug level, target `gray::balance`, with
//! the lane, the pin, the subset, its size, whether a fallback was taken, whether the
//! request is a probe and the endpoint chosen. [`Balance::explain`] (over the live
//! endpoints) and [`Policy::decide`](gray_policy::Policy::decide) (over any instance list)
//! return the same decision as a value.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `hyper-util` | no | [`health::classify`] also reads hyper-util client errors that `is_connect()` (unsent) and hyper's "connection closed before message completed" (broken) |
//! | `rustls` | no | [`health::classify`] also reads a `rustls::Error` (a failed TLS handshake), bare or inside an `io::Error`, as a connection error (broken) |
//! | `grpc-health` | no | `health::Probe::grpc`: re-admission through `grpc.health.v1.Health/Check` (hyper's HTTP/2 client) |
//! | `reqwest` | no | `reqwest::RouteMiddleware`: `http://<service>/…` with reqwest goes to an instance picked by the stain, retried where safe (implies `hyper-util`) |
//!
//! A tokio runtime with the time and I/O drivers is needed (the driver's timers and
//! probes).
//!
//! # Example
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, sync::Arc, task::{Context, Poll}};
//! use gray_balance::{BalanceLayer, error::Unroutable};
//! use gray_core::{Labelled, Labels, Lane, Stain};
//! use gray_policy::Policy;
//! use tower::{Service, ServiceExt, discover::Change};
//!
//! /// An endpoint that answers with its own name. Each request calls a clone: keep
//! /// clones cheap.
//! #[derive(Clone)]
//! struct Endpoint(&'static str, Arc<Labels>);
//!
//! impl Labelled for Endpoint {
//!     fn labels(&self) -> &Labels { &self.1 }
//! }
//!
//! impl Service<http::Request<()>> for Endpoint {
//!     type Response = &'static str;
//!     type Error = Infallible;
//!     type Future = Ready<Result<&'static str, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, _: http::Request<()>) -> Self::Future { ready(Ok(self.0)) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! let gray = Labels::from_iter([("gray", "true")]);
//! let endpoints = futures_util::stream::iter([
//!     Ok::<_, Infallible>(Change::Insert(1, Endpoint("base-1", Arc::new(Labels::new())))),
//!     Ok(Change::Insert(2, Endpoint("gray-1", Arc::new(gray)))),
//! ]);
//! let balance = BalanceLayer::new("svc-b", Policy::seed_000()).build(endpoints);
//!
//! // Eight concurrent callers share one balancer: each holds a clone of the handle.
//! let callers: Vec<_> = (0..8)
//!     .map(|i| {
//!         let balance = balance.clone();
//!         tokio::spawn(async move {
//!             let mut request = http::Request::new(());
//!             if i % 2 == 0 {
//!                 request.extensions_mut().insert(Stain::in_lane(Lane::new("gray")?));
//!             }
//!             balance.oneshot(request).await
//!         })
//!     })
//!     .collect();
//! for (i, caller) in callers.into_iter().enumerate() {
//!     let served = caller.await??;
//!     assert_eq!(served, if i % 2 == 0 { "gray-1" } else { "base-1" });
//! }
//!
//! // No extension: the caller's task-local stain routes the request.
//! let gray = Stain::in_lane(Lane::new("gray")?);
//! let served = gray_core::task::scope(gray, balance.clone().oneshot(http::Request::new(()))).await?;
//! assert_eq!(served, "gray-1");
//!
//! // A service without instances fails at once.
//! let none = futures_util::stream::empty::<Result<Change<u32, Endpoint>, Infallible>>();
//! let empty = BalanceLayer::new("svc-c", Policy::seed_000()).build(none);
//! let err = empty.oneshot(http::Request::new(())).await.unwrap_err();
//! assert_eq!(err.downcast_ref::<Unroutable>().unwrap().service(), "svc-c");
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod chunked;
mod driver;
mod index;
mod layer;
mod meter;
mod pick;
mod service;

pub mod error;
pub mod future;
pub mod health;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod retry;
pub mod strategy;

pub use gray_core::{Labelled, Labels};
/// The routing policy types a balancer is built with, re-exported from [`gray_core`] so
/// that a balancer needs no other gray dependency.
pub use gray_policy::{Fallback, OnUnready, Policy, PolicyConfig, Unlabelled};

pub use self::{
    driver::Driver,
    layer::BalanceLayer,
    pick::{Pick, Picked, RecordRouted, Routed},
    service::{Balance, RequestStain},
    strategy::Strategy,
};

#[cfg(test)]
mod test;
