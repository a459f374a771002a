#![doc = include_str!("../../docs/edge.md")]

pub mod client_ip;
mod config;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod file;
pub mod hop;
mod layer;
pub mod live;
mod service;

#[cfg(feature = "etcd")]
pub use self::etcd::EtcdSource;
pub use self::{
    client_ip::{ClientIpResolver, ForwardedHeader, PeerAddr, TrustedProxies, peer_ip},
    config::{KNOWN_STAIN_HEADERS, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    error::SourceError,
    file::{FileSource, WatchHandle},
    layer::EdgeLayer,
    live::{LiveRules, Revision, Snapshot, SnapshotGuard, Status},
    service::{DecidedBy, Edge, EdgeDecision, PathRejected, RawUri},
};
