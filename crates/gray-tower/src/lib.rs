//! Tower layers that carry a gray stain from every inbound request to every outbound call.
//!
//! ```text
//! inbound ──► ExtractStain ──► handler ──► PropagateStain ──► client ──► next service
//!              reads carriers     task-local    writes carriers
//!              into extensions    + extensions
//!              and task-local
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`edge`] | edge layer: decides the stain by rules, strips untrusted stains and hop-by-hop headers, normalises paths, live rules |
//! | [`extract`] | server layer: reads the stain into the request extensions and a task-local |
//! | [`propagate`] | client layer for any `tower::Service<http::Request<B>>` (hyper-util, tonic) |
//! | [`capture`] | copies the task-local into the extensions, for stacks with a `Buffer` |
//! | [`task`] | the task-local, and `spawn` / `spawn_blocking` / future carriers |
//! | `reqwest` | the client side as a `reqwest-middleware` middleware (feature `reqwest`) |
//!
//! # Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `file` | yes | live edge rules from a polled file (`edge::FileSource`, from gray-source) |
//! | `reqwest` | no | [`reqwest::PropagateMiddleware`](crate::reqwest) for `reqwest-middleware` |
//! | `etcd` | no | live edge rules from an etcd key (`edge::EtcdSource`, from gray-source; etcd-client 0.21) |
//! | `etcd-tls` | no | TLS to etcd (`edge::EtcdTls`: rustls on ring) |
//! | `axum` | no | the edge reads the peer address from axum's `ConnectInfo<SocketAddr>` |
//!
//! The layers work unchanged on tonic servers (`Server::builder().layer(..)`) and around a
//! tonic `Channel`: both speak `http::Request`.
//!
//! ```
//! use gray_core::Stain;
//! use gray_tower::{ExtractStainLayer, PropagateStainLayer, task};
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
//! // The inbound service: its handler calls the client without passing any context.
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

pub mod capture;
pub mod edge;
pub mod extract;
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

/// The former names of this crate's layers, before `Context` became [`Stain`](gray_core::Stain).
#[doc(hidden)]
pub mod deprecated {
    /// Renamed [`ExtractStainLayer`](crate::ExtractStainLayer).
    #[deprecated(since = "0.2.0", note = "renamed to `ExtractStainLayer`")]
    pub type ExtractContextLayer = crate::ExtractStainLayer;
    /// Renamed [`ExtractStain`](crate::ExtractStain).
    #[deprecated(since = "0.2.0", note = "renamed to `ExtractStain`")]
    pub type ExtractContext<S> = crate::ExtractStain<S>;
    /// Renamed [`PropagateStainLayer`](crate::PropagateStainLayer).
    #[deprecated(since = "0.2.0", note = "renamed to `PropagateStainLayer`")]
    pub type PropagateContextLayer = crate::PropagateStainLayer;
    /// Renamed [`PropagateStain`](crate::PropagateStain).
    #[deprecated(since = "0.2.0", note = "renamed to `PropagateStain`")]
    pub type PropagateContext<S> = crate::PropagateStain<S>;
    /// Renamed [`CaptureStainLayer`](crate::CaptureStainLayer).
    #[deprecated(since = "0.2.0", note = "renamed to `CaptureStainLayer`")]
    pub type CaptureContextLayer = crate::CaptureStainLayer;
    /// Renamed [`CaptureStain`](crate::CaptureStain).
    #[deprecated(since = "0.2.0", note = "renamed to `CaptureStain`")]
    pub type CaptureContext<S> = crate::CaptureStain<S>;
    /// Renamed [`EdgeLayer`](crate::EdgeLayer).
    #[deprecated(since = "0.2.0", note = "renamed to `EdgeLayer`")]
    pub type StainLayer = crate::EdgeLayer;
}
#[allow(deprecated)]
pub use deprecated::*;
