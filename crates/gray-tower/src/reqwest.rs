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

/// Copies baseline's requests to a lane through `client` (another
/// `ClientWithMiddleware`, whose own middlewares route by the copy's stain), fire and
/// forget: the reqwest side of [`MirrorLayer`](crate::mirror::MirrorLayer), with the same
/// decision ([`Copier`](crate::mirror::Copier)) and guarantees. A request whose body is a
/// stream gets no copy (reqwest hands a middleware no way to tee it); bytes bodies are
/// copied up to the copier's `max_body_bytes`.
///
/// ```no_run
/// use gray_tower::{Lane, mirror::Copier, reqwest::{ClientBuilder, MirrorMiddleware, PropagateMiddleware}};
///
/// // The copies go out stained gray: a routing middleware sends them to gray's instances.
/// let copies = ClientBuilder::new(reqwest::Client::new()).with(PropagateMiddleware::new()).build();
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(MirrorMiddleware::new(Copier::new(Lane::new("gray")?), copies))
///     .with(PropagateMiddleware::new())
///     .build();
/// # drop(client);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MirrorMiddleware {
    copier: crate::mirror::Copier,
    client: ClientWithMiddleware,
    timeout: std::time::Duration,
    counters: std::sync::Arc<crate::mirror::Counters>,
}

impl MirrorMiddleware {
    /// Copies what `copier` takes through `client`, 5 s for each.
    #[must_use]
    pub fn new(copier: crate::mirror::Copier, client: ClientWithMiddleware) -> Self {
        MirrorMiddleware {
            copier,
            client,
            timeout: std::time::Duration::from_secs(5),
            counters: std::sync::Arc::default(),
        }
    }

    /// The time a copy has, from the request to the end of its answer (default 5 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What its copies did.
    #[must_use]
    pub fn stats(&self) -> crate::mirror::MirrorStats {
        crate::mirror::MirrorStats::new(self.counters.clone(), self.copier.clone())
    }
}

#[async_trait::async_trait]
impl Middleware for MirrorMiddleware {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<reqwest::Response> {
        self.offer(&req, extensions);
        next.run(req, extensions).await
    }
}

impl MirrorMiddleware {
    /// Copies `req` when the copier takes it, spawning its copy.
    fn offer(&self, req: &reqwest::Request, extensions: &mut Extensions) {
        // The copier's view of the request: its head, its bytes, its stain.
        let body = match req.body() {
            None => bytes::Bytes::new(),
            Some(body) => match body.as_bytes() {
                Some(bytes) => bytes::Bytes::copy_from_slice(bytes),
                None => {
                    // A stream: no copy (counted only if it would have been copied).
                    return;
                }
            },
        };
        let Ok(uri) = http::Uri::try_from(req.url().as_str()) else {
            return;
        };
        let mut view = http::Request::new(http_body_util::Full::new(body.clone()));
        *view.method_mut() = req.method().clone();
        *view.uri_mut() = uri;
        *view.headers_mut() = req.headers().clone();
        if let Some(stain) = gray_core::task::outbound(extensions, self.copier.carriers()) {
            view.extensions_mut().insert(stain);
        }
        let mut copy = match self.copier.offer(&mut view) {
            Ok(copy) => copy,
            Err(declined) => {
                self.counters.declined(declined);
                return;
            }
        };
        let counters = self.counters.clone();
        let client = self.client.clone();
        let timeout = self.timeout;
        let url = req.url().clone();
        let lane = copy.lane_stain();
        crate::mirror::spawn(gray_core::task::scope(lane, async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let head = copy.head();
            let mut copied = reqwest::Request::new(head.method().clone(), url);
            *copied.headers_mut() = head.headers().clone();
            *copied.body_mut() = Some(reqwest::Body::from(body));
            let mut extensions = Extensions::new();
            extensions.insert(copy.lane_stain());
            let _place = copy;
            counters.sent();
            let answered = tokio::time::timeout_at(deadline, async {
                let response = client
                    .execute_with_extensions(copied, &mut extensions)
                    .await
                    .ok()?;
                response.bytes().await.ok()
            })
            .await;
            counters.finished(matches!(answered, Ok(Some(_))));
        }));
    }
}
