//! Errors of the balancer.
//!
//! A request that no instance may serve fails with [`Unroutable`] (from
//! [`gray_core::matching`]), which names the service, the lane and the policy; a gateway
//! downcasts the [`tower::BoxError`] to it and answers 503. A failing discovery
//! stream surfaces as [`Discover`] from `poll_ready`. Endpoint errors pass through as
//! they are.
//!
//! ```
//! use gray_balance::error::{Discover, Unroutable};
//!
//! let err: tower::BoxError = Discover::new("registry unreachable".into()).into();
//! assert!(err.is::<Discover>());
//! assert_eq!(err.to_string(), "gray balancer discovery failed: registry unreachable");
//! assert!(!err.is::<Unroutable>());
//! ```

use std::fmt;

pub use gray_core::matching::{Unroutable, UnroutableReason};
use tower::BoxError;

/// The balancer's discovery stream failed.
#[derive(Debug)]
pub struct Discover(BoxError);

impl Discover {
    /// Wraps a discovery error.
    pub fn new(error: BoxError) -> Self {
        Discover(error)
    }
}

impl fmt::Display for Discover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gray balancer discovery failed: {}", self.0)
    }
}

impl std::error::Error for Discover {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
