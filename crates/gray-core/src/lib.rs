//! The stain model, routing policy, staining rules and wire codecs of **gray**: gray
//! (canary) releases across a whole chain of services, as tower middleware.
//!
//! A request is *stained* once at the edge; the stain ([`Stain`]: an optional [`Lane`]
//! plus optional version [`Pins`]) then travels in headers through every hop, and at every
//! outbound call a [`Policy`] decides which instances may serve it. This crate holds what
//! every other gray crate shares and nothing that needs a runtime:
//!
//! - [`name`]: [`Lane`] and [`Version`] names, interned by [`Names`];
//! - [`stain`]: the [`Stain`], its [`Pins`] and its [`InheritedBaggage`];
//! - [`labels`]: the [`Labels`] a registry reports for an instance, and an instance's
//!   [`Origin`];
//! - [`matching`]: the routing [`Policy`] (which instances fit a stain, the [`Fallback`]
//!   when none does, the seed presets) and its [`Decision`](matching::Decision)s;
//! - [`codec`]: how a stain is read from and written to headers ([`Carriers`]): a plain
//!   header, seed 002's JSON route header, or a member of the W3C `baggage` header;
//! - [`carriers_config`]: carriers named in a configuration file ([`CarrierConfig`]);
//! - [`rules`]: the staining rules the edge decides by ([`RuleSet`]);
//! - [`path`]: the one normal form of a request path that rules and upstreams both see;
//! - [`config`]: the one configuration loader (TOML, YAML, JSON), whose errors name the
//!   file, the line and the field;
//! - [`rand`] and [`backoff`]: the workspace's random numbers and its retry backoff;
//! - `task` (feature `task`): the task-local stain and the carriers that keep it across
//!   `spawn`.
//!
//! # Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `toml` | no | TOML documents in [`config`] ([`config::Format::Toml`]): rule sets, policies, any configuration file |
//! | `yaml` | no | YAML documents in [`config`], through `serde_norway` ([`config::Format::Yaml`]) |
//! | `task` | no | the task-local stain and its carriers (`gray_core::task`), on tokio |
//!
//! JSON documents are always available.
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

pub mod backoff;
mod baggage;
pub mod carriers_config;
pub mod codec;
pub mod config;
pub mod labels;
pub mod matching;
pub mod name;
pub mod path;
pub mod rand;
pub mod rules;
pub mod stain;
#[cfg(feature = "task")]
pub mod task;

pub use carriers_config::CarrierConfig;
pub use codec::{Carrier, Carriers, InheritedBaggage};
pub use stain::{Pins, Stain};

/// The former name of [`Stain`].
#[deprecated(
    since = "0.2.0",
    note = "renamed to `Stain`, which collides with neither `std::task::Context` nor `opentelemetry::Context`"
)]
pub type Context = Stain;
pub use labels::{Labelled, Labels, Origin};
pub use matching::{Fallback, Policy, Unlabelled, Unroutable};
pub use name::{Lane, Names, Version};
pub use rules::{RequestView, RuleSet, RulesError};
