use std::{
    net::IpAddr,
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::{
    Stain,
    rules::{Decision, RequestView},
};
use http::{HeaderValue, Request};
use tower_service::Service;

use super::{
    client_ip::peer_ip,
    layer::{Config, EdgeLayer, Precedence, X_GRAY_FLAG, X_GRAY_IP},
};
use crate::extract::ResponseFuture;

/// What decided a request's stain at the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// A rule matched.
    Rule,
    /// A trusted client's own stain.
    Inbound,
    /// Nothing: baseline.
    Default,
}

/// The edge's decision for one request, in the request extensions (beside the
/// [`Stain`]): for handlers, logs and admin endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeDecision {
    /// What decided.
    pub decided_by: DecidedBy,
    /// The index of the rule that fired.
    pub rule_index: Option<usize>,
    /// The name of the rule that fired.
    pub rule_name: Option<Arc<str>>,
    /// The generation of the rule set that decided (see [`LiveRules`](super::LiveRules)).
    pub generation: u64,
    /// The resolved client IP.
    pub client_ip: Option<IpAddr>,
    /// Whether the client is trusted (its stain was honoured rather than stripped).
    pub trusted: bool,
}

/// The edge layer's service: decides the stain by the rules, strips untrusted stains,
/// writes the decided stain for downstream. Built by [`EdgeLayer`].
#[derive(Debug, Clone)]
pub struct Edge<S> {
    inner: S,
    config: Arc<Config>,
    peer: Option<IpAddr>,
}

impl<S> Edge<S> {
    pub(crate) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        Edge {
            inner,
            config,
            peer: None,
        }
    }

    /// The peer address of the connection this service serves, for servers that build
    /// their service per connection (a hyper accept loop): requests then need no
    /// [`PeerAddr`](super::PeerAddr) extension. A request's own `PeerAddr` (or axum's
    /// `ConnectInfo`) still wins.
    ///
    /// ```
    /// use gray_core::{Stain, rules::{CidrList, RuleSet}};
    /// use gray_tower::edge::{LiveRules, EdgeLayer};
    /// use tower::{Layer, ServiceExt, service_fn};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // Stains from 10.0.0.0/8 are honoured.
    /// let edge = EdgeLayer::new(LiveRules::new(RuleSet::default()))
    ///     .with_trusted_clients(CidrList::parse(["10.0.0.0/8"]).unwrap());
    /// let lane_seen = service_fn(|req: http::Request<()>| async move {
    ///     let lane = req.extensions().get::<Stain>().and_then(|c| c.lane().cloned());
    ///     Ok::<_, std::convert::Infallible>(lane.map(|l| l.to_string()))
    /// });
    /// // In the accept loop, once per connection:
    /// let from = |peer: &str| edge.layer(lane_seen).with_peer(peer.parse().unwrap());
    /// let request = || http::Request::get("/").header("x-gray-lane", "gray").body(()).unwrap();
    /// assert_eq!(from("10.0.0.7:50000").oneshot(request()).await.unwrap().as_deref(), Some("gray"));
    /// assert_eq!(from("192.0.2.1:50000").oneshot(request()).await.unwrap(), None);
    /// # });
    /// ```
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }

    /// A layer deciding by `rules`.
    pub fn layer(rules: impl Into<super::LiveRules>) -> EdgeLayer {
        EdgeLayer::new(rules)
    }

    define_inner_service_accessors!();
}

fn from_rule(d: Decision<'_>, e: &mut EdgeDecision) -> Stain {
    e.decided_by = DecidedBy::Rule;
    e.rule_index = Some(d.rule().index());
    e.rule_name = d.rule().shared_name().cloned();
    d.into_stain()
}

impl<S, B> Service<Request<B>> for Edge<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &*self.config;
        let client_ip = config
            .resolver
            .resolve(peer_ip(req.extensions()).or(self.peer), req.headers());
        let trusted = client_ip.is_some_and(|ip| config.trusted_clients.contains(ip));

        // One snapshot decides the whole request.
        let snapshot = config.rules.load();
        let (ctx, decision) = {
            let view = RequestView::from_request(&req).with_client_ip(client_ip);
            let inbound = || {
                if trusted {
                    config.carriers.extract(req.headers())
                } else {
                    None
                }
            };
            let rule = || snapshot.rules().evaluate(&view);
            let mut decision = EdgeDecision {
                decided_by: DecidedBy::Default,
                rule_index: None,
                rule_name: None,
                generation: snapshot.generation(),
                client_ip,
                trusted,
            };
            let ctx = match config.precedence {
                Precedence::RulesFirst => match rule() {
                    Some(d) => from_rule(d, &mut decision),
                    None => match inbound() {
                        Some(ctx) => {
                            decision.decided_by = DecidedBy::Inbound;
                            ctx
                        }
                        None => Stain::baseline(),
                    },
                },
                Precedence::InboundFirst => match inbound() {
                    Some(ctx) => {
                        decision.decided_by = DecidedBy::Inbound;
                        ctx
                    }
                    None => match rule() {
                        Some(d) => from_rule(d, &mut decision),
                        None => Stain::baseline(),
                    },
                },
            };
            (ctx, decision)
        };
        drop(snapshot);

        let headers = req.headers_mut();
        if !trusted {
            config.carriers.strip(headers);
            for name in &config.strip {
                headers.remove(name);
            }
        }
        // Rewrites every carrier: the decided stain, or none for baseline.
        config.carriers.inject(&ctx, headers);
        if let Some(lane) = &config.seed003 {
            let flag = if ctx.lane() == Some(lane) {
                "true"
            } else {
                "false"
            };
            headers.insert(X_GRAY_FLAG, HeaderValue::from_static(flag));
            match client_ip.and_then(|ip| HeaderValue::from_str(&ip.to_string()).ok()) {
                Some(v) => {
                    headers.insert(X_GRAY_IP, v);
                }
                None => {
                    headers.remove(X_GRAY_IP);
                }
            }
        }
        req.extensions_mut().insert(ctx.clone());
        if config.decision_extension {
            req.extensions_mut().insert(decision);
        }
        ResponseFuture::scoped(ctx, req, &mut self.inner)
    }
}
