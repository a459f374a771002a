#![doc = include_str!("../../docs/edge.md")]

pub mod client_ip;
mod error;
mod layer;
pub mod live;
mod service;

pub use self::{
    client_ip::{ClientIpResolver, ForwardedHeader, PeerAddr, TrustedProxies, peer_ip},
    error::RuleSourceError,
    layer::{EdgeLayer, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    live::{LiveRules, Revision, Snapshot, SnapshotGuard, Status},
    service::{DecidedBy, Edge, EdgeDecision},
};
#[cfg(feature = "etcd")]
pub use gray_source::etcd::{EtcdConfig, EtcdSource, EtcdTls};
#[cfg(feature = "file")]
pub use gray_source::file::FileSource;
pub use gray_source::{Source, WatchHandle};
