//! Errors of the balancer.
//!
//! A request that no instance may serve (none at all, none that fits its stain, or none
//! ready in a subset whose policy fails fast) fails at once with [`Unroutable`] (from
//! [`gray_policy`]), which names the service, the lane and the policy; a gateway
//! downcasts the [`tower::BoxError`] to it and answers 503. Endpoint errors pass through as
//! they are. A failing discovery stream does not fail requests: the background task logs
//! it (`tracing`, warn), keeps the endpoints it has and polls the stream again after a
//! backoff.
//!
//! ```
//! use gray_balance::error::{Unroutable, UnroutableReason};
//! use gray_policy::{Policy, route::Miss};
//!
//! let policy = Policy::seed_000();
//! let key = policy.key("stock", None);
//! let err: tower::BoxError = Box::new(policy.unroutable("stock", &key, &Miss::NoMatch));
//! let err = err.downcast::<Unroutable>().unwrap();
//! assert_eq!(err.reason(), &UnroutableReason::NoMatch);
//! assert_eq!(err.to_string(), "no instance of `stock` fits baseline (policy `seed-000`, fallback `baseline`)");
//! ```

pub use gray_policy::{Unroutable, UnroutableReason};
