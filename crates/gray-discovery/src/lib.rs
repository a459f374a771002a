//! Labelled service instances for **gray** releases, from a static list, a watched file or
//! etcd, as [`tower::discover`] streams.
//!
//! A gray-aware balancer can only pick gray instances if it sees every instance of a
//! service with its labels (`gray=true`, `lane=canary`, `version=2.0`), live. This crate
//! gives it:
//!
//! - the instance model: [`Instance`] = stable [`InstanceId`] + [`Address`] + labels
//!   ([`gray_core::Labels`]), [`Labelled`](gray_core::Labelled);
//! - sources, each a `Stream<Item = Result<Change<InstanceId, Instance>, Error>>` for **one
//!   service**: [`StaticDiscover`], `WatchedFile::service` (TOML, YAML, JSON), and
//!   `etcd::EtcdRegistry::service`;
//! - self-registration in etcd under a lease (`etcd::Registration`);
//! - endpoints: `http::HttpEndpoints` turns the instances of any source into
//!   [`Labelled`](gray_core::Labelled) HTTP client services sharing one connection pool.
//!
//! # One stream per service
//!
//! A balancer balances one service, so every stream is scoped to one. A file or an etcd
//! prefix holds many services: open it once (`WatchedFile::open`, `etcd::EtcdRegistry::new`)
//! and ask it for the stream of each service it should route to (a gateway routing
//! `/{service}/**` asks for one per route). The key of a change is the instance id, unique
//! within its service.
//!
//! # Changes
//!
//! - a new instance is a `Change::Insert(id, instance)`;
//! - a changed instance (address or labels) is a `Change::Insert` with the **same id**: it
//!   *replaces* the previous one, the way tower's balancers treat a repeated key. No
//!   `Remove` precedes it, so the instance never disappears from the balancer meanwhile;
//! - a removed instance is a `Change::Remove(id)`;
//! - nothing is yielded for an edit, a re-list or a put that changes nothing.
//!
//! Sources do not yield errors for transient failures (a bad file edit, etcd down): they
//! keep the last known set, log the failure with `tracing`, and recover by themselves. The
//! [`InstanceSet`] they all use to compute changes is public, for custom sources.
//!
//! # Features
//!
//! | feature | default | what it adds | dependencies |
//! |---|---|---|---|
//! | `file` | yes | `WatchedFile`: TOML, YAML and JSON instance files | `toml`, `serde_norway`, `serde_path_to_error` |
//! | `http` | yes | `http`: instances as pooled HTTP client services | `hyper`, `hyper-util` |
//! | `etcd` | no | `etcd`: discovery and self-registration in etcd | `etcd-client` (tonic, prost; building needs `protoc`) |
//!
//! # Example
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::{Labelled, Labels};
//! use gray_discovery::{Instance, StaticDiscover};
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let mut orders = StaticDiscover::new([
//!     Instance::new("orders-1".parse()?, "127.0.0.1:8081".parse()?, Labels::new()),
//!     Instance::new(
//!         "orders-2".parse()?,
//!         "127.0.0.1:8082".parse()?,
//!         Labels::from_iter([("gray", "true")]),
//!     ),
//! ]);
//! let mut gray = Vec::new();
//! while let Some(change) = orders.next().await {
//!     if let Change::Insert(id, instance) = change? {
//!         if instance.labels().get("gray") == Some("true") {
//!             gray.push(id);
//!         }
//!     }
//! }
//! assert_eq!(gray.len(), 1);
//! assert_eq!(gray[0].as_str(), "orders-2");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "etcd")]
mod backoff;
pub mod error;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod instance;
pub mod set;
pub mod static_list;

pub use error::{Error, ParseError};
#[cfg(feature = "file")]
pub use file::{FileDiscover, Format, WatchedFile};
pub use instance::{Address, Instance, InstanceId, Record};
pub use set::InstanceSet;
pub use static_list::StaticDiscover;
