//! A real etcd server on free loopback ports (feature `etcd`) with a temporary data dir, killed at the end,
//! and a TCP proxy whose connections a test can cut to break a client's connection to etcd.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use etcd_client::{Client, ConnectOptions};
use tokio::{
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    task::AbortHandle,
};

use crate::{TempDir, WAIT, free_port};

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

/// One etcd member on 127.0.0.1 with its own data dir, killed when dropped.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    dir: TempDir,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts a member on free loopback ports and waits until it answers.
    pub async fn start() -> Etcd {
        let mut etcd = Etcd {
            child: None,
            dir: TempDir::new("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        etcd.spawn().await;
        etcd
    }

    /// Its client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Its client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    async fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.endpoint();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open the etcd log file");
        let mut command = Command::new(etcd_binary());
        command
            .arg("--name=gray-test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=gray-test={peer}"))
            .arg("--initial-cluster-state=new")
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log)
            .kill_on_drop(true);
        if cfg!(target_arch = "aarch64") {
            command.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd ({}): {e}", etcd_binary().display()));
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd exited with {status} while starting; its log:\n{}",
                    self.log()
                );
            }
            if let Ok(Ok(mut client)) = tokio::time::timeout(
                Duration::from_secs(2),
                Client::connect([self.endpoint()], None),
            )
            .await
            {
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_secs(2), client.status()).await
                {
                    return;
                }
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "etcd did not answer within {WAIT:?}; its log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills etcd with SIGKILL and waits for it to exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts etcd again, on the same data dir and ports.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// A client with HTTP/2 keep-alives and short timeouts.
    pub async fn client(&self) -> Client {
        connect(&self.endpoint()).await
    }

    /// Puts `key` = `value`; returns the store revision of the put.
    pub async fn put(&self, key: &str, value: &str) -> i64 {
        let response = self
            .client()
            .await
            .put(key, value, None)
            .await
            .expect("etcd put");
        response.header().map_or(0, |h| h.revision())
    }

    /// Deletes `key`; returns the store revision of the deletion.
    pub async fn delete(&self, key: &str) -> i64 {
        let response = self
            .client()
            .await
            .delete(key, None)
            .await
            .expect("etcd delete");
        response.header().map_or(0, |h| h.revision())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// A client of `endpoint` with HTTP/2 keep-alives and a short connect timeout.
pub async fn connect(endpoint: &str) -> Client {
    let options = ConnectOptions::new()
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_connect_timeout(Duration::from_secs(1));
    tokio::time::timeout(WAIT, Client::connect([endpoint], Some(options)))
        .await
        .expect("connect to etcd in time")
        .expect("connect to etcd")
}

/// A loopback TCP proxy to `target` whose connections can be cut and restored.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    /// Starts proxying a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (cut, conns) = (cut.clone(), conns.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    conns.lock().unwrap().push(task.abort_handle());
                }
            })
            .abort_handle()
        };
        Proxy {
            addr,
            cut,
            conns,
            accept,
        }
    }

    /// Its URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every proxied connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}
