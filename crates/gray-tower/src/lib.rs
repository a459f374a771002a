//! Tower layers that carry a gray stain from every inbound request to every outbound call.
//!
//! ```text
//! inbound ──► ExtractStain ──► handler ──► PropagateStain ──► client ──► next service
//!              reads carriers     task-local    writes carriers
//!              into extensions    + extensions  (the decision wins)
//!              and task-local
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`edge`] | edge layer: decides the stain by rules, strips untrusted stains and hop-by-hop headers, normalises paths, live rules |
//! | [`extract`] | server layer: reads the stain into the request extensions and a task-local |
//! | [`propagate`] | client layer for any `tower::Service<http::Request<B>>` (hyper-util, tonic) |
//! | [`capture`] | copies the task-local into the extensions, for stacks with a `Buffer` |
//! | [`mirror`] | client layer: copies baseline's requests to a lane, fire and forget (a dark launch of the next service) |
//! | [`task`] | the task-local, and `spawn` / `spawn_blocking` / future carriers |
//! | [`baggage`] | W3C `baggage`: every member travels; the guide for a chain across languages |
//! | `reqwest` | the client side as a `reqwest-middleware` middleware (feature `reqwest`) |
//! | `otel` | the lane as a member of OpenTelemetry baggage, both ways (feature `opentelemetry`) |
//! | `balance` | gray-balance, the label-aware balancer (feature `balance`) |
//! | `discovery` | gray-discovery, instances, registries and endpoints (feature `discovery`) |
//!
//! # One dependency
//!
//! This crate re-exports what a user of its layers names from `gray-core`: the stain
//! ([`Stain`], [`Lane`], [`Version`], [`Pins`]), the carriers ([`Carriers`], [`PlainHeader`],
//! [`RouteHeader`], [`BaggageMember`], [`InheritedBaggage`], and the whole [`codec`] module),
//! the interner ([`Names`]); the routing policy types ([`Policy`], [`Fallback`],
//! [`Unlabelled`], [`OnUnready`], [`PolicyConfig`], [`Unroutable`]); and in [`edge`], what
//! an edge is configured with ([`edge::RuleSet`], [`edge::Format`], [`edge::CidrList`],
//! [`edge::path`]). An axum service needs only:
//!
//! ```toml
//! [dependencies]
//! gray-tower = { version = "0.3", features = ["reqwest"] }
//! ```
//!
//! (beside `axum`, `reqwest` and `tokio`, which it has anyway). A service that routes its
//! outbound calls adds the features `balance` and `discovery`, and a custom gateway
//! `axum` too: the balancer and the registry are then `gray_tower::balance` and
//! `gray_tower::discovery`, and nothing else from gray is needed (the guide "A
//! custom gateway" walks through one).
//!
//! # Builders
//!
//! Every layer is built the same way: `new()` for the defaults, then `with_*` setters, in
//! any order, with the same names on every layer: `with_carriers` (which headers; use the
//! same [`Carriers`] on the server layer and on the clients), `with_default` (the stain of a
//! request without one, [`ExtractStainLayer`]), `with_existing` (a request that already
//! carries a stain, [`PropagateStainLayer`] and the reqwest middleware). A layer holds the
//! configuration and calls its service's constructor; a service's own `new(inner)` uses the
//! defaults.
//!
//! # Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `file` | yes | live edge rules from a polled file (`edge::FileSource`, from gray-source) |
//! | `reqwest` | no | `reqwest::PropagateMiddleware` for `reqwest-middleware` (0.5) |
//! | `opentelemetry` | no | module `otel`: the lane in OpenTelemetry baggage (`opentelemetry` 0.33), both ways |
//! | `etcd` | no | live edge rules from an etcd key (`edge::EtcdSource`, from gray-source; etcd-client 0.21) |
//! | `etcd-tls` | no | TLS to etcd (`edge::EtcdTls`: rustls on ring) |
//! | `axum` | no | the edge reads the peer address from axum's `ConnectInfo<SocketAddr>`, and refuses to run after axum's routing |
//! | `toml`, `yaml` | no | rule sets in TOML or YAML (`edge::Format`; JSON always) |
//! | `balance` | no | module `balance`: gray-balance, the label-aware balancer |
//! | `discovery` | no | module `discovery`: gray-discovery with its HTTP/1.1 endpoints; with `file`, instances from a watched file; with `etcd`, from etcd |
//! | `tonic` | no | `discovery::grpc::GrpcChannels`: a tonic channel per instance |
//!
//! The layers work unchanged on tonic servers (`Server::builder().layer(..)`) and around a
//! tonic `Channel`: both speak `http::Request`.
//!
//! ```
//! use gray_tower::{ExtractStainLayer, PropagateStainLayer};
//! use http::{Request, Response};
//! use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // The outbound client: stands in for hyper-util's Client, echoes the header it got.
//! let client = ServiceBuilder::new()
//!     .layer(PropagateStainLayer::new())
//!     .service(service_fn(|req: Request<()>| async move {
//!         Ok::<_, tower::BoxError>(Response::new(req.headers().get("x-gray-lane").cloned()))
//!     }));
//!
//! // The inbound service: its handler calls the client without passing any stain.
//! let server = ServiceBuilder::new()
//!     .layer(ExtractStainLayer::new())
//!     .service(service_fn(move |_req: Request<()>| {
//!         let client = client.clone();
//!         async move { client.oneshot(Request::new(())).await }
//!     }));
//!
//! let inbound = Request::builder().header("x-gray-lane", "gray").body(())?;
//! let res = server.oneshot(inbound).await?;
//! assert_eq!(res.body().as_ref().unwrap(), "gray");
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

#[macro_use]
mod macros;

pub mod baggage;
pub mod capture;
pub mod edge;
pub mod extract;
pub mod grpc;
pub mod mirror;
#[cfg(feature = "opentelemetry")]
pub mod otel;
pub mod propagate;
#[cfg(feature = "reqwest")]
pub mod reqwest;
/// The task-local stain and its carriers (re-exported from `gray_core::task`).
pub use gray_core::task;

pub use capture::{CaptureStain, CaptureStainLayer};
pub use edge::{Edge, EdgeLayer, LiveRules};
pub use extract::{ExtractStain, ExtractStainLayer};
pub use propagate::{Existing, PropagateStain, PropagateStainLayer};
pub use task::{StainExt, current};
/// tower's `Layer` trait (from `tower-layer`), for `EdgeLayer::new(rules).layer(router)`
/// without a dependency on tower.
pub use tower_layer::Layer;

/// The wire codecs of `gray-core` (`gray_core::codec`): carriers, rejections, limits.
#[doc(inline)]
pub use gray_core::codec;
#[doc(inline)]
pub use gray_core::{
    Carriers, InheritedBaggage, Lane, Names, Pins, Stain, Version,
    codec::{BaggageMember, DEFAULT_BAGGAGE_KEY, PlainHeader, RouteHeader},
};
pub use gray_policy::{
    Fallback, FlagValues, OnUnready, Policy, PolicyConfig, Unlabelled, Unroutable, UnroutableReason,
};

/// The balancer (feature `balance`): gray-balance, re-exported whole.
#[cfg(feature = "balance")]
#[doc(inline)]
pub use gray_balance as balance;
/// Instances, registries and endpoints (feature `discovery`): gray-discovery, re-exported
/// whole.
#[cfg(feature = "discovery")]
#[doc(inline)]
pub use gray_discovery as discovery;
