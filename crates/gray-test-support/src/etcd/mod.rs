//! Real etcd servers on loopback ports reserved for them, each with a temporary data dir
//! and killed when dropped:
//!
//! - [`Etcd`]: one member: plain, with TLS client-certificate auth ([`Etcd::start_tls`]) or
//!   with a user and password ([`Etcd::start_auth`]); killed and restarted on the same
//!   data dir ([`Etcd::restart`]) or on an empty one ([`Etcd::restart_empty`], a cluster
//!   that lost its data), frozen with SIGSTOP ([`Etcd::freeze`]);
//! - [`Cluster`]: three (or n) members on loopback, each reachable on its own;
//! - [`Tls`]: a CA, a server certificate for 127.0.0.1 and a client certificate, made
//!   with `rcgen`;
//! - [`Proxy`]: a TCP proxy whose connections a test can cut and restore.
//!
//! Every wait is bounded by [`WAIT`]; a member that does not come up fails the
//! test with its log.
//!
//! etcd binds its ports itself, so they cannot be "bound at 0 and kept". They are taken
//! outside the kernel's ephemeral range (which `bind(0)` and outgoing connections draw
//! from), each claimed with an exclusive `flock` on `$TMPDIR/gray-test-ports/<port>.lock`
//! that every test process honours and the kernel releases when the process ends, and
//! checked free; the claim lasts as long as the member, restarts included.

mod cluster;
mod ports;
mod proxy;
mod tls;

use std::{net::SocketAddr, path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use etcd_client::{Client, ConnectOptions, GetOptions};
use tokio::process::{Child, Command};

use self::ports::Reserved;
pub use self::{cluster::Cluster, proxy::Proxy, tls::Tls};
use crate::{TempDir, WAIT};

fn etcd_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        return PathBuf::from(bin);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
            .map(|dir| dir.join("etcd"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "the etcd tests need an etcd server binary, and none was found on PATH, in /usr/bin \
             or /usr/local/bin (or in $ETCD_BIN). Install it: `apt-get install -y etcd-server` \
             (Debian/Ubuntu)."
        )
    })
}

/// Runs `fut`, failing the test with `what` when it takes longer than [`WAIT`].
async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {WAIT:?}"))
}

/// One etcd member on 127.0.0.1 with its own data dir, killed when dropped.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    dir: TempDir,
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The two ports, reserved for as long as this member may run on them.
    _ports: [Reserved; 2],
    /// `name=peer-url,…` of every member of its cluster.
    initial_cluster: String,
    /// `--initial-cluster-token`: with the members, it makes the cluster ID.
    token: String,
    tls: Option<Arc<Tls>>,
    auth: Option<(String, String)>,
}

impl Etcd {
    /// Starts a single-member cluster on reserved loopback ports and waits until it answers.
    pub async fn start() -> Etcd {
        let mut etcd = Etcd::member("gray-test", None);
        etcd.initial_cluster = format!("{}={}", etcd.name, etcd.peer_url());
        etcd.spawn();
        etcd.wait_ready().await;
        etcd
    }

    /// Starts a single member that serves clients over TLS only (`https://`) and requires
    /// a client certificate signed by its CA ([`Etcd::tls`]).
    pub async fn start_tls() -> Etcd {
        let mut etcd = Etcd::member("gray-test", Some(Arc::new(Tls::generate())));
        etcd.initial_cluster = format!("{}={}", etcd.name, etcd.peer_url());
        etcd.spawn();
        etcd.wait_ready().await;
        etcd
    }

    /// Starts a single member with authentication enabled: `user` (given the root role)
    /// with `password`. The helpers of this type ([`Etcd::client`], [`Etcd::put`]) log in
    /// as that user.
    pub async fn start_auth(user: &str, password: &str) -> Etcd {
        let mut etcd = Etcd::start().await;
        etcd.enable_auth(user, password).await;
        etcd
    }

    /// A member of a cluster not started yet.
    fn member(name: &str, tls: Option<Arc<Tls>>) -> Etcd {
        let ports = [Reserved::take(), Reserved::take()];
        Etcd {
            child: None,
            dir: TempDir::new("etcd"),
            name: name.to_owned(),
            client_port: ports[0].port(),
            peer_port: ports[1].port(),
            _ports: ports,
            initial_cluster: String::new(),
            token: "gray-test".to_owned(),
            tls,
            auth: None,
        }
    }

    async fn enable_auth(&mut self, user: &str, password: &str) {
        let mut client = self.client().await;
        bounded("add the root user", async {
            client
                .user_add("root", password, None)
                .await
                .expect("add the root user");
            client
                .user_grant_role("root", "root")
                .await
                .expect("grant the root role");
            if user != "root" {
                client
                    .user_add(user, password, None)
                    .await
                    .expect("add the user");
                client
                    .user_grant_role(user, "root")
                    .await
                    .expect("grant the root role to the user");
            }
            client.auth_enable().await.expect("enable auth");
        })
        .await;
        self.auth = Some((user.to_owned(), password.to_owned()));
    }

    /// Its client URL, `http://127.0.0.1:<port>` (`https://` for a TLS member).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// Its client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// The certificates of a member started with [`Etcd::start_tls`].
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_deref()
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = self.peer_url();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the etcd log file");
        let mut command = Command::new(etcd_binary());
        command
            .arg(format!("--name={}", self.name))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log)
            .kill_on_drop(true);
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cert-file={}", tls.server_cert_file().display()))
                .arg(format!("--key-file={}", tls.server_key_file().display()))
                .arg(format!("--trusted-ca-file={}", tls.ca_file().display()))
                .arg("--client-cert-auth");
        }
        if cfg!(target_arch = "aarch64") {
            command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({}): {e}", etcd_binary().display()));
        self.child = Some(child);
    }

    /// Waits until the member answers a linearizable read (so its cluster has a leader).
    async fn wait_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd {} exited with {status} while starting; its log:\n{}",
                    self.name,
                    self.log()
                );
            }
            let answered = tokio::time::timeout(Duration::from_secs(2), async {
                let mut client =
                    Client::connect([self.endpoint()], Some(self.connect_options())).await?;
                client
                    .get("gray-test-ready", Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await;
            if let Ok(Ok(_)) = answered {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "etcd {} did not answer within {WAIT:?} ({answered:?}); its log:\n{}",
                    self.name,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills etcd with SIGKILL and waits for it to exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = bounded("kill etcd", child.kill()).await;
        }
    }

    /// Starts etcd again, on the same data dir and ports.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn();
        self.wait_ready().await;
    }

    /// Starts a single-member etcd again on the same ports but on an EMPTY data dir: a
    /// cluster that lost its data (a member restored empty, a wrong data dir). It has the
    /// same cluster ID (derived from the member's name and URLs), its revisions start
    /// again from 1, and a user set up by [`Etcd::start_auth`] is set up again.
    pub async fn restart_empty(&mut self) {
        self.kill().await;
        let data = self.dir.path().join("data");
        std::fs::remove_dir_all(&data).unwrap_or_else(|e| panic!("remove {}: {e}", data.display()));
        let auth = self.auth.take();
        self.spawn();
        self.wait_ready().await;
        if let Some((user, password)) = auth {
            self.enable_auth(&user, &password).await;
        }
    }

    /// Replaces the cluster: a new single-member etcd on the same ports, with an EMPTY data
    /// dir and another cluster token, so it has a new cluster ID (what a client sees when
    /// the address it follows now leads to another cluster). Its revisions start again
    /// from 1; a user set up by [`Etcd::start_auth`] is set up again.
    pub async fn replace(&mut self) {
        self.token = format!("{}-replaced", self.token);
        self.restart_empty().await;
    }

    /// Stops the process with SIGSTOP: it keeps its connections open and answers nothing,
    /// as a frozen host would. It continues (SIGCONT) when the returned guard is dropped,
    /// also when the test fails.
    pub fn freeze(&self) -> Frozen {
        let pid = self.pid().expect("freeze a running etcd");
        signal("STOP", pid);
        Frozen { pid }
    }

    /// Client options for this member: HTTP/2 keep-alives, a short connect timeout, and
    /// its TLS or credentials when it has them.
    pub fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new()
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(5));
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.client_options());
        }
        if let Some((user, password)) = &self.auth {
            options = options.with_user(user.clone(), password.clone());
        }
        options
    }

    /// A client of this member alone.
    pub async fn client(&self) -> Client {
        bounded(
            "connect to etcd",
            Client::connect([self.endpoint()], Some(self.connect_options())),
        )
        .await
        .expect("connect to etcd")
    }

    /// Runs `op` on a fresh client of this member until it succeeds (a cluster may be
    /// electing a leader), each attempt bounded; fails the test after [`WAIT`].
    async fn retry<T, F>(&self, what: &str, mut op: impl FnMut(Client) -> F) -> T
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let attempt = tokio::time::timeout(Duration::from_secs(5), async {
                let client =
                    Client::connect([self.endpoint()], Some(self.connect_options())).await?;
                op(client).await
            })
            .await;
            let error = match attempt {
                Ok(Ok(t)) => return t,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within 5 s".to_owned(),
            };
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd {what} through {} failed for {WAIT:?}: {error}",
                self.endpoint()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Puts `key` = `value` through this member; returns the store revision of the put.
    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> i64 {
        let value = value.into();
        self.retry("put", |mut client| {
            let value = value.clone();
            async move { client.put(key, value, None).await }
        })
        .await
        .header()
        .map_or(0, |h| h.revision())
    }

    /// Deletes `key` through this member; returns the store revision of the deletion.
    pub async fn delete(&self, key: &str) -> i64 {
        self.retry("delete", |mut client| async move {
            client.delete(key, None).await
        })
        .await
        .header()
        .map_or(0, |h| h.revision())
    }

    /// Compacts the store up to `revision` (physically: the revisions are gone).
    pub async fn compact(&self, revision: i64) {
        self.retry("compact", |mut client| async move {
            client
                .compact(
                    revision,
                    Some(etcd_client::CompactionOptions::new().with_physical()),
                )
                .await
        })
        .await;
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// Sends `SIGname` to `pid` with `kill(1)`.
fn signal(name: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("run kill -{name} {pid}: {e}"));
    assert!(status.success(), "kill -{name} {pid}: {status}");
}

/// A member stopped by [`Etcd::freeze`]; it continues when this is dropped.
#[derive(Debug)]
#[must_use = "the member continues as soon as the guard is dropped"]
pub struct Frozen {
    pid: u32,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // Not `signal`: a panic in a drop during a panic would abort, and a member that
        // was killed meanwhile cannot be continued anyway.
        let _ = std::process::Command::new("kill")
            .arg("-CONT")
            .arg(self.pid.to_string())
            .status();
    }
}

/// A client of `endpoint` with HTTP/2 keep-alives and a short connect timeout.
pub async fn connect(endpoint: &str) -> Client {
    let options = ConnectOptions::new()
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_connect_timeout(Duration::from_secs(1));
    bounded(
        "connect to etcd",
        Client::connect([endpoint], Some(options)),
    )
    .await
    .expect("connect to etcd")
}
