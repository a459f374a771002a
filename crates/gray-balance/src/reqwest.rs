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

use crate::Balance;

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
        let picked = balance
            .pick(stain.as_ref())
            .map_err(reqwest_middleware::Error::middleware)?;
        if rewrite(req.url_mut(), picked.endpoint()).is_err() {
            let origin = picked.endpoint();
            return Err(reqwest_middleware::Error::middleware(RouteError::Origin {
                service: balance.service_name().to_owned(),
                origin: format!("{}://{}", origin.scheme(), origin.authority()),
            }));
        }
        let result = next.run(req, extensions).await;
        match &result {
            Ok(_) => picked.succeeded(),
            Err(e) if e.is_connect() => picked.connection_failed(),
            Err(_) => picked.failed(),
        }
        result
    }
}
