//! [`InstanceSet`]: the instances of one service, and the changes that bring a balancer from
//! one set to the next.
//!
//! A [`Registry`](crate::Registry) keeps one per service; it is public so that custom
//! discover streams emit the same changes. Applying one registry event costs O(1) whatever
//! the size of the set; replacing the whole set (a re-list, a file edit) costs O(n) and
//! emits only the difference.
//!
//! ```
//! use gray_core::Labels;
//! use gray_discovery::{Instance, InstanceSet};
//! use tower::discover::Change;
//!
//! let a = Instance::new("a".parse()?, "127.0.0.1:1".parse()?, Labels::new());
//! let b = Instance::new("b".parse()?, "127.0.0.1:2".parse()?, Labels::new());
//! let mut set = InstanceSet::new();
//! assert_eq!(set.replace([a.clone(), b.clone()]).len(), 2);
//!
//! // b gets a label, a goes away: one replace (an `Insert` with b's key), one `Remove`.
//! let b2 = b.clone().with_labels(Labels::from_iter([("gray", "true")]));
//! let changes = set.replace([b2]);
//! assert!(matches!(&changes[..], [Change::Remove(a), Change::Insert(b, _)]
//!     if a.as_str() == "a" && b.as_str() == "b"));
//! # Ok::<(), gray_discovery::Error>(())
//! ```

use std::collections::HashMap;

use tower::discover::Change;

use crate::{Instance, InstanceId};

/// The instances of one service, by id.
#[derive(Debug, Clone, Default)]
pub struct InstanceSet {
    instances: HashMap<InstanceId, Instance>,
}

impl InstanceSet {
    /// An empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of instances.
    #[must_use]
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// `true` when there is no instance.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// The instance with id `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.instances.get(id)
    }

    /// All instances, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Instance> {
        self.instances.values()
    }

    /// Adds or replaces an instance; returns the `Insert` to emit, or `None` when the set
    /// already held an equal instance.
    pub fn insert(&mut self, instance: Instance) -> Option<Change<InstanceId, Instance>> {
        match self.instances.get_mut(instance.id()) {
            Some(current) if *current == instance => None,
            Some(current) => {
                *current = instance.clone();
                Some(Change::Insert(instance.id().clone(), instance))
            }
            None => {
                self.instances
                    .insert(instance.id().clone(), instance.clone());
                Some(Change::Insert(instance.id().clone(), instance))
            }
        }
    }

    /// Removes an instance; returns the `Remove` to emit, or `None` when it was not there.
    pub fn remove(&mut self, id: &str) -> Option<Change<InstanceId, Instance>> {
        self.instances
            .remove_entry(id)
            .map(|(id, _)| Change::Remove(id))
    }

    /// Replaces the whole set; returns the difference: first a `Remove` for every instance
    /// that is gone, then an `Insert` for every instance that is new or changed, each group
    /// sorted by id. When `instances` repeats an id, the last one wins.
    pub fn replace(
        &mut self,
        instances: impl IntoIterator<Item = Instance>,
    ) -> Vec<Change<InstanceId, Instance>> {
        let mut next: HashMap<InstanceId, Instance> =
            instances.into_iter().map(|i| (i.id().clone(), i)).collect();
        let mut removed: Vec<InstanceId> = self
            .instances
            .keys()
            .filter(|id| !next.contains_key(*id))
            .cloned()
            .collect();
        let mut inserted: Vec<(InstanceId, Instance)> = next
            .iter_mut()
            .filter(|(id, instance)| self.instances.get(*id) != Some(&**instance))
            .map(|(id, instance)| (id.clone(), instance.clone()))
            .collect();
        removed.sort_unstable();
        inserted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.instances = next;
        removed
            .into_iter()
            .map(Change::Remove)
            .chain(inserted.into_iter().map(|(id, i)| Change::Insert(id, i)))
            .collect()
    }
}

impl FromIterator<Instance> for InstanceSet {
    fn from_iter<I: IntoIterator<Item = Instance>>(iter: I) -> Self {
        InstanceSet {
            instances: iter.into_iter().map(|i| (i.id().clone(), i)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use gray_core::Labels;

    use super::*;

    fn inst(id: &str, port: u16, gray: bool) -> Instance {
        let labels = if gray {
            Labels::from_iter([("gray", "true")])
        } else {
            Labels::new()
        };
        Instance::new(
            id.parse().unwrap(),
            format!("127.0.0.1:{port}").parse().unwrap(),
            labels,
        )
    }

    fn keys(changes: &[Change<InstanceId, Instance>]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                Change::Insert(k, _) => format!("+{k}"),
                Change::Remove(k) => format!("-{k}"),
            })
            .collect()
    }

    #[test]
    fn insert_remove() {
        let mut set = InstanceSet::new();
        assert!(set.insert(inst("a", 1, false)).is_some());
        assert!(set.insert(inst("a", 1, false)).is_none(), "unchanged");
        assert!(set.insert(inst("a", 1, true)).is_some(), "labels changed");
        assert!(set.insert(inst("a", 2, true)).is_some(), "address changed");
        assert_eq!(set.get("a"), Some(&inst("a", 2, true)));
        assert!(matches!(set.remove("a"), Some(Change::Remove(k)) if k.as_str() == "a"));
        assert!(set.remove("a").is_none());
        assert!(set.is_empty());
    }

    #[test]
    fn replace_emits_the_difference() {
        let mut set: InstanceSet = [
            inst("a", 1, false),
            inst("b", 2, false),
            inst("c", 3, false),
        ]
        .into_iter()
        .collect();
        let changes = set.replace([
            inst("d", 4, false),
            inst("b", 2, true),
            inst("c", 3, false),
            inst("e", 5, false),
            inst("e", 6, false),
        ]);
        assert_eq!(keys(&changes), ["-a", "+b", "+d", "+e"]);
        assert_eq!(set.get("e"), Some(&inst("e", 6, false)), "last one wins");
        assert_eq!(set.len(), 4);
        assert!(set.replace(set.clone().iter().cloned()).is_empty());
    }
}
