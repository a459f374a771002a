//! reqwest: the same propagation as [`PropagateStain`](crate::PropagateStain), as a
//! [`reqwest_middleware::Middleware`] (cargo feature `reqwest`).
//!
//! The stain comes from the middleware extensions first, else the task-local stain (else,
//! with the `opentelemetry` feature, the lane of the current OpenTelemetry baggage, which
//! it records in the extensions): [`gray_core::task::outbound`], the same function
//! gray-balance's `RouteMiddleware` finds the stain with, so the two middlewares may be
//! listed in either order and always agree. The decision wins over carriers already on the
//! request unless [`Existing::KeepIfPresent`] says otherwise. [`ClientBuilder`] and [`ClientWithMiddleware`] are re-exported from
//! `reqwest-middleware`, so that the client needs no dependency of its own beyond `reqwest`.
//! Put this middleware after any middleware that writes `baggage` itself (an OpenTelemetry
//! propagator), so that the stain's decision is the last word.
//!
//! ```no_run
//! use gray_tower::{Carriers, reqwest::{ClientBuilder, PropagateMiddleware}};
//!
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(PropagateMiddleware::new().with_carriers(Carriers::default().with_baggage()))
//!     .build();
//! # drop(client);
//! ```

use gray_core::Carriers;
use http::Extensions;
pub use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_middleware::{Middleware, Next, Result};

use crate::propagate::{Existing, Propagator};

/// Writes the stain onto every request a `reqwest_middleware::ClientWithMiddleware` sends.
///
/// `PropagateMiddleware::new()` writes the default carriers (`x-gray-lane`, `x-gray-info`)
/// with [`Existing::Replace`]; the `with_*` setters change one setting each, in any order.
#[derive(Debug, Clone, Default)]
pub struct PropagateMiddleware {
    propagator: Propagator,
}

impl PropagateMiddleware {
    /// Writes the default carriers (`x-gray-lane` and `x-gray-info`); the decision wins.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `carriers` (use the same ones as the server layer).
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        self.propagator.carriers = carriers;
        self
    }

    /// Sets the rule for a request that already carries a stain (default
    /// [`Existing::Replace`]).
    #[must_use]
    pub fn with_existing(mut self, existing: Existing) -> Self {
        self.propagator.existing = existing;
        self
    }
}

#[async_trait::async_trait]
impl Middleware for PropagateMiddleware {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<reqwest::Response> {
        self.propagator.apply(extensions, req.headers_mut());
        next.run(req, extensions).await
    }
}
