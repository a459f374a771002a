//! reqwest routing (cargo feature `reqwest`): a request to `http://<service>/…` goes to an
//! instance of `service` picked by the request's stain, as Spring's `@LoadBalanced
//! RestTemplate` does.
//!
//! [`RouteMiddleware`] maps host names to balancers. For a request whose URL host is one of
//! them, it finds the stain with [`gray_core::task::outbound`], as gray-tower's
//! `PropagateMiddleware` does: the reqwest-middleware extensions, else the task-local, else
//! (with gray-core's feature `opentelemetry`, which gray-tower's `opentelemetry` turns on)
//! the lane in the current OpenTelemetry baggage, recorded in the extensions for the other
//! middleware. The two may be listed in either order: the instance picked and the stain
//! written always agree. It then picks an instance with
//! [`Balance::pick`], and replaces the URL's scheme, host and port by the instance's
//! [`Origin`]; path and query stay. reqwest then sends to that address with its own
//! connection pool. The outcome is reported to the balancer: a response (whatever its
//! status) measures the round trip for Peak-EWMA, an error whose
//! [`is_connect`](reqwest_middleware::Error::is_connect) is true counts as a connection
//! error for passive health.
//!
//! A request that could not reach its instance is sent again to another one that fits
//! the same stain, by the balancer's [`RetryPolicy`](crate::retry::RetryPolicy) and
//! within its budget (see [`retry`](crate::retry)): after a refused or failed connection
//! whatever its method, after a connection that broke before the response head only if
//! its method is idempotent, and once. reqwest keeps no request it could not send, so the
//! middleware sends a copy (`reqwest::Request::try_clone`, made before the first attempt
//! when the policy retries at all); a request with a streaming body has none, and is
//! sent once.
//!
//! When no instance fits, the request fails before anything is sent, with the balancer's
//! [`Unroutable`](crate::error::Unroutable) as a `reqwest_middleware::Error::Middleware`,
//! naming the service, the lane and the policy. A URL whose host is not routed is sent as
//! it is, or fails with [`RouteError::UnknownHost`] under [`UnknownHosts::Fail`].
//!
//! Put gray-tower's `PropagateMiddleware` in the same client so that the instance also
//! receives the stain. The endpoints only need to be [`Labelled`] and [`Origin`]: the
//! instances and endpoints of `gray-discovery` are, or your own type.
//!
//! ```
//! use std::convert::Infallible;
//! use gray_balance::{BalanceLayer, error::Unroutable, reqwest::RouteMiddleware};
//! use gray_core::{Labelled, Labels, Lane, Origin, Stain};
//! use gray_policy::Policy;
//! use http::uri::{Authority, Scheme};
//! use tower::discover::Change;
//!
//! /// An instance: where it listens and its labels.
//! struct Instance(Authority, Labels);
//!
//! impl Labelled for Instance {
//!     fn labels(&self) -> &Labels { &self.1 }
//! }
//!
//! impl Origin for Instance {
//!     fn scheme(&self) -> &Scheme { &Scheme::HTTP }
//!     fn authority(&self) -> &Authority { &self.0 }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let instances = futures_util::stream::iter([Ok::<_, Infallible>(Change::Insert(
//!     "stock-1",
//!     Instance(Authority::from_static("127.0.0.1:9"), Labels::new()),
//! ))]);
//! // A strict policy: no fallback.
//! let stock = BalanceLayer::new("stock", Policy::new()).build(instances);
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RouteMiddleware::new().route("stock", stock))
//!     .build();
//!
//! // `stock` has no gray instance: a gray request fails before anything is sent.
//! let err = client
//!     .get("http://stock/items")
//!     .with_extension(Stain::in_lane(Lane::new("gray").unwrap()))
//!     .send()
//!     .await
//!     .unwrap_err();
//! let reqwest_middleware::Error::Middleware(err) = err else { panic!("{err}") };
//! let unroutable = err.downcast_ref::<Unroutable>().unwrap();
//! assert_eq!(
//!     unroutable.to_string(),
//!     "no instance of `stock` fits lane `gray` (policy `default`, fallback `none`)"
//! );
//! # }
//! ```

use std::{collections::HashMap, fmt, sync::OnceLock};

use gray_core::{Carriers, Labelled, Origin};
use http::Extensions;
use reqwest::{Request, Response, Url};
use reqwest_middleware::{Middleware, Next, Result};

use crate::{Balance, index::Tried};

/// What [`RouteMiddleware`] does with a URL whose host no balancer routes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownHosts {
    /// Send it as it is (the default): the client also talks to hosts outside the
    /// registry.
    #[default]
    Pass,
    /// Fail with [`RouteError::UnknownHost`].
    Fail,
}

/// Why [`RouteMiddleware`] could not route a request (besides
/// [`Unroutable`](crate::error::Unroutable)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    /// The URL's host is routed by no balancer, and unknown hosts fail.
    UnknownHost {
        /// The host.
        host: String,
    },
    /// The picked instance's origin cannot replace the URL's (a scheme reqwest's URL
    /// cannot switch to, or a malformed host).
    Origin {
        /// The service.
        service: String,
        /// The instance's `scheme://authority`.
        origin: String,
    },
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::UnknownHost { host } => {
                write!(
                    f,
                    "no balancer routes host `{host}`, and unknown hosts fail"
                )
            }
            RouteError::Origin { service, origin } => write!(
                f,
                "the instance of `{service}` at `{origin}` cannot be addressed by a URL"
            ),
        }
    }
}

impl std::error::Error for RouteError {}

/// A reqwest-middleware middleware that routes `http://<service>/…` to an instance of
/// `service` picked by the stain; see the [module docs](self).
pub struct RouteMiddleware<K, S> {
    routes: HashMap<Box<str>, Balance<K, S>>,
    unknown: UnknownHosts,
}

impl<K, S> fmt::Debug for RouteMiddleware<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteMiddleware")
            .field("hosts", &self.routes.keys().collect::<Vec<_>>())
            .field("unknown", &self.unknown)
            .finish()
    }
}

impl<K, S> Clone for RouteMiddleware<K, S> {
    fn clone(&self) -> Self {
        RouteMiddleware {
            routes: self.routes.clone(),
            unknown: self.unknown,
        }
    }
}

impl<K, S> Default for RouteMiddleware<K, S> {
    fn default() -> Self {
        RouteMiddleware {
            routes: HashMap::new(),
            unknown: UnknownHosts::Pass,
        }
    }
}

impl<K, S> RouteMiddleware<K, S> {
    /// Routes nothing yet; unknown hosts pass.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes URLs whose host is `host` (compared without case, whatever the port) through
    /// `balance`.
    #[must_use]
    pub fn route(mut self, host: impl AsRef<str>, balance: Balance<K, S>) -> Self {
        self.routes
            .insert(host.as_ref().to_ascii_lowercase().into(), balance);
        self
    }

    /// What to do with URLs whose host no balancer routes.
    #[must_use]
    pub fn with_unknown_hosts(mut self, unknown: UnknownHosts) -> Self {
        self.unknown = unknown;
        self
    }

    /// The balancer that routes `host`, if any.
    #[must_use]
    pub fn balancer(&self, host: &str) -> Option<&Balance<K, S>> {
        self.routes.get(host.to_ascii_lowercase().as_str())
    }
}

/// The carriers [`gray_core::task::outbound`] is given: none, so that a lane in
/// OpenTelemetry's baggage is read under `gray.lane`, as gray-tower reads it by default.
fn no_carriers() -> &'static Carriers {
    static NONE: OnceLock<Carriers> = OnceLock::new();
    NONE.get_or_init(Carriers::new)
}

/// Replaces `url`'s scheme, host and port by `origin`'s.
fn rewrite(url: &mut Url, origin: &impl Origin) -> std::result::Result<(), ()> {
    let authority = origin.authority();
    url.set_scheme(origin.scheme().as_str())?;
    url.set_host(Some(authority.host())).map_err(|_| ())?;
    url.set_port(authority.port_u16())
}

#[async_trait::async_trait]
impl<K, S> Middleware for RouteMiddleware<K, S>
where
    K: fmt::Debug + Send + Sync + 'static,
    S: Labelled + Origin + Send + Sync + 'static,
{
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response> {
        // `Url` keeps the host of special schemes lowercase already.
        let balance = req
            .url()
            .host_str()
            .map(|host| (self.routes.get(host), host));
        let balance = match balance {
            Some((Some(balance), _)) => balance,
            Some((None, host)) if self.unknown == UnknownHosts::Fail => {
                let host = host.to_owned();
                return Err(reqwest_middleware::Error::middleware(
                    RouteError::UnknownHost { host },
                ));
            }
            _ => return next.run(req, extensions).await,
        };
        // Found as gray-tower's `PropagateMiddleware` finds it, and recorded where that one
        // reads it: the two agree in either order.
        let stain = gray_core::task::outbound(extensions, no_carriers());
        let retries = &balance.inner.retries;
        // A copy to send again, made before the URL names an instance; a streaming body
        // cannot be copied, and such a request is sent once.
        let copy = match retries.enabled() {
            true => req.try_clone(),
            false => None,
        };
        let idempotent = retries.policy.is_idempotent(req.method());
        let mut tried = Tried::NONE;
        let mut attempts = 0;
        let mut picked = balance
            .pick(stain.as_ref())
            .map_err(reqwest_middleware::Error::middleware)?;
        if retries.enabled() {
            let now = match picked.start() {
                0 => balance.inner.router.clock.now(),
                start => start,
            };
            retries.deposit(now);
        }
        loop {
            if rewrite(req.url_mut(), picked.endpoint()).is_err() {
                let origin = picked.endpoint();
                return Err(reqwest_middleware::Error::middleware(RouteError::Origin {
                    service: balance.service_name().to_owned(),
                    origin: format!("{}://{}", origin.scheme(), origin.authority()),
                }));
            }
            let error = match next.clone().run(req, extensions).await {
                Ok(response) => {
                    picked.succeeded();
                    return Ok(response);
                }
                Err(error) => error,
            };
            let key = format!("{:?}", picked.key());
            let id = picked.id();
            let failure = match &error {
                reqwest_middleware::Error::Reqwest(e) => picked.failed_with(e),
                reqwest_middleware::Error::Middleware(e) => picked.failed_with(&**e),
            };
            // The next attempt: a copy, another endpoint, a retry from the budget.
            if !retries.eligible(failure, idempotent, attempts) || !tried.push(id) {
                return Err(error);
            }
            let Some(again) = copy.as_ref().and_then(Request::try_clone) else {
                return Err(error);
            };
            let Ok(next_pick) = balance.pick_except(stain.as_ref(), &tried) else {
                return Err(error);
            };
            if !retries.withdraw(failure, balance.inner.router.clock.now()) {
                tracing::debug!(target: "gray::balance", service = %balance.service_name(), endpoint = %key, reason = failure.as_str(), error = %error, "no retry: the retry budget is spent");
                return Err(error);
            }
            attempts += 1;
            tracing::debug!(target: "gray::balance", service = %balance.service_name(), endpoint = %key, next = ?next_pick.key(), reason = failure.as_str(), retry = attempts, error = %error, "retrying on another endpoint");
            req = again;
            picked = next_pick;
        }
    }
}
