//! reqwest: the same propagation as [`PropagateStain`](crate::PropagateStain), as a
//! [`reqwest_middleware::Middleware`] (cargo feature `reqwest`).
//!
//! The context comes from the middleware extensions first, else the task-local context;
//! the rule for a request that already carries a stain is the same ([`Existing`]).
//!
//! ```no_run
//! use gray_tower::reqwest::PropagateMiddleware;
//!
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(PropagateMiddleware::new())
//!     .build();
//! # drop(client);
//! ```

use gray_core::{Carriers, Stain};
use http::Extensions;
use reqwest_middleware::{Middleware, Next, Result};

use crate::propagate::{Existing, Propagator};

/// Writes the stain onto every request a `reqwest_middleware::ClientWithMiddleware` sends.
#[derive(Debug, Clone, Default)]
pub struct PropagateMiddleware {
    propagator: Propagator,
}

impl PropagateMiddleware {
    /// Writes the default carriers (`x-gray-lane` and `x-gray-info`), keeping existing ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `carriers`, keeping existing ones.
    pub fn with_carriers(carriers: Carriers) -> Self {
        PropagateMiddleware {
            propagator: Propagator {
                carriers,
                existing: Existing::Keep,
            },
        }
    }

    /// Sets the rule for a request that already carries a stain.
    pub fn existing(mut self, existing: Existing) -> Self {
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
        self.propagator
            .apply(extensions.get::<Stain>(), req.headers_mut());
        next.run(req, extensions).await
    }
}
