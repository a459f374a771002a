//! A per-request, label-aware tower load balancer for gray (canary) releases.
//!
//! tower's `p2c::Balance` picks an endpoint in `poll_ready`, before it has seen the
//! request, so it cannot route by the request's stain. [`Balance`] decides in `call`:
//!
//! 1. it reads the request's [`Stain`](gray_core::Stain) from the request extensions
//!    ([`RequestStain`]), else from the task-local ([`gray_core::task::current`]),
//!    else it uses the policy's own lane (seed 000: a request made by the instance itself);
//! 2. it walks the [`Policy`](gray_core::Policy)'s chain of subsets (the pinned version,
//!    the lane, baseline, all, as the fallback allows; see [`gray_core::matching`]) over
//!    an index of *ready* endpoints per subset, kept up to date on every discovery
//!    `Change` and readiness change: finding the subset and picking from it costs the
//!    same for 10 or 10,000 endpoints, and allocates nothing;
//! 3. it picks among the ready endpoints of that subset by power of two choices over
//!    tower's [`Load`](tower::load::Load) (Peak-EWMA by default), or round-robin
//!    ([`Pick`]);
//! 4. when nothing fits, the response future fails with
//!    [`Unroutable`](error::Unroutable), naming the service, the lane and the policy.
//!
//! # Readiness
//!
//! `poll_ready` drives the discovery stream and polls every endpoint that is not known to
//! be ready; it is ready when at least one endpoint is ready, and pending otherwise
//! (woken by discovery, by an endpoint, or by the end of an ejection). `call` only ever
//! calls an endpoint that was polled ready and not called since; the endpoint is polled
//! again by the next `poll_ready`.
//!
//! Because readiness is reserved before the request is seen, the *matched* subset may
//! have endpoints none of which is ready while others are. Then, with
//! [`OnUnready::Fail`](gray_core::matching::OnUnready::Fail) (the default), the request
//! fails at once with `Unroutable` (reason `Unready`), so a retry layer or the client
//! can try again; with [`OnUnready::Fallback`](gray_core::matching::OnUnready::Fallback)
//! the subset counts as absent and the policy's fallback goes on. The balancer never
//! waits for one subset inside `call`.
//!
//! # Passive health
//!
//! Consecutive connection errors eject an endpoint for a growing backoff; ejected
//! endpoints count as absent for the fallback. See [`health`].
//!
//! # Explanation
//!
//! Every decision emits a `tracing` event at debug level, target `gray::balance`, with
//! the lane, the pin, the subset, its size, whether a fallback was taken and the
//! endpoint chosen. [`Balance::explain`] (over the live endpoints) and
//! [`Policy::decide`](gray_core::Policy::decide) (over any instance list) return the same
//! decision as a value.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `hyper-util` | no | [`health::is_connection_error`] also recognises hyper-util client errors that `is_connect()` |
//!
//! A tokio runtime with the time driver is needed once an endpoint is ejected (the end
//! of an ejection is a timer).
//!
//! # Example
//!
//! ```
//! use std::{convert::Infallible, future::{Ready, ready}, task::{Context, Poll}};
//! use gray_balance::BalanceLayer;
//! use gray_core::{Stain, Labelled, Labels, Lane, Policy};
//! use tower::{Layer, Service, ServiceExt, discover::Change};
//!
//! /// An endpoint that answers with its own name.
//! struct Endpoint(&'static str, Labels);
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
//! let endpoints = futures_util::stream::iter([
//!     Ok::<_, Infallible>(Change::Insert(1, Endpoint("base-1", Labels::new()))),
//!     Ok(Change::Insert(2, Endpoint("gray-1", Labels::from_iter([("gray", "true")])))),
//! ]);
//! let mut balance = BalanceLayer::new("svc-b", Policy::seed_000()).layer(endpoints);
//!
//! let mut request = http::Request::new(());
//! request.extensions_mut().insert(Stain::in_lane(Lane::new("gray")?));
//! assert_eq!(balance.ready().await?.call(request).await?, "gray-1");
//!
//! let request = http::Request::new(()); // no context, no own lane: baseline
//! assert_eq!(balance.ready().await?.call(request).await?, "base-1");
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod index;
mod layer;
mod service;

pub mod error;
pub mod future;
pub mod health;

pub use self::{
    layer::BalanceLayer,
    service::{Balance, Pick, RecordRouted, RequestStain, Routed},
};

#[cfg(test)]
mod test;
