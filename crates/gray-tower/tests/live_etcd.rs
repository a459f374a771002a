//! Live rules from a real etcd server (the `etcd` binary, Debian package `etcd-server`),
//! started by the test on free loopback ports with a temporary data dir.

use std::{net::TcpListener, path::PathBuf, process::Stdio, time::Duration};

use etcd_client::Client;
use gray_core::rules::Format;
use gray_tower::edge::{EtcdSource, Revision, SourceError, Status};
use tokio::{process::Child, sync::watch};

const KEY: &str = "/gray/rules";

struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Etcd {
    async fn start() -> Self {
        let data_dir = std::env::temp_dir().join(format!(
            "gray-tower-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        let client_port = free_port();
        let peer_port = (0..100)
            .map(|_| free_port())
            .find(|p| *p != client_port)
            .expect("two distinct free ports");
        let mut etcd = Etcd {
            child: None,
            client_port,
            peer_port,
            data_dir,
        };
        etcd.spawn().await;
        etcd
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    async fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = tokio::process::Command::new("etcd")
            .args(["--name", "gray-test"])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("gray-test={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `etcd` ({e}): this test needs a real etcd server on PATH \
                     (Debian: apt-get install etcd-server; scripts/test installs it)"
                )
            });
        self.child = Some(child);
        // Bounded wait until it answers.
        for _ in 0..200 {
            if let Ok(mut c) = Client::connect([self.endpoint()], None).await {
                if c.get(KEY, None).await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd did not answer on {} within 10 s", self.endpoint());
    }

    async fn client(&self) -> Client {
        Client::connect([self.endpoint()], None)
            .await
            .expect("connect to the test etcd")
    }

    async fn put(&self, value: &str) -> i64 {
        let resp = self
            .client()
            .await
            .put(KEY, value, None)
            .await
            .expect("put");
        resp.header().expect("header").revision()
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("kill etcd");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

async fn wait_for(
    rx: &mut watch::Receiver<Status>,
    what: &str,
    ok: impl Fn(&Status) -> bool,
) -> Status {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let status = rx.borrow_and_update().clone();
            if ok(&status) {
                return status;
            }
            if rx.changed().await.is_err() {
                panic!("status channel closed while waiting for {what}");
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| panic!("timed out waiting for {what}: {:?}", rx.borrow()))
}

fn rules(name: &str) -> String {
    format!(r#"{{"rules":[{{"name":"{name}","lane":"gray"}}]}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_key_reloads_rejects_and_survives_a_restart() {
    let mut etcd = Etcd::start().await;
    let source = EtcdSource::new([etcd.endpoint()], KEY)
        .with_format(Format::Json)
        .with_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .with_timeout(Duration::from_secs(2));

    // No key yet: the first load says so.
    assert!(matches!(
        source.load().await,
        Err(SourceError::MissingKey(_))
    ));

    let rev1 = etcd.put(&rules("one")).await;
    let live = source.live().await.expect("first load");
    assert_eq!(
        live.status().revision,
        Revision::Etcd { mod_revision: rev1 }
    );
    let mut rx = live.subscribe();
    let _watch = source.watch(live.clone());
    let name =
        |live: &gray_tower::LiveRules| live.load().rules().rules()[0].name().map(str::to_owned);

    // A put is picked up.
    let rev2 = etcd.put(&rules("two")).await;
    let s = wait_for(&mut rx, "version two", |s| s.generation == 2).await;
    assert_eq!(s.revision, Revision::Etcd { mod_revision: rev2 });
    assert_eq!(name(&live).as_deref(), Some("two"));

    // An invalid put is rejected; two stays.
    etcd.put(r#"{"rules":[{"name":"bad","lane":"no spaces allowed"}]}"#)
        .await;
    let s = wait_for(&mut rx, "the rejection", |s| s.rejected == 1).await;
    assert_eq!(s.generation, 2);
    let err = s.last_error.expect("error");
    assert!(
        err.starts_with(&format!(
            "etcd key {KEY}:1:50: rules[0] (\"bad\"), field `lane`"
        )),
        "{err}"
    );
    assert_eq!(name(&live).as_deref(), Some("two"));

    // A delete changes nothing.
    etcd.client().await.delete(KEY, None).await.expect("delete");
    let s = wait_for(&mut rx, "the delete warning", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("was deleted"))
    })
    .await;
    assert_eq!(s.generation, 2);

    // etcd goes away and comes back (same data, same ports): the watch reconnects and reads
    // the key again, picking up a version written while it was reconnecting.
    etcd.kill().await;
    wait_for(&mut rx, "the connection loss", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("etcd failed"))
    })
    .await;
    etcd.spawn().await;
    let rev3 = etcd.put(&rules("three")).await;
    let s = wait_for(&mut rx, "version three", |s| s.generation == 3).await;
    assert_eq!(s.revision, Revision::Etcd { mod_revision: rev3 });
    assert_eq!(name(&live).as_deref(), Some("three"));
    assert_eq!(s.rejected, 1);
}
