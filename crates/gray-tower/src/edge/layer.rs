use std::sync::Arc;

use gray_core::{Carriers, Lane, rules::CidrList};
use http::HeaderName;
use tower_layer::Layer;

use super::{
    client_ip::{ClientIpResolver, ForwardedHeader, TrustedProxies},
    live::LiveRules,
    service::Edge,
};

/// Seed 003's flag header, `x-gray-flag: true|false`.
pub const X_GRAY_FLAG: HeaderName = HeaderName::from_static("x-gray-flag");
/// Seed 003's client IP header, `x-gray-ip`.
pub const X_GRAY_IP: HeaderName = HeaderName::from_static("x-gray-ip");

/// Which decides first when a trusted client sends a stain and a rule also matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precedence {
    /// The first matching rule decides; a trusted client's stain decides only when no rule
    /// matches (the default).
    #[default]
    RulesFirst,
    /// A trusted client's stain decides when it sends one; rules decide otherwise.
    InboundFirst,
}

#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) rules: LiveRules,
    pub(crate) carriers: Carriers,
    pub(crate) resolver: ClientIpResolver,
    pub(crate) trusted_clients: CidrList,
    pub(crate) precedence: Precedence,
    pub(crate) seed003: Option<Lane>,
    pub(crate) strip: Vec<HeaderName>,
    pub(crate) decision_extension: bool,
}

/// Builds [`Edge`]: the edge layer that decides each request's stain by the rules.
///
/// Defaults: the carriers `x-gray-lane` + `x-gray-info`, no trusted proxy (the TCP peer is
/// the client), no trusted client (every inbound stain is stripped), [`Precedence::RulesFirst`],
/// no seed 003 headers (`x-gray-flag` and `x-gray-ip` are still stripped from untrusted
/// clients).
#[derive(Debug, Clone)]
pub struct EdgeLayer {
    config: Arc<Config>,
}

impl EdgeLayer {
    /// Decides by `rules` (a [`LiveRules`], or a fixed [`RuleSet`](gray_core::RuleSet)).
    pub fn new(rules: impl Into<LiveRules>) -> Self {
        EdgeLayer {
            config: Arc::new(Config {
                rules: rules.into(),
                carriers: Carriers::default(),
                resolver: ClientIpResolver::default(),
                trusted_clients: CidrList::new(),
                precedence: Precedence::default(),
                seed003: None,
                strip: vec![X_GRAY_FLAG, X_GRAY_IP],
                decision_extension: true,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        match Arc::get_mut(&mut self.config) {
            Some(config) => f(config),
            None => {
                let mut config = Config {
                    rules: self.config.rules.clone(),
                    carriers: self.config.carriers.clone(),
                    resolver: self.config.resolver.clone(),
                    trusted_clients: self.config.trusted_clients.clone(),
                    precedence: self.config.precedence,
                    seed003: self.config.seed003.clone(),
                    strip: self.config.strip.clone(),
                    decision_extension: self.config.decision_extension,
                };
                f(&mut config);
                self.config = Arc::new(config);
            }
        }
        self
    }

    /// Reads (from trusted clients) and writes (for downstream) these carriers.
    pub fn with_carriers(self, carriers: Carriers) -> Self {
        self.edit(|c| c.carriers = carriers)
    }

    /// Trusts these proxies to report the client address.
    pub fn with_proxies(self, proxies: TrustedProxies) -> Self {
        self.edit(|c| {
            c.resolver = ClientIpResolver::new(proxies);
        })
    }

    /// Reads `header` for the client address chain (default `X-Forwarded-For`).
    /// Call after [`EdgeLayer::with_proxies`].
    pub fn with_forwarded_header(self, header: ForwardedHeader) -> Self {
        self.edit(|c| c.resolver = c.resolver.clone().with_header(header))
    }

    /// Clients whose inbound stain is honoured (internal callers, test harnesses), by their
    /// resolved client IP. Everyone else's carriers are stripped.
    pub fn with_trusted_clients(self, clients: CidrList) -> Self {
        self.edit(|c| c.trusted_clients = clients)
    }

    /// Which decides first for a trusted client that sends a stain.
    pub fn with_precedence(self, precedence: Precedence) -> Self {
        self.edit(|c| c.precedence = precedence)
    }

    /// Also writes seed 003's headers: `x-gray-flag: true` when the decided lane is
    /// `lane` (`false` otherwise) and `x-gray-ip: <client IP>` (omitted when unknown).
    pub fn with_seed003_headers(self, lane: Lane) -> Self {
        self.edit(|c| c.seed003 = Some(lane))
    }

    /// Also strips `header` from untrusted clients (besides the carriers, `x-gray-flag`
    /// and `x-gray-ip`).
    pub fn strip_header(self, header: HeaderName) -> Self {
        self.edit(|c| c.strip.push(header))
    }

    /// Whether each request carries its [`EdgeDecision`](super::EdgeDecision) in its
    /// extensions, beside the [`Stain`](gray_core::Stain) (default: yes). Where nothing
    /// reads it (a proxy that only forwards), turning it off saves an allocation and a map
    /// insert per request.
    pub fn with_decision_extension(self, on: bool) -> Self {
        self.edit(|c| c.decision_extension = on)
    }

    /// The rules this layer decides by.
    pub fn rules(&self) -> &LiveRules {
        &self.config.rules
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Edge::from_parts(inner, self.config.clone())
    }
}
