use std::{
    borrow::Cow,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    task::{Context, Poll},
};

use gray_core::Stain;
use gray_rules::{
    RequestView, RuleMatch,
    path::{PathError, normalize_uri},
};
use http::{HeaderValue, Request, Response, Uri};
use tower_service::Service;

use super::{
    body::EdgeBody,
    client_ip::{append_forwarded_for, forwarded_for, peer_ip},
    config::{Config, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    future::EdgeFuture,
    hop,
    refusal::{NeedsIp, Refusal, escapes_prefix},
};
use crate::{extract::StainedFuture, grpc};

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
}

impl DecidedBy {
    /// `rule`, `inbound` or `default`: for logs and JSON bodies.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Rule => "rule",
            DecidedBy::Inbound => "inbound",
            DecidedBy::Default => "default",
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

/// A request extension: the URI as the client sent it, when the edge rewrote the request
/// to the normalised path (for logs; a path that climbs out of the first segment it names,
/// `/svc/../other`, is refused by the edge itself with
/// [`with_reject_prefix_escape`](super::EdgeLayer::with_reject_prefix_escape)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawUri(pub Uri);

/// The edge layer's service: decides the stain by the rules, strips untrusted stains,
/// writes the decided stain for downstream, and answers the requests it refuses itself.
/// Built by [`EdgeLayer`](super::EdgeLayer).
#[derive(Debug, Clone)]
pub struct Edge<S> {
    inner: S,
    config: Arc<Config>,
    peer: Option<Peer>,
}

/// The connection's peer, given by [`Edge::with_peer`].
#[derive(Debug, Clone)]
struct Peer {
    ip: IpAddr,
    /// Its `X-Forwarded-For` entry, made once per connection (with `with_forwarded_for`).
    entry: Option<HeaderValue>,
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
    /// use gray_tower::edge::{CidrList, EdgeLayer, LiveRules, RuleSet};
    /// use http::{Request, Response};
    /// use tower::{Layer, ServiceExt, service_fn};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // Stains from 10.0.0.0/8 are honoured.
    /// let edge = EdgeLayer::new(LiveRules::new(RuleSet::default()))
    ///     .with_trusted_clients(CidrList::parse(["10.0.0.0/8"]).unwrap());
    /// let lane_seen = service_fn(|req: Request<()>| async move {
    ///     let lane = req.extensions().get::<Stain>().and_then(|c| c.lane().cloned());
    ///     Ok::<_, std::convert::Infallible>(Response::new(lane.map(|l| l.to_string())))
    /// });
    /// // In the accept loop, once per connection:
    /// let from = |peer: &str| edge.layer(lane_seen).with_peer(peer.parse().unwrap());
    /// for (peer, lane) in [("10.0.0.7:50000", Some("gray")), ("192.0.2.1:50000", None)] {
    ///     let req = Request::get("/").header("x-gray-lane", "gray").body(()).unwrap();
    ///     let res = from(peer).oneshot(req).await.unwrap();
    ///     assert_eq!(res.into_body().into_inner().flatten().as_deref(), lane);
    /// }
    /// # });
    /// ```
    #[must_use]
    pub fn with_peer(mut self, peer: SocketAddr) -> Self {
        let ip = peer.ip();
        self.peer = Some(Peer {
            ip,
            entry: self.config.forwarded_for.then(|| forwarded_for(ip)),
        });
        self
    }

    /// The `X-Forwarded-For` entry for a request whose own peer extension is
    /// `request_peer`: the connection's, made once, unless the request names another.
    fn forwarded_entry(&self, request_peer: Option<IpAddr>) -> Option<Cow<'_, HeaderValue>> {
        match (&self.peer, request_peer) {
            (Some(Peer { ip, entry }), request) if request.is_none_or(|r| r == *ip) => {
                Some(match entry {
                    Some(entry) => Cow::Borrowed(entry),
                    None => Cow::Owned(forwarded_for(*ip)),
                })
            }
            (_, Some(ip)) => Some(Cow::Owned(forwarded_for(ip))),
            (_, None) => None,
        }
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

impl<S, B, ResBody> Service<Request<B>> for Edge<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<EdgeBody<ResBody>>;
    type Error = S::Error;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &*self.config;
        // Behind axum's router, the path was routed before the edge could normalise it.
        #[cfg(feature = "axum")]
        if config.normalize_paths
            && req
                .extensions()
                .get::<axum::extract::MatchedPath>()
                .is_some()
        {
            config.notices.after_routing();
            return EdgeFuture::refused(Refusal::AfterRouting, grpc::is_grpc(req.headers()));
        }
        // The path first: a rejected one is answered here, and no rule ever sees it.
        let raw_uri = if config.normalize_paths {
            match normalize_path(&mut req) {
                Ok(raw) => raw,
                Err(e) => {
                    tracing::debug!(target: "gray::edge", error = %e, "path rejected: 400");
                    return EdgeFuture::refused(Refusal::Path(e), grpc::is_grpc(req.headers()));
                }
            }
        } else {
            None
        };
        // `/svc/../other/x` became `/other/x`: a client that names one segment must not
        // reach another.
        if config.reject_prefix_escape
            && let Some(RawUri(raw)) = &raw_uri
            && escapes_prefix(raw.path(), req.uri().path())
        {
            tracing::debug!(target: "gray::edge", path = %raw, "path leaves its first segment: 400");
            return EdgeFuture::refused(Refusal::PrefixEscape, grpc::is_grpc(req.headers()));
        }

        let request_peer = peer_ip(req.extensions());
        let peer = request_peer.or(self.peer.as_ref().map(|p| p.ip));
        // The forwarding chain as the trusted proxy delivered it, before anything is removed.
        let client_ip = config.resolver.resolve(peer, req.headers());
        let trusted = client_ip.is_some_and(|ip| config.trusted_clients.contains(ip));
        // What the client meant for this hop only goes before the stain is read or written.
        if config.hop_by_hop {
            hop::strip(req.headers_mut());
        }

        // One snapshot decides the whole request.
        let snapshot = config.rules.load();
        if peer.is_none() {
            let needs = NeedsIp {
                trusted_clients: !config.trusted_clients.is_empty(),
                trusted_proxies: config.resolver.trusts_proxies(),
            };
            config
                .notices
                .missing_peer(needs, snapshot.generation(), || {
                    snapshot.rules().reads_client_ip()
                });
        }
        let mut decision = EdgeDecision {
            decided_by: DecidedBy::Default,
            rule_index: None,
            rule_name: None,
            generation: snapshot.generation(),
            client_ip,
            trusted,
        };
        let stain = {
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
        // The peer, for the next hop's view of the chain.
        if config.forwarded_for
            && let Some(entry) = self.forwarded_entry(request_peer)
        {
            append_forwarded_for(req.headers_mut(), &entry);
        }
        let extensions = req.extensions_mut();
        if let Some(raw) = raw_uri {
            extensions.insert(raw);
        }
        if config.decision_extension {
            extensions.insert(decision);
        }
        EdgeFuture::passed(if config.task_local {
            StainedFuture::stained(stain, req, &mut self.inner)
        } else {
            StainedFuture::stained_unscoped(stain, req, &mut self.inner)
        })
    }
}
