use std::sync::Arc;

use gray_core::{Carriers, Lane};
use gray_rules::CidrList;
use http::HeaderName;
use tower_layer::Layer;

use super::{
    client_ip::{ForwardedHeader, TrustedProxies},
    config::{Config, Precedence},
    live::LiveRules,
    service::Edge,
};

/// Builds [`Edge`]: the edge layer that decides each request's stain by the rules.
///
/// Every setter can be called in any order, on a fresh layer or a clone of a shared one.
///
/// | setting | default |
/// |---|---|
/// | [`with_carriers`](Self::with_carriers) | `x-gray-lane` + `x-gray-info` ([`Carriers::default`]) |
/// | [`with_proxies`](Self::with_proxies) | none: the TCP peer is the client |
/// | [`with_forwarded_header`](Self::with_forwarded_header) | `X-Forwarded-For` |
/// | [`with_trusted_clients`](Self::with_trusted_clients) | none: every inbound stain is stripped |
/// | [`with_precedence`](Self::with_precedence) | [`Precedence::RulesFirst`] |
/// | [`with_seed003_headers`](Self::with_seed003_headers) | off (`x-gray-flag`, `x-gray-ip` still stripped) |
/// | [`with_strip_known`](Self::with_strip_known) | on: every carrier gray knows is stripped |
/// | [`with_strip`](Self::with_strip) | no extra header |
/// | [`with_hop_by_hop`](Self::with_hop_by_hop) | on |
/// | [`with_path_normalization`](Self::with_path_normalization) | on |
/// | [`with_reject_prefix_escape`](Self::with_reject_prefix_escape) | off |
/// | [`with_forwarded_for`](Self::with_forwarded_for) | off |
/// | [`with_decision_extension`](Self::with_decision_extension) | on |
/// | [`with_task_local`](Self::with_task_local) | on |
#[derive(Debug, Clone)]
pub struct EdgeLayer {
    config: Arc<Config>,
}

impl EdgeLayer {
    /// Decides by `rules` (a [`LiveRules`], or a fixed [`RuleSet`](gray_rules::RuleSet)).
    pub fn new(rules: impl Into<LiveRules>) -> Self {
        EdgeLayer {
            config: Arc::new(Config::new(rules.into())),
        }
    }

    /// The configuration, copied first when another layer or service shares it.
    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Reads (from trusted clients) and writes (for downstream) these carriers; everything
    /// they read is stripped from untrusted clients.
    /// [`CarrierConfig::carriers`](gray_core::CarrierConfig::carriers) builds them from a
    /// configuration file.
    #[must_use]
    pub fn with_carriers(mut self, carriers: Carriers) -> Self {
        let config = self.config_mut();
        config.carriers = carriers;
        config.refresh();
        self
    }

    /// Trusts these proxies to report the client address.
    #[must_use]
    pub fn with_proxies(mut self, proxies: TrustedProxies) -> Self {
        let config = self.config_mut();
        config.resolver = config.resolver.clone().with_proxies(proxies);
        self
    }

    /// Reads `header` for the client address chain (default `X-Forwarded-For`): the header
    /// the trusted proxies write.
    #[must_use]
    pub fn with_forwarded_header(mut self, header: ForwardedHeader) -> Self {
        let config = self.config_mut();
        config.resolver = config.resolver.clone().with_header(header);
        self
    }

    /// Clients whose inbound stain is honoured (internal callers, test harnesses), by their
    /// resolved client IP. Everyone else's carriers are stripped.
    #[must_use]
    pub fn with_trusted_clients(mut self, clients: CidrList) -> Self {
        self.config_mut().trusted_clients = clients;
        self
    }

    /// Which decides first for a trusted client that sends a stain.
    #[must_use]
    pub fn with_precedence(mut self, precedence: Precedence) -> Self {
        self.config_mut().precedence = precedence;
        self
    }

    /// Also writes seed 003's headers: `x-gray-flag: true` when the decided lane is
    /// `lane` (`false` otherwise) and `x-gray-ip: <client IP>` (omitted when unknown).
    #[must_use]
    pub fn with_seed003_headers(mut self, lane: Lane) -> Self {
        self.config_mut().seed003 = Some(lane);
        self
    }

    /// Whether untrusted clients lose every carrier gray knows, configured or not (default:
    /// yes): the headers [`KNOWN_STAIN_HEADERS`](super::KNOWN_STAIN_HEADERS) (`x-gray-lane`,
    /// `x-gray-info`, `x-gray-flag`, `x-gray-ip`, `gray`, `version`) and the stain's member
    /// of `baggage` under [`DEFAULT_BAGGAGE_KEY`](gray_core::codec::DEFAULT_BAGGAGE_KEY).
    /// Turn it off only where one of those headers means something else to the services
    /// behind (seed 004's API `version` header, say).
    #[must_use]
    pub fn with_strip_known(mut self, on: bool) -> Self {
        let config = self.config_mut();
        config.strip_known = on;
        config.refresh();
        self
    }

    /// Also strips these headers from untrusted clients (replacing the previous list):
    /// headers only the services behind read.
    #[must_use]
    pub fn with_strip(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let config = self.config_mut();
        config.strip = headers.into_iter().collect();
        config.refresh();
        self
    }

    /// Whether the edge removes the client's hop-by-hop headers, and every header its
    /// `Connection` header names, before it reads, decides and writes the stain (default:
    /// yes; see [`hop`](super::hop)). Then `Connection: x-gray-lane` cannot remove the stain
    /// the edge writes. Turn it off only on a service that handles `Upgrade` (WebSocket)
    /// requests itself and forwards nothing: the edge would remove `Upgrade`.
    #[must_use]
    pub fn with_hop_by_hop(mut self, on: bool) -> Self {
        self.config_mut().hop_by_hop = on;
        self
    }

    /// Whether the edge normalises the request path before rules see it and rewrites the
    /// request to it (default: yes; see [`gray_rules::path`]). A path it rejects is
    /// answered by the edge itself, `400` with a JSON body naming the reason; neither the
    /// rules nor the service behind see it.
    ///
    /// With the `axum` feature, an edge that normalises paths also refuses to run after
    /// axum's routing (the request carries a `MatchedPath`): it answers `500` and logs
    /// once, at ERROR, how to wrap the `Router` instead.
    #[must_use]
    pub fn with_path_normalization(mut self, on: bool) -> Self {
        self.config_mut().normalize_paths = on;
        self
    }

    /// Whether the edge refuses, `400`, a path whose normal form leaves the first segment
    /// the client named: `/api/../web/x` names `api` and becomes `/web/x` (default: no).
    /// Turn it on in front of anything that routes by the first segment (a gateway's
    /// `/{service}/…`, an axum `Router` with `/api` and `/web` routes): a client that names
    /// one must not reach another. Needs path normalisation (on by default).
    #[must_use]
    pub fn with_reject_prefix_escape(mut self, on: bool) -> Self {
        self.config_mut().reject_prefix_escape = on;
        self
    }

    /// Whether the edge appends the TCP peer's address to `X-Forwarded-For` for the next
    /// hop (default: no), as a proxy does: `a, b` from a trusted proxy at `c` becomes
    /// `a, b, c`. It is appended after the client IP was resolved and after the client's
    /// hop-by-hop headers went. With [`Edge::with_peer`](super::Edge::with_peer) the entry
    /// is made once per connection; from a per-request [`PeerAddr`](super::PeerAddr) (or
    /// axum's `ConnectInfo`) it is made per request. Without a peer, nothing is appended.
    #[must_use]
    pub fn with_forwarded_for(mut self, on: bool) -> Self {
        self.config_mut().forwarded_for = on;
        self
    }

    /// Whether each request carries its [`EdgeDecision`](super::EdgeDecision) in its
    /// extensions, beside the [`Stain`](gray_core::Stain) (default: yes). Where nothing
    /// reads it (a proxy that only forwards), turning it off saves an allocation and a map
    /// insert per request.
    #[must_use]
    pub fn with_decision_extension(mut self, on: bool) -> Self {
        self.config_mut().decision_extension = on;
        self
    }

    /// Whether the service behind runs with the request's stain as the task-local stain
    /// ([`gray_core::task::current`]) while it is called and while its response future is
    /// polled (default: yes). The request's [`Stain`](gray_core::Stain) extension is
    /// inserted either way. Where nothing behind the edge reads the task-local (a proxy
    /// whose balancer reads the extension, as gray-balance does first), turning it off
    /// saves moving the stain into and out of the task-local at every poll.
    #[must_use]
    pub fn with_task_local(mut self, on: bool) -> Self {
        self.config_mut().task_local = on;
        self
    }

    /// The rules this layer decides by.
    #[must_use]
    pub fn rules(&self) -> &LiveRules {
        &self.config.rules
    }

    /// The headers stripped whole from untrusted clients: the configured carriers', the
    /// known ones (unless switched off) and the extra ones, without duplicates.
    #[must_use]
    pub fn stripped_headers(&self) -> &[HeaderName] {
        self.config.removal.headers()
    }

    /// The `baggage` member keys stripped from untrusted clients (their other members stay).
    pub fn stripped_baggage_keys(&self) -> impl Iterator<Item = &str> {
        self.config.removal.baggage_keys()
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Edge::new(inner, self.config.clone())
    }
}

impl<S> Edge<S> {
    /// A layer deciding by `rules`.
    pub fn layer(rules: impl Into<LiveRules>) -> EdgeLayer {
        EdgeLayer::new(rules)
    }
}
