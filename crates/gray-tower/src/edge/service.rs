use std::{
    net::IpAddr,
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::Stain;
use gray_rules::{
    RequestView, RuleMatch,
    path::{PathError, normalize_uri},
};
use http::{HeaderValue, Request, Uri};
use tower_service::Service;

use super::{
    client_ip::peer_ip,
    config::{Config, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    hop,
};
use crate::extract::StainedFuture;

/// What decided a request's stain at the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecidedBy {
    /// A rule matched.
    Rule,
    /// A trusted client's own stain.
    Inbound,
    /// Nothing: baseline.
    Default,
    /// The path was rejected ([`PathRejected`]): no rule ran, the request is baseline.
    PathRejected,
}

impl DecidedBy {
    /// `rule`, `inbound`, `default` or `path_rejected`: for logs and JSON bodies.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Rule => "rule",
            DecidedBy::Inbound => "inbound",
            DecidedBy::Default => "default",
            DecidedBy::PathRejected => "path_rejected",
        }
    }
}

/// The edge's decision for one request, in the request extensions (beside the
/// [`Stain`]): for handlers, logs and admin endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

/// A request extension: the edge rejected the request's path ([`gray_rules::path`]), so no
/// rule saw it and the request is baseline. The URI is left as the client sent it; the
/// service behind answers 400 (the gateway does, with a JSON body) and must not forward it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRejected(pub PathError);

/// A request extension: the URI as the client sent it, when the edge rewrote the request
/// to the normalised path. A proxy that routes by a path prefix compares the two to refuse
/// requests whose path climbs out of the prefix (`/svc/../other`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawUri(pub Uri);

/// The edge layer's service: decides the stain by the rules, strips untrusted stains,
/// writes the decided stain for downstream. Built by [`EdgeLayer`](super::EdgeLayer).
#[derive(Debug, Clone)]
pub struct Edge<S> {
    inner: S,
    config: Arc<Config>,
    peer: Option<IpAddr>,
}

impl<S> Edge<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
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
    /// use gray_core::Stain;
    /// use gray_rules::{CidrList, RuleSet};
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
    #[must_use]
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }

    define_inner_service_accessors!();
}

fn from_rule(d: RuleMatch<'_>, e: &mut EdgeDecision) -> Stain {
    e.decided_by = DecidedBy::Rule;
    e.rule_index = Some(d.rule().index());
    e.rule_name = d.rule().shared_name().cloned();
    d.into_stain()
}

/// Rewrites the request to its normalised path; the original URI when it changed.
fn normalize_path<B>(req: &mut Request<B>) -> Result<Option<RawUri>, PathError> {
    Ok(normalize_uri(req.uri())?.map(|normal| RawUri(std::mem::replace(req.uri_mut(), normal))))
}

impl<S, B> Service<Request<B>> for Edge<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = StainedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &*self.config;
        // The forwarding chain as the trusted proxy delivered it, before anything is removed.
        let client_ip = config
            .resolver
            .resolve(peer_ip(req.extensions()).or(self.peer), req.headers());
        let trusted = client_ip.is_some_and(|ip| config.trusted_clients.contains(ip));
        // What the client meant for this hop only goes before the stain is read or written.
        if config.hop_by_hop {
            hop::strip(req.headers_mut());
        }
        let path = if config.normalize_paths {
            normalize_path(&mut req)
        } else {
            Ok(None)
        };

        // One snapshot decides the whole request.
        let snapshot = config.rules.load();
        let mut decision = EdgeDecision {
            decided_by: DecidedBy::Default,
            rule_index: None,
            rule_name: None,
            generation: snapshot.generation(),
            client_ip,
            trusted,
        };
        let stain = if path.is_err() {
            decision.decided_by = DecidedBy::PathRejected;
            Stain::baseline()
        } else {
            let view = RequestView::from_request(&req).with_client_ip(client_ip);
            let inbound = || {
                if trusted {
                    config.carriers.extract(req.headers())
                } else {
                    None
                }
            };
            let rule = || snapshot.rules().evaluate(&view);
            match config.precedence {
                Precedence::RulesFirst => match rule() {
                    Some(d) => from_rule(d, &mut decision),
                    None => match inbound() {
                        Some(stain) => {
                            decision.decided_by = DecidedBy::Inbound;
                            stain
                        }
                        None => Stain::baseline(),
                    },
                },
                Precedence::InboundFirst => match inbound() {
                    Some(stain) => {
                        decision.decided_by = DecidedBy::Inbound;
                        stain
                    }
                    None => match rule() {
                        Some(d) => from_rule(d, &mut decision),
                        None => Stain::baseline(),
                    },
                },
            }
        };
        drop(snapshot);
        let headers = req.headers_mut();
        if !trusted {
            config.removal.apply(headers);
        }
        // The client's other `baggage` members travel on whatever decided the stain (with a
        // baggage carrier configured; the stain's own member is never inherited), read once
        // an untrusted client's stains are gone: no member the edge strips (a known key
        // other than the configured one, in any spelling) is carried on.
        let stain = match stain.baggage() {
            Some(_) => stain,
            None => {
                let inherited = config.carriers.inherited_baggage(headers);
                stain.with_baggage(inherited)
            }
        };
        // Rewrites every carrier: the decided stain, or none for baseline.
        config.carriers.inject(&stain, headers);
        if let Some(lane) = &config.seed003 {
            let flag = if stain.lane() == Some(lane) {
                "true"
            } else {
                "false"
            };
            headers.insert(X_GRAY_FLAG, HeaderValue::from_static(flag));
            match client_ip {
                Some(ip) => {
                    headers.insert(X_GRAY_IP, super::client_ip::forwarded_for(ip));
                }
                None => {
                    headers.remove(X_GRAY_IP);
                }
            }
        }
        let extensions = req.extensions_mut();
        match path {
            Ok(None) => {}
            Ok(Some(raw)) => {
                extensions.insert(raw);
            }
            Err(e) => {
                tracing::debug!(target: "gray::edge", error = %e, "path rejected; baseline, no rule ran");
                extensions.insert(PathRejected(e));
            }
        }
        if config.decision_extension {
            extensions.insert(decision);
        }
        if config.task_local {
            StainedFuture::stained(stain, req, &mut self.inner)
        } else {
            StainedFuture::stained_unscoped(stain, req, &mut self.inner)
        }
    }
}
