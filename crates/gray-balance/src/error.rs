//! Errors of the balancer, and the status a gateway answers them with.
//!
//! A request that no instance may serve (none at all, none that fits its stain, or none
//! ready in a subset whose policy fails fast) fails at once with [`Unroutable`] (from
//! [`gray_policy`]), which names the service, the lane and the policy. Endpoint errors
//! pass through as they are. A failing discovery stream does not fail requests: the
//! background task logs it (`tracing`, warn), keeps the endpoints it has and polls the
//! stream again after a backoff.
//!
//! A gateway maps every error of a balanced call with [`status_of`]: `503` for
//! [`Unroutable`], `504` for a timeout, `502` for anything else.
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

use std::error::Error;

use http::StatusCode;

pub use gray_policy::{Unroutable, UnroutableReason};

/// The status a gateway answers a failed upstream call with, found by walking `error` and
/// its sources:
///
/// | the error, or one of its sources | status |
/// |---|---|
/// | [`Unroutable`]: no instance fits the request (none at all included) | `503 Service Unavailable` |
/// | a timeout: an I/O error of kind `TimedOut` (gray-discovery's response timeout is one), `tokio::time::error::Elapsed`, `tower::timeout::error::Elapsed` | `504 Gateway Timeout` |
/// | anything else (refused, reset, not HTTP, a body that failed before its first byte) | `502 Bad Gateway` |
///
/// The gray gateway answers with this function; so can a custom one.
///
/// ```
/// use gray_balance::error::status_of;
/// use gray_policy::{Policy, route::Miss};
/// use http::StatusCode;
///
/// let policy = Policy::new();
/// let unroutable: tower::BoxError =
///     Box::new(policy.unroutable("stock", &policy.key("stock", None), &Miss::NoMatch));
/// assert_eq!(status_of(&*unroutable), StatusCode::SERVICE_UNAVAILABLE);
///
/// let timeout: tower::BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut));
/// assert_eq!(status_of(&*timeout), StatusCode::GATEWAY_TIMEOUT);
///
/// let refused: tower::BoxError =
///     Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
/// assert_eq!(status_of(&*refused), StatusCode::BAD_GATEWAY);
/// ```
#[must_use]
pub fn status_of(error: &(dyn Error + 'static)) -> StatusCode {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<Unroutable>() {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        if is_timeout(e) {
            return StatusCode::GATEWAY_TIMEOUT;
        }
        cause = e.source();
    }
    StatusCode::BAD_GATEWAY
}

/// Whether `e` itself (not its sources) is a timeout.
fn is_timeout(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        || e.is::<tokio::time::error::Elapsed>()
        || e.is::<tower::timeout::error::Elapsed>()
}
