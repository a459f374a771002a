//! The gateway binary as a process: started on a directory's `gateway.toml`, stopped
//! gracefully or killed.

use std::{net::SocketAddr, process::Stdio};

use gray_test_support::{TempDir, WAIT, child::read_stdout_until};
use tokio::process::{Child, Command};

use super::Addrs;

/// A gateway process.
pub(crate) struct Process {
    pub(crate) child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
}

impl Addrs for Process {
    fn proxy(&self) -> SocketAddr {
        self.proxy
    }
    fn admin(&self) -> SocketAddr {
        self.admin
    }
}

impl Process {
    /// Starts the binary on `dir`'s `gateway.toml`; returns once it serves.
    pub(crate) async fn start(dir: &TempDir) -> Process {
        Self::start_with(dir, &[]).await
    }

    /// [`Process::start`], with environment variables `env` too.
    pub(crate) async fn start_with(dir: &TempDir, env: &[(&str, &std::path::Path)]) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
            .arg("--config")
            .arg(dir.path().join("gateway.toml"))
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway binary starts");
        let mut proxy = None;
        let (proxy, admin) = read_stdout_until(&mut child, |line| {
            if let Some(addr) = line.strip_prefix("gateway listening on http://") {
                proxy = Some(addr.parse().unwrap());
            }
            let admin = line
                .strip_prefix("admin on http://")?
                .split_whitespace()
                .next()?;
            Some((
                proxy.expect("the proxy's address first"),
                admin.parse().unwrap(),
            ))
        })
        .await;
        Process {
            child,
            proxy,
            admin,
        }
    }

    /// SIGTERM, and waits until it exits: a graceful stop.
    pub(crate) async fn terminate(mut self) {
        let pid = self.child.id().expect("the gateway runs").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let exit = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the gateway exits in time")
            .unwrap();
        assert!(exit.success(), "{exit}");
    }

    /// Starts the binary on `dir`'s `gateway.toml` and expects it to refuse: its exit
    /// status and what it wrote to stderr.
    pub(crate) async fn refused(dir: &TempDir) -> (std::process::ExitStatus, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_gray-gateway"))
            .arg("--config")
            .arg(dir.path().join("gateway.toml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(WAIT, out)
            .await
            .expect("the gateway exits in time")
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// SIGKILL: no lease revoked, no key deleted.
    pub(crate) async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}
