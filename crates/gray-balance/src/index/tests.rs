//! The index under changes: lists, counts and positions stay consistent.

use std::{collections::HashMap, sync::Arc};

use gray_core::{Labels, Lane};
use gray_policy::{
    Policy,
    route::{Class, Counts, Subset},
};

use super::{Entry, Index, Standing};
use crate::meter::{Clock, Feedback, Id, Meter};

fn class(pairs: &[(&str, &str)]) -> Class {
    Policy::new().classify(&Labels::from_iter(pairs.iter().copied()))
}

fn add(index: &mut Index<u32, ()>, key: u32, pairs: &[(&str, &str)]) -> Id {
    let (tx, _) = tokio::sync::mpsc::unbounded_channel();
    let feedback = Arc::new(Feedback::new(
        tx,
        Clock::new(),
        None,
        0,
        crate::health::classify,
    ));
    index.insert(key, class(pairs), |id| Entry {
        key,
        service: (),
        labels: Labels::new(),
        meter: Meter::new(id, feedback),
    })
}

#[test]
fn lists_follow_state_changes() {
    let mut index: Index<u32, ()> = Index::new(false);
    let gray = Lane::new("gray").unwrap();
    let a = add(&mut index, 1, &[("gray", "true"), ("version", "2")]);
    let b = add(&mut index, 2, &[("gray", "true")]);
    let _c = add(&mut index, 3, &[]);
    index.check();
    let snap = index.snapshot();
    let lane = snap.resolve(Subset::Lane(&gray));
    assert_eq!(
        snap.counts(lane),
        Counts {
            present: 2,
            ready: 2
        }
    );
    assert!(index.measured(a));
    index.check();
    assert!(index.set_state(a, Standing::Unready));
    index.check();
    let snap = index.snapshot();
    assert_eq!(snap.ready_at(lane, 0).unwrap().entry.key, 2);
    assert_eq!(
        snap.counts(lane),
        Counts {
            present: 2,
            ready: 1
        }
    );
    assert!(index.set_state(b, Standing::Ejected));
    index.check();
    let after = index.snapshot();
    assert_eq!(
        after.counts(lane),
        Counts {
            present: 1,
            ready: 0
        }
    );
    // The earlier snapshot is untouched.
    assert_eq!(snap.counts(lane).ready, 1);
    assert!(index.set_state(b, Standing::Ready));
    assert!(!index.set_state(b, Standing::Ready));
    index.check();
    // Replacing a key frees the old generation.
    let b2 = add(&mut index, 2, &[]);
    assert_ne!(b2, b);
    assert!(index.state(b).is_none());
    index.check();
    assert!(index.remove(&1));
    index.check();
    assert_eq!(index.named_subsets(), 0);
    assert_eq!(index.snapshot().counts(lane), Counts::default());
    assert_eq!(index.len(), 2);
    assert!(!index.remove(&1));
}

#[test]
fn many_changes_keep_the_lists_consistent() {
    let mut index: Index<u32, ()> = Index::new(true);
    let mut rng = gray_core::rand::Rng::seeded(11);
    let labels: [&[(&str, &str)]; 4] = [
        &[],
        &[("gray", "true")],
        &[("lane", "blue"), ("versions", "1,2")],
        &[("version", "2")],
    ];
    let mut ids = HashMap::new();
    for _ in 0..2_000 {
        let key = rng.below(40) as u32;
        match rng.below(5) {
            0 | 1 => {
                let id = add(&mut index, key, labels[rng.index(4)]);
                ids.insert(key, id);
            }
            2 => {
                index.remove(&key);
                ids.remove(&key);
            }
            3 => {
                if let Some(&id) = ids.get(&key) {
                    let state =
                        [Standing::Ready, Standing::Unready, Standing::Ejected][rng.index(3)];
                    index.set_state(id, state);
                }
            }
            _ => {
                if let Some(&id) = ids.get(&key) {
                    index.measured(id);
                }
            }
        }
        index.check();
    }
    assert_eq!(index.len(), ids.len());
}
