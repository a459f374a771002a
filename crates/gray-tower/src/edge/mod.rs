#![doc = include_str!("../../docs/edge.md")]

pub mod client_ip;
mod config;
mod error;
pub mod hop;
mod layer;
pub mod live;
mod service;

pub use self::{
    client_ip::{ClientIpResolver, ForwardedHeader, PeerAddr, TrustedProxies, peer_ip},
    config::{KNOWN_STAIN_HEADERS, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    error::RuleSourceError,
    layer::EdgeLayer,
    live::{LiveRules, Revision, Snapshot, SnapshotGuard, Status},
    service::{DecidedBy, Edge, EdgeDecision, PathRejected, RawUri},
};
#[cfg(feature = "etcd")]
pub use gray_source::etcd::{EtcdConfig, EtcdSource, EtcdTls};
#[cfg(feature = "file")]
pub use gray_source::file::FileSource;
pub use gray_source::{Source, WatchHandle};
