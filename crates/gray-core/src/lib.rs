//! The context model and wire codecs of **gray**: gray (canary) releases across a whole
//! chain of services, as tower middleware.
//!
//! A request is *stained* once at the edge; the stain ([`Stain`]: an optional [`Lane`]
//! plus optional version [`Pins`]) then travels in headers through every hop. This crate
//! holds what every other gray crate shares and nothing that needs a runtime:
//!
//! - [`name`]: [`Lane`] and [`Version`] names, interned by [`Names`];
//! - [`stain`]: the [`Stain`], its [`Pins`] and its [`InheritedBaggage`];
//! - [`labels`]: the [`Labels`] a registry reports for an instance;
//! - [`codec`]: how a context is read from and written to headers ([`Carriers`]): a plain
//!   header, seed 002's JSON route header, or a member of the W3C `baggage` header;
//! - [`rules`]: the staining rules the edge decides by ([`RuleSet`]), from TOML, YAML or JSON.
//!
//! # Cargo features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `toml` | no | rule sets in TOML ([`rules::Format::Toml`]) |
//! | `yaml` | no | rule sets in YAML, through `serde_norway` ([`rules::Format::Yaml`]) |
//!
//! ```
//! use gray_core::{Carriers, Stain, Lane};
//! use http::{HeaderMap, HeaderValue};
//!
//! let carriers = Carriers::default(); // x-gray-lane + x-gray-info
//! let mut inbound = HeaderMap::new();
//! inbound.insert("x-gray-lane", HeaderValue::from_static("canary"));
//! let ctx = carriers.extract(&inbound).unwrap_or_default();
//! assert_eq!(ctx, Stain::in_lane(Lane::new("canary").unwrap()));
//!
//! let mut outbound = HeaderMap::new();
//! carriers.inject(&ctx, &mut outbound);
//! assert_eq!(outbound["x-gray-lane"], "canary");
//! ```

#![forbid(unsafe_code)]

pub mod backoff;
pub mod codec;
pub mod format;
pub mod labels;
pub mod matching;
pub mod name;
pub mod rand;
pub mod rules;
pub mod stain;
#[cfg(feature = "task")]
pub mod task;

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
