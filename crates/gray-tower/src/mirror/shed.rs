//! A switch that sheds copies under load.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// A switch that sheds copies: while it is on, a [`Copier`](super::Copier) given it
/// ([`Copier::with_shed`](super::Copier::with_shed)) declines every copy it would make, as
/// [`Declined::Busy`](super::Declined::Busy). The gray gateway turns it on while the
/// runtime serving the users is busy beyond its `mirror_max_busy`; a service can turn it
/// on from a load signal of its own. Cheap to clone (the clones are one switch); reading
/// it is one relaxed load.
///
/// ```
/// use gray_tower::{Lane, mirror::{Copier, Declined, Shed}};
/// use http::Request;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let shed = Shed::new();
/// let copier = Copier::new(Lane::new("gray")?).with_shed(shed.clone());
/// shed.set(true);
/// let declined = copier.offer(&mut Request::new(String::new())).unwrap_err();
/// assert_eq!(declined, Declined::Busy);
/// assert_eq!(copier.in_flight(), 0);
/// shed.set(false);
/// assert!(copier.offer(&mut Request::new(String::new())).is_ok());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Shed(Arc<AtomicBool>);

impl Shed {
    /// A switch, off.
    #[must_use]
    pub fn new() -> Self {
        Shed::default()
    }

    /// Sheds copies from now (`true`), or makes them again (`false`).
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether copies are shed now.
    #[must_use]
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
