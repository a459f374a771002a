#![doc = include_str!("../../docs/edge.md")]

mod body;
pub mod client_ip;
mod config;
mod error;
mod future;
pub mod hop;
mod layer;
pub mod live;
mod refusal;
mod service;

pub use self::{
    body::EdgeBody,
    client_ip::{ClientIpResolver, ForwardedHeader, PeerAddr, TrustedProxies, peer_ip},
    config::{KNOWN_STAIN_HEADERS, Precedence, X_GRAY_FLAG, X_GRAY_IP},
    error::RuleSourceError,
    future::EdgeFuture,
    layer::EdgeLayer,
    live::{LiveRules, PercentOverride, Revision, RulesGuard, RulesSnapshot, RulesStatus},
    service::{DecidedBy, Edge, EdgeDecision, RawUri},
};
/// What an edge is configured with, from the crates that define it: the rule set and its
/// formats and CIDR lists (gray-rules), and path normalisation.
#[doc(no_inline)]
pub use gray_rules::{CidrList, Format, RuleSet, RulesError, StickyArm, StickyRuleError, path};
/// The former name of [`RulesSnapshot`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `RulesSnapshot` (one name for one thing); removed in 0.4.0"
)]
pub type Snapshot = RulesSnapshot;
/// The former name of [`RulesGuard`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `RulesGuard` (one name for one thing); removed in 0.4.0"
)]
pub type SnapshotGuard = RulesGuard;
/// The former name of [`RulesStatus`].
#[deprecated(
    since = "0.3.0",
    note = "renamed `RulesStatus` (one name for one thing); removed in 0.4.0"
)]
pub type Status = RulesStatus;
#[cfg(feature = "etcd")]
pub use gray_source::etcd::{EtcdConfig, EtcdSource, EtcdTls};
#[cfg(feature = "file")]
pub use gray_source::file::FileSource;
pub use gray_source::{Source, WatchHandle};
