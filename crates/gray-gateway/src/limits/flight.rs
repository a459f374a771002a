//! Caps on the requests in flight to upstreams: in total, and per client IP.
//!
//! A request counts from the moment it is routed until its response head is on its way to
//! the client (or it is dropped). Over the total cap it gets `503` at once, over its
//! client's cap `429`: no queue, nothing held. The per-client counters are a fixed table
//! of atomic counters indexed by a keyed hash of the client's IP (the edge's resolved
//! client, so clients behind a trusted proxy count apart): no lock, no allocation per
//! request. Two clients whose IPs share a counter share its cap; the hash key is random
//! per process, so which clients do cannot be chosen from outside.

use std::{
    hash::{BuildHasher, RandomState},
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicUsize, Ordering},
    },
};

/// Per-client counters: a power of two, enough that few clients share one.
const SLOTS: usize = 4096;

/// The requests in flight, and their caps.
#[derive(Debug)]
pub(crate) struct InFlight {
    total: AtomicUsize,
    max_total: usize,
    per_client: Box<[AtomicU32]>,
    max_per_client: u32,
    hasher: RandomState,
}

/// Which cap refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `max_in_flight`: 503.
    Total,
    /// `max_in_flight_per_client`: 429.
    Client,
}

/// One request in flight; leaves when dropped.
#[derive(Debug)]
pub(crate) struct Flight {
    owner: Arc<InFlight>,
    slot: Option<usize>,
}

// === impl InFlight ===

impl InFlight {
    /// At most `max_total` requests in flight (0: no cap), `max_per_client` per client IP
    /// (0: no cap).
    pub(crate) fn new(max_total: usize, max_per_client: u32) -> Self {
        let slots = if max_per_client > 0 { SLOTS } else { 0 };
        InFlight {
            total: AtomicUsize::new(0),
            max_total,
            per_client: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            max_per_client,
            hasher: RandomState::new(),
        }
    }

    /// Whether a client's IP is needed (a per-client cap is set).
    pub(crate) fn per_client(&self) -> bool {
        self.max_per_client > 0
    }

    /// Lets a request of `client` in, or says which cap refuses it.
    pub(crate) fn enter(self: &Arc<Self>, client: Option<IpAddr>) -> Result<Flight, Refused> {
        let total = self.total.fetch_add(1, Ordering::Relaxed);
        if self.max_total > 0 && total >= self.max_total {
            self.total.fetch_sub(1, Ordering::Relaxed);
            return Err(Refused::Total);
        }
        let mut flight = Flight {
            owner: self.clone(),
            slot: None,
        };
        if let (true, Some(ip)) = (self.per_client(), client) {
            let slot = (self.hasher.hash_one(ip) as usize) & (SLOTS - 1);
            let n = self.per_client[slot].fetch_add(1, Ordering::Relaxed);
            flight.slot = Some(slot);
            if n >= self.max_per_client {
                // Dropping the flight takes both counts back.
                return Err(Refused::Client);
            }
        }
        Ok(flight)
    }
}

impl Flight {
    /// Whether other requests are in flight beside this one: what a request's answer
    /// could be batched with (`crate::proxy`). One relaxed load.
    pub(crate) fn others_in_flight(&self) -> bool {
        self.owner.total.load(Ordering::Relaxed) > 1
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.owner.total.fetch_sub(1, Ordering::Relaxed);
        if let Some(slot) = self.slot {
            self.owner.per_client[slot].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three client IPs that count apart (the hash key is random).
    fn apart(caps: &InFlight) -> [IpAddr; 3] {
        let mut found: Vec<(IpAddr, usize)> = Vec::new();
        for i in 1..=255u8 {
            let ip = IpAddr::from([192, 0, 2, i]);
            let slot = (caps.hasher.hash_one(ip) as usize) & (SLOTS - 1);
            if found.iter().all(|(_, s)| *s != slot) {
                found.push((ip, slot));
            }
            if let [a, b, c] = found[..] {
                return [a.0, b.0, c.0];
            }
        }
        unreachable!("255 addresses cover three of 4096 slots")
    }

    #[test]
    fn caps_count_in_total_and_per_client_and_leave_on_drop() {
        let caps = Arc::new(InFlight::new(3, 2));
        let [a, b, c] = apart(&caps);
        let a1 = caps.enter(Some(a)).unwrap();
        let _a2 = caps.enter(Some(a)).unwrap();
        assert_eq!(caps.enter(Some(a)).unwrap_err(), Refused::Client);
        let _b1 = caps.enter(Some(b)).unwrap();
        assert_eq!(caps.enter(Some(c)).unwrap_err(), Refused::Total);
        drop(a1);
        let _c1 = caps.enter(Some(c)).unwrap();
        assert_eq!(caps.total.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn zero_is_no_cap() {
        let caps = Arc::new(InFlight::new(0, 0));
        let flights: Vec<_> = (0..10_000).map(|_| caps.enter(None).unwrap()).collect();
        assert_eq!(flights.len(), 10_000);
    }
}
