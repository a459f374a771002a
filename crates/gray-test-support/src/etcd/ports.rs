//! Loopback ports for etcd, which binds them itself: a test cannot bind port 0 and keep the
//! listener, so a port is reserved in a way no other process of the machine takes it.
//!
//! "Bind port 0, read the port, close the listener, hand the number on" races: between the
//! close and the child's bind, any process (another test binary run in parallel by
//! nextest, a client connecting out) can be handed the same port by the kernel, and etcd
//! then fails to start or, worse, a test talks to another test's etcd. Instead:
//!
//! - ports are taken **outside the kernel's ephemeral range**
//!   (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 by default): the kernel never
//!   hands them out for `bind(0)` or an outgoing connection, so only a process that asks
//!   for the number explicitly can get one;
//! - among the processes that do, test processes of this workspace, a port is claimed with
//!   an exclusive, non-blocking `flock` on `$TMPDIR/gray-test-ports/<port>.lock`, held as
//!   long as the [`Reserved`] value lives. The kernel releases it when the process ends,
//!   however it ends, so a crashed test leaves no stale claim;
//! - a claimed port is bound once to check that nothing else (an unrelated server, an etcd
//!   left running by a killed test) listens on it.
//!
//! Retrying etcd on another port when it fails to bind would also work for a first start,
//! but not for [`Etcd::restart`](super::Etcd::restart), which must come back on the same
//! ports (its peer URL is in its data dir): a reserved port stays reserved across restarts.

use std::{fs::File, net::TcpListener, path::PathBuf};

use rustix::fs::{FlockOperation, flock};

/// Where ports are reserved: below the ephemeral range, from here.
const LOWEST: u16 = 20_000;

/// A loopback port reserved for this process until dropped; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Reserved {
    port: u16,
    /// Holds the lock; closing it releases the port.
    _lock: File,
}

impl Reserved {
    /// Reserves a free loopback port outside the ephemeral range; panics, saying why, when
    /// every candidate is taken.
    pub(crate) fn take() -> Reserved {
        let dir = std::env::temp_dir().join("gray-test-ports");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create the port lock directory {}: {e}", dir.display()));
        let candidates = candidates();
        // Start somewhere else in every process, so that parallel processes rarely contend.
        let start = start_offset() % candidates.len();
        for port in candidates[start..].iter().chain(&candidates[..start]) {
            if let Some(reserved) = Reserved::claim(&dir, *port) {
                return reserved;
            }
        }
        panic!(
            "no free loopback port for etcd among {} candidates outside the ephemeral range \
             (locks in {})",
            candidates.len(),
            dir.display()
        );
    }

    /// The port, if it is free and not claimed by another process.
    fn claim(dir: &std::path::Path, port: u16) -> Option<Reserved> {
        let path: PathBuf = dir.join(format!("{port}.lock"));
        // Never removed: removing a lock file another process may be opening races.
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ok()?;
        flock(&lock, FlockOperation::NonBlockingLockExclusive).ok()?;
        // Claimed; now check that nothing outside the scheme listens there.
        drop(TcpListener::bind(("127.0.0.1", port)).ok()?);
        Some(Reserved { port, _lock: lock })
    }

    /// The port number.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// The kernel's ephemeral range, `(first, last)`; Linux's default when it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut numbers = text.split_whitespace().map(str::parse::<u16>);
            Some((numbers.next()?.ok()?, numbers.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999))
}

/// Every port at or above [`LOWEST`] that is not in the ephemeral range.
fn candidates() -> Vec<u16> {
    let (first, last) = ephemeral_range();
    let ports: Vec<u16> = (LOWEST..=u16::MAX)
        .filter(|p| *p < first || *p > last)
        .collect();
    assert!(
        !ports.is_empty(),
        "the ephemeral range {first}-{last} leaves no port above {LOWEST} for etcd"
    );
    ports
}

/// A different starting point for each process and each call.
fn start_offset() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    (std::process::id() as usize)
        .wrapping_mul(7919)
        .wrapping_add(nanos)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_outside_the_ephemeral_range_distinct_and_free() {
        let (first, last) = ephemeral_range();
        let a = Reserved::take();
        let b = Reserved::take();
        assert_ne!(a.port(), b.port());
        for port in [a.port(), b.port()] {
            assert!(port >= LOWEST && (port < first || port > last), "{port}");
            // Free: the lock is ours, and nothing listens.
            TcpListener::bind(("127.0.0.1", port)).expect("the reserved port is free");
        }
        // Claimed: another claim of the same port fails while `a` lives, even from another
        // open file (as another process would open it).
        let dir = std::env::temp_dir().join("gray-test-ports");
        assert!(Reserved::claim(&dir, a.port()).is_none());
        let port = a.port();
        drop(a);
        let again = Reserved::claim(&dir, port);
        assert!(again.is_some(), "released when dropped");
    }
}
