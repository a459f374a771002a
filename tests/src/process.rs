//! Instances as child processes (the `gray-test-upstream` binary of this crate), for the
//! tests that SIGKILL an instance and start it again on the same address.
//!
//! The port is held by the test for the whole run: a socket bound with `SO_REUSEPORT`
//! and never listening. While the instance is down, connections to the port are refused
//! (nothing listens), and no other process can be handed the port; the instance binds it
//! again with `SO_REUSEPORT` when it starts.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
};

use gray_test_support::WAIT;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpSocket,
    process::{Child, Command},
};

/// What an instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1: its name as the body of every answer; `POST` bodies logged.
    Http,
    /// gRPC: `chain.Hop` and `grpc.health.v1.Health`.
    Grpc,
}

/// An instance running as a child process, or down; killed when dropped.
#[derive(Debug)]
pub struct Instance {
    name: String,
    bin: PathBuf,
    protocol: Protocol,
    log: Option<PathBuf>,
    addr: SocketAddr,
    _reserved: TcpSocket,
    child: Option<Child>,
}

impl Instance {
    /// Starts `bin` (`env!("CARGO_BIN_EXE_gray-test-upstream")`) as the instance `name` on
    /// a free loopback port, appending the `POST` bodies it receives to `log` if given; it
    /// returns once the instance listens.
    pub async fn start(bin: &str, name: &str, protocol: Protocol, log: Option<&Path>) -> Instance {
        let reserved = TcpSocket::new_v4().expect("a socket");
        reserved.set_reuseport(true).expect("SO_REUSEPORT");
        reserved
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind a loopback port");
        let addr = reserved.local_addr().expect("local address");
        let mut instance = Instance {
            name: name.to_owned(),
            bin: bin.into(),
            protocol,
            log: log.map(Path::to_path_buf),
            addr,
            _reserved: reserved,
            child: None,
        };
        instance.restart().await;
        instance
    }

    /// Its address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name (the body of its answers).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Kills it with SIGKILL, and waits for it to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.start_kill().expect("SIGKILL");
            tokio::time::timeout(WAIT, child.wait())
                .await
                .expect("the killed instance exits")
                .expect("wait for it");
        }
    }

    /// Starts it (again) on its address; returns once it listens.
    pub async fn restart(&mut self) {
        let mut command = Command::new(&self.bin);
        command
            .args([
                "--port",
                &self.addr.port().to_string(),
                "--name",
                &self.name,
            ])
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        if self.protocol == Protocol::Grpc {
            command.arg("--grpc");
        }
        if let Some(log) = &self.log {
            command.arg("--log").arg(log);
        }
        let mut child = command.spawn().expect("start gray-test-upstream");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        tokio::time::timeout(WAIT, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("the instance says it listens")
            .expect("read its stdout");
        assert_eq!(line.trim(), "listening", "{}: {line:?}", self.name);
        self.child = Some(child);
    }
}
