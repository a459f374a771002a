//! How a watch tells that what it handed out cannot be trusted any more: the cluster's
//! identity (cluster ID, raft terms), and the keys at the revision handed out, listed again
//! on every new connection.

use std::{collections::HashMap, fmt};

use etcd_client::{KeyValue, ResponseHeader};

/// What the watch saw of one key: a later listing of the same revision must show the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The key's version (1 at its creation, + 1 at each change).
    pub(crate) version: i64,
    /// The revision of its last change.
    pub(crate) mod_revision: i64,
}

impl Seen {
    pub(crate) fn of(kv: &KeyValue) -> Seen {
        Seen {
            version: kv.version(),
            mod_revision: kv.mod_revision(),
        }
    }
}

/// The cluster ID and each member's raft term: neither changes in a cluster's life except
/// the term, which only grows.
#[derive(Default)]
pub(super) struct Identity {
    /// The cluster ID, once seen.
    pub(super) cluster: Option<u64>,
    terms: HashMap<u64, u64>,
}

/// Why what was handed out cannot be trusted any more.
pub(super) enum Reset {
    Cluster {
        old: u64,
        new: u64,
    },
    Term {
        member: u64,
        old: u64,
        new: u64,
    },
    Revision {
        old: i64,
        new: i64,
    },
    History(String),
    /// The keys listed at the revision handed out are not the ones handed out.
    Keys {
        revision: i64,
        differences: String,
    },
}

// === impl Reset ===

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reset::Cluster { old, new } => {
                write!(f, "the cluster ID changed from {old:x} to {new:x}")
            }
            Reset::Term { member, old, new } => write!(
                f,
                "member {member:x} went back from raft term {old} to {new} (it restarted without its data)"
            ),
            Reset::Revision { old, new } => write!(
                f,
                "the store is at revision {new}, behind revision {old} already handed out (it lost its data)"
            ),
            Reset::History(what) => write!(f, "the history does not follow: {what}"),
            Reset::Keys {
                revision,
                differences,
            } => write!(
                f,
                "the keys at revision {revision} are not the ones handed out ({differences}): \
                 the store lost its data and was written again"
            ),
        }
    }
}

// === impl Identity ===

impl Identity {
    /// Records a response header; says why the cluster cannot be the one seen before.
    pub(super) fn observe(&mut self, header: &ResponseHeader) -> Option<Reset> {
        let mut reset = None;
        let cluster = header.cluster_id();
        if cluster == 0 {
            // Not filled in (a proxy in between): nothing to tell.
            return None;
        }
        match self.cluster {
            Some(old) if old != cluster => {
                reset = Some(Reset::Cluster { old, new: cluster });
                self.terms.clear();
            }
            _ => {}
        }
        self.cluster = Some(cluster);
        let (member, term) = (header.member_id(), header.raft_term());
        if let Some(old) = self.terms.insert(member, term)
            && term < old
            && reset.is_none()
        {
            reset = Some(Reset::Term {
                member,
                old,
                new: term,
            });
        }
        reset
    }
}

/// How many keys of each kind a difference names (the counts are complete).
const NAMED: usize = 3;

/// Compares the keys listed at the revision handed out with the keys held at it: `None`
/// when they are the same (every key, its version and its last change), otherwise the
/// differences, for the log: keys gone, keys never handed out, keys at another version.
pub(super) fn differences(
    held: &HashMap<String, Seen>,
    listed: &HashMap<String, Seen>,
) -> Option<String> {
    let mut gone: Vec<&str> = held
        .keys()
        .filter(|k| !listed.contains_key(*k))
        .map(String::as_str)
        .collect();
    let mut unknown = Vec::new();
    let mut changed = Vec::new();
    for (key, seen) in listed {
        match held.get(key) {
            None => unknown.push(key.as_str()),
            Some(held) if held != seen => changed.push(key.as_str()),
            Some(_) => {}
        }
    }
    if gone.is_empty() && unknown.is_empty() && changed.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for (what, keys) in [
        ("gone", &mut gone),
        ("never handed out", &mut unknown),
        ("at another version", &mut changed),
    ] {
        if keys.is_empty() {
            continue;
        }
        keys.sort_unstable();
        let shown = keys[..keys.len().min(NAMED)].join(", ");
        let more = keys.len().saturating_sub(NAMED);
        parts.push(match more {
            0 => format!("{} {what}: {shown}", keys.len()),
            more => format!("{} {what}: {shown} and {more} more", keys.len()),
        });
    }
    Some(parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[(&str, i64, i64)]) -> HashMap<String, Seen> {
        list.iter()
            .map(|&(key, version, mod_revision)| {
                (
                    key.to_owned(),
                    Seen {
                        version,
                        mod_revision,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_same_keys_at_the_same_versions_are_no_difference() {
        let held = keys(&[("/a", 1, 2), ("/b", 3, 7)]);
        assert_eq!(differences(&held, &held.clone()), None);
        assert_eq!(differences(&HashMap::new(), &HashMap::new()), None);
    }

    #[test]
    fn keys_gone_new_or_changed_are_named_and_counted() {
        let held = keys(&[
            ("/a", 1, 2),
            ("/b", 1, 3),
            ("/c", 1, 4),
            ("/d", 1, 5),
            ("/e", 1, 6),
        ]);
        let listed = keys(&[("/e", 1, 9), ("/x", 1, 7), ("/f", 2, 8)]);
        assert_eq!(
            differences(&held, &listed).unwrap(),
            "4 gone: /a, /b, /c and 1 more; 2 never handed out: /f, /x; 1 at another version: /e"
        );
        // The same version at another revision is another key's life.
        let listed = keys(&[
            ("/a", 1, 12),
            ("/b", 1, 3),
            ("/c", 1, 4),
            ("/d", 1, 5),
            ("/e", 1, 6),
        ]);
        assert_eq!(
            differences(&held, &listed).unwrap(),
            "1 at another version: /a"
        );
    }
}
