//! Several etcd members forming one cluster on loopback.

use super::{Etcd, Frozen};

/// An etcd cluster of n members on loopback, each with its own ports and data dir; every
/// member is killed when this is dropped.
#[derive(Debug)]
pub struct Cluster {
    members: Vec<Etcd>,
}

impl Cluster {
    /// Starts `n` members (3 for a cluster that survives the loss of one) and waits until
    /// every one of them answers a linearizable read.
    pub async fn start(n: usize) -> Cluster {
        assert!(n > 0, "a cluster has at least one member");
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| Etcd::member(&format!("gray-test-{i}"), None))
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for member in &mut members {
            member.initial_cluster = initial_cluster.clone();
            member.spawn();
        }
        for member in &mut members {
            member.wait_ready().await;
        }
        Cluster { members }
    }

    /// The client URL of every member, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::endpoint).collect()
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &Etcd {
        &self.members[i]
    }

    /// Member `i`, to kill or restart.
    pub fn member_mut(&mut self, i: usize) -> &mut Etcd {
        &mut self.members[i]
    }

    /// Stops member `i` with SIGSTOP until the guard is dropped; see [`Etcd::freeze`].
    pub fn freeze(&self, i: usize) -> Frozen {
        self.members[i].freeze()
    }
}
