//! [`BalanceLayer`]: the balancer's configuration, which builds balancers over discover
//! streams.

use std::{fmt, hash::Hash};

use gray_core::Labelled;
use gray_policy::Policy;
use tower::{BoxError, discover::Discover};
use tower_layer::Layer;

use crate::{
    Driver, Pick, RecordRouted,
    health::{Classifier, Ejection, Probe},
    retry::RetryPolicy,
    service::{Balance, Config},
    strategy::{Chooser, Strategy},
};

/// Builds a [`Balance`] over a discover stream: `layer.layer(discover)`.
///
/// Holds the target service's name, its [`Policy`], how to pick among ready endpoints (a
/// [`Strategy`], built-in by [`Pick`] or your own), when to [eject](Ejection) endpoints
/// and how to [probe](Probe) them before they come back, how to read an endpoint's
/// error ([`Classifier`]), when to [retry](RetryPolicy) and which requests record how
/// they were routed ([`RecordRouted`]). The `with_*` setters may come in any order.
#[derive(Clone)]
pub struct BalanceLayer {
    config: Config,
}

impl fmt::Debug for BalanceLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalanceLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl BalanceLayer {
    /// A layer for calls to `service` routed by `policy`, with Peak-EWMA p2c, the
    /// default [`Ejection`], the connect [`Probe`], [`classify`](crate::health::classify)
    /// and the default [`RetryPolicy`].
    pub fn new(service: impl AsRef<str>, policy: Policy) -> Self {
        BalanceLayer {
            config: Config::new(service.as_ref(), policy),
        }
    }

    /// Picks among the ready endpoints of a subset with the built-in strategy `pick`
    /// names (default [`Pick::PeakEwma`]).
    #[must_use]
    pub fn with_pick(mut self, pick: Pick) -> Self {
        self.config.router.set_strategy(pick.chooser());
        self
    }

    /// Picks among the ready endpoints of a subset with `strategy`: one virtual call per
    /// request that reaches a subset of two or more ready endpoints, no allocation. See
    /// [`strategy`](crate::strategy) for what it sees and what the balancer still does
    /// around it (the policy's walk, probing, passive health). A built-in strategy
    /// ([`PeakEwma`](crate::strategy::PeakEwma), ...) is recognised and called directly,
    /// as [`with_pick`](Self::with_pick) does. The last of the two setters wins.
    #[must_use]
    pub fn with_strategy(mut self, strategy: impl Strategy) -> Self {
        self.config.router.set_strategy(Chooser::new(strategy));
        self
    }

    /// When and for how long to eject endpoints.
    #[must_use]
    pub fn with_ejection(mut self, ejection: Ejection) -> Self {
        self.config.ejection = ejection;
        self
    }

    /// How to read an endpoint's error: where the request failed
    /// ([`Failure`](crate::health::Failure)).
    #[must_use]
    pub fn with_classifier(mut self, classify: Classifier) -> Self {
        self.config.classify = classify;
        self
    }

    /// How an ejected endpoint is checked before it comes back (default: a TCP connect to
    /// its address); see [`health`](crate::health), "Re-admission".
    #[must_use]
    pub fn with_probe(mut self, probe: Probe) -> Self {
        self.config.probe = probe;
        self
    }

    /// When the [`Retry`](crate::retry::Retry) services and the reqwest routing over the
    /// balancer retry, and their budget (default: [`RetryPolicy::default`]); see
    /// [`retry`](crate::retry).
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.config.retry = retry;
        self
    }

    /// Passes over an endpoint with `limit` requests in flight (nginx's `max_conns`; 0, the
    /// default: no limit): the pick takes another ready endpoint of the same subset, and
    /// when every one is at the limit the request fails at once with
    /// [`Unroutable`](crate::error::Unroutable) (reason `Saturated`; a gateway answers
    /// 503). A saturated subset does not fall back to another: the overflow of a lane is
    /// not sent to baseline. The count is read when picking, so concurrent picks may each
    /// take an endpoint's last place: the limit can be passed by the number of callers
    /// picking at that moment.
    #[must_use]
    pub fn with_max_pending(mut self, limit: u32) -> Self {
        self.config.router.max_pending = limit;
        self
    }

    /// Records on the requests `record` selects how they were routed
    /// ([`Routed`](crate::Routed), in the request extensions for `http::Request`), so the
    /// endpoint service or a layer around it can report the subset and whether a fallback
    /// was taken. [`RecordRouted::Never`] by default: a record costs one extensions insert;
    /// [`RecordRouted::Fallbacks`] pays it only for the requests that fell back.
    #[must_use]
    pub fn with_routed(mut self, record: RecordRouted) -> Self {
        self.config.router.record = record;
        self
    }

    /// Builds the balancer over `discover` and spawns its driver on the current tokio
    /// runtime (the same as [`Layer::layer`]); see [`Balance::new`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime; use [`BalanceLayer::pair`] there.
    pub fn build<D>(&self, discover: D) -> Balance<D::Key, D::Service>
    where
        D: Discover + Send + 'static,
        D::Key: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
        D::Service: Labelled + Send + Sync + 'static,
        D::Error: Into<BoxError>,
    {
        Balance::spawn(discover, self.config.clone())
    }

    /// Builds the balancer over `discover` and returns its driver, for the caller to
    /// spawn; see [`Balance::pair`].
    pub fn pair<D>(&self, discover: D) -> (Balance<D::Key, D::Service>, Driver<D>)
    where
        D: Discover,
        D::Key: Hash + Eq + Clone + fmt::Debug,
        D::Service: Labelled,
        D::Error: Into<BoxError>,
    {
        Balance::with_config(discover, self.config.clone())
    }
}

impl<D> Layer<D> for BalanceLayer
where
    D: Discover + Send + 'static,
    D::Key: Hash + Eq + Clone + fmt::Debug + Send + Sync + 'static,
    D::Service: Labelled + Send + Sync + 'static,
    D::Error: Into<BoxError>,
{
    type Service = Balance<D::Key, D::Service>;

    fn layer(&self, discover: D) -> Self::Service {
        self.build(discover)
    }
}
