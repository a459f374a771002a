//! Test support shared by every crate of the gray workspace (dev-dependency only, not
//! published):
//!
//! - [`alloc`]: a global allocator that counts the allocations of each thread, to prove
//!   that a request path allocates nothing;
//! - `etcd` (feature `etcd`): real etcd servers on loopback ports reserved for them
//!   (outside the ephemeral range, claimed with a lock no parallel test process takes) with
//!   temporary data dirs, killed at the end: one member (plain, with TLS client-certificate auth, or
//!   with a user and password), restarted on the same or an EMPTY data dir, frozen with
//!   SIGSTOP; a 3-member cluster; certificates made with `rcgen`; a TCP proxy whose
//!   connections a test can cut;
//! - `net` (feature `net`, which `etcd` includes): raw TCP servers on loopback, among them
//!   an HTTP/1.1 instance that answers before it has read the request body, and a port
//!   that refuses connections for as long as the test holds it;
//! - `tls` (feature `tls`, which `etcd` includes): a CA and the server and client
//!   certificates it issues (`rcgen`), with a chosen validity, written to files;
//! - `https` (feature `https`): HTTP upstreams that speak HTTP/1.1 and HTTP/2, in
//!   cleartext or over TLS (optionally requiring a client certificate);
//! - [`configmap`] (Unix): a directory mounted the way Kubernetes mounts a ConfigMap, whose
//!   updates swap a `..data` symlink;
//! - `child` (feature `process`): a child process's stdout read up to the line a test
//!   waits for (where it listens), the rest drained;
//! - `browser` (feature `browser`): Debian's headless Chromium driven over WebDriver
//!   (chromedriver), for the gateway's admin page;
//! - [`TempDir`] and [`WAIT`], the bound of every wait in the real-network tests.

pub mod alloc;
#[cfg(feature = "browser")]
pub mod browser;
#[cfg(feature = "process")]
pub mod child;
#[cfg(unix)]
pub mod configmap;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "https")]
pub mod https;
#[cfg(feature = "logs")]
pub mod logs;
#[cfg(feature = "net")]
pub mod net;
#[cfg(feature = "tls")]
pub mod tls;

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

/// How long any single wait in the real-network tests may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty directory under the system's temporary directory, named after `tag`.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "gray-test-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
