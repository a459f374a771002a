//! The stain model of **gray**: gray (canary) releases across a whole chain of services,
//! as tower middleware.
//!
//! A request is *stained* once at the edge; the stain ([`Stain`]: an optional [`Lane`]
//! plus optional version [`Pins`]) then travels in headers through every hop, and at every
//! outbound call a routing policy (gray-policy) decides which instances may serve it. This
//! crate is what every gray crate shares, and nothing that needs a runtime, a rules engine or
//! a configuration loader:
//!
//! | module | what |
//! |---|---|
//! | [`name`] | [`Lane`] and [`Version`] names, interned by [`Names`] |
//! | [`stain`] | the [`Stain`], its [`Pins`], and the [`InheritedBaggage`] it carries onward |
//! | [`labels`] | the [`Labels`] a registry reports for an instance ([`Labelled`]) and where it listens ([`Origin`]) |
//! | [`codec`] | how a stain is read from and written to headers ([`Carriers`]): a plain header, seed 002's JSON route header, a member of W3C `baggage`, or a carrier of your own |
//! | [`carriers_config`] | carriers named in a configuration file ([`CarrierConfig`]) |
//! | `task` (feature `task`) | the task-local stain and the carriers that keep it across `spawn` |
//! | [`rand`], [`backoff`], [`hash`] | the workspace's one random number generator, one retry backoff, one fixed hash |
//! | [`unsent`] | [`Unsent`](unsent::Unsent): an endpoint's error that hands back the request it did not send, so a balancer can send it elsewhere |
//! | [`aborted`] | [`ClientAborted`](aborted::ClientAborted): a request body's error from the client, which no balancer charges to the instance |
//!
//! Routing policies are in gray-policy, staining rules and path normalisation in
//! gray-rules, the configuration loader in gray-config.
//!
//! # Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `task` | no | the task-local stain and its carriers (`gray_core::task`), on tokio |
//! | `opentelemetry` | no | `task` reads the lane in OpenTelemetry baggage too (`task::outbound`, `task::baggage_stain`) |
//!
//! ```
//! use gray_core::{Carriers, Stain, Lane};
//! use http::{HeaderMap, HeaderValue};
//!
//! let carriers = Carriers::default(); // x-gray-lane + x-gray-info
//! let mut inbound = HeaderMap::new();
//! inbound.insert("x-gray-lane", HeaderValue::from_static("canary"));
//! let stain = carriers.extract(&inbound).unwrap_or_default();
//! assert_eq!(stain, Stain::in_lane(Lane::new("canary").unwrap()));
//!
//! let mut outbound = HeaderMap::new();
//! carriers.inject(&stain, &mut outbound);
//! assert_eq!(outbound["x-gray-lane"], "canary");
//! ```

#![forbid(unsafe_code)]

pub mod aborted;
pub mod backoff;
pub mod carriers_config;
pub mod codec;
pub mod hash;
pub mod labels;
pub mod name;
pub mod rand;
pub mod stain;
#[cfg(feature = "task")]
pub mod task;
pub mod unsent;
mod w3c;

pub use carriers_config::CarrierConfig;
pub use codec::{Carrier, Carriers, InheritedBaggage};
pub use stain::{Pins, Stain};

pub use labels::{Labelled, Labels, Origin};
pub use name::{Lane, Names, Version};
