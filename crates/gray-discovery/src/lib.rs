//! Labelled service instances for **gray** releases: a [`Registry`] per source (a file,
//! etcd, a fixed list) that follows it on its own, and the instances of each service as
//! [`tower::discover`] streams of any client service.
//!
//! A gray-aware balancer can only pick gray instances if it sees every instance of a
//! service with its labels (`gray=true`, `lane=canary`, `version=2.0`), live, whether or
//! not requests flow. This crate gives it:
//!
//! - the instance model: [`Instance`] = stable [`InstanceId`] + [`Address`] + labels
//!   ([`gray_core::Labels`]), [`Labelled`](gray_core::Labelled) and
//!   [`Origin`](gray_core::Origin);
//! - [`Registry`]: one per source, built on [`gray_source`] (a polled file, a watched etcd
//!   prefix): it lists at start and applies every change as it arrives from a task of its
//!   own; [`Registry::service`] gives the instances of one service now
//!   ([`ServiceInstances::instances`], for `/explain`, metrics, readiness) and as a discover
//!   stream ([`ServiceInstances::discover`]) for any number of balancers;
//! - endpoints: a [`MakeEndpoint`] turns each instance into a client service
//!   ([`ServiceInstances::endpoints`]): an HTTP/1 `http::HttpEndpoint` with its own
//!   keep-alive connections, a tonic `Channel` (`grpc::GrpcChannels`), or your own; the
//!   [`Endpoint`] keeps the instance's labels beside it;
//! - self-registration in etcd under a lease (`etcd::Registrar`).
//!
//! # Changes
//!
//! Every discover stream yields `Change<InstanceId, _>`, keyed by the instance id (unique
//! within its service):
//!
//! - a new instance is a `Change::Insert(id, instance)`;
//! - a changed instance (address or labels) is a `Change::Insert` with the **same id**: it
//!   *replaces* the previous one, the way tower's balancers treat a repeated key. No
//!   `Remove` precedes it, so the instance never disappears from the balancer meanwhile;
//! - a removed instance is a `Change::Remove(id)`;
//! - nothing is yielded for an edit, a re-list or a put that changes nothing.
//!
//! The streams never fail: a bad file edit or etcd being down is logged (`tracing`, target
//! `gray::discovery` and `gray::source`), the last known instances stay, and the registry
//! recovers by itself. The [`InstanceSet`] that computes the changes is public, for custom
//! sources.
//!
//! # Other registries
//!
//! A registry this crate does not know (Consul, Nacos, Kubernetes EndpointSlices) takes
//! two pieces: a [`gray_source::Source`] that reads it (bytes by key, and a watch of
//! `Reset`/`Put`/`Delete` updates) and a [`Decoder`] that turns those bytes into
//! instances ([`registry::Effect`]); [`Registry::start_with`] joins them. The crate's own
//! [`Layout`]s are decoders too. `examples/extension` does this for a Consul-style HTTP
//! catalogue.
//!
//! # Features
//!
//! | feature | default | what it adds | dependencies |
//! |---|---|---|---|
//! | `file` | yes | [`file`](mod@file): TOML, YAML and JSON instance files, read by a [`Registry`] from a `FileSource` | `toml`, `serde_norway`, `serde_path_to_error` |
//! | `http` | yes | `http`: instances as HTTP/1.1 client services with their own keep-alive connections | `hyper`, `hyper-util` |
//! | `etcd` | no | `etcd`: a [`Registry`] from an `EtcdSource` prefix, and self-registration under a lease | `etcd-client` (tonic, prost; building needs `protoc` and the well-known protos) |
//! | `tonic` | no | `grpc`: instances as lazily connected HTTP/2 tonic `Channel`s | `tonic` (no `protoc`) |
//!
//! # Example
//!
//! ```
//! use futures_util::StreamExt;
//! use gray_core::Labels;
//! use gray_discovery::{Instance, Registry};
//! use tower::discover::Change;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let registry = Registry::from_static([(
//!     "orders",
//!     [
//!         Instance::new("orders-1".parse()?, "127.0.0.1:8081".parse()?, Labels::new()),
//!         Instance::new(
//!             "orders-2".parse()?,
//!             "127.0.0.1:8082".parse()?,
//!             Labels::from_iter([("gray", "true")]),
//!         ),
//!     ],
//! )])?;
//! let orders = registry.service("orders")?;
//! let gray: Vec<_> = orders
//!     .instances()
//!     .into_iter()
//!     .filter(|i| i.labels().get("gray") == Some("true"))
//!     .collect();
//! assert_eq!(gray.len(), 1);
//! assert_eq!(gray[0].id().as_str(), "orders-2");
//!
//! let mut discover = orders.discover();
//! let Some(Ok(Change::Insert(first, _))) = discover.next().await else { unreachable!() };
//! assert_eq!(first.as_str(), "orders-1");
//! # Ok::<(), gray_discovery::Error>(())
//! # }).unwrap();
//! ```

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod endpoint;
pub mod error;
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd;
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub mod file;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod grpc;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod instance;
pub mod registry;
pub mod set;
pub mod static_list;

/// The sources a [`Registry`] follows ([`gray_source`]), re-exported: `FileSource`
/// (feature `file`), `EtcdConfig` and `EtcdSource` (feature `etcd`), `Status`.
pub use gray_source as source;

pub use endpoint::{Endpoint, Endpoints, MakeEndpoint};
pub use error::Error;
pub use instance::{Address, Instance, InstanceId, Record};
pub use registry::{Decoder, InstanceDiscover, InstanceSource, Layout, Registry, ServiceInstances};
pub use set::InstanceSet;
pub use static_list::StaticDiscover;
