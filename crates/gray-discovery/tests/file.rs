//! The watched-file source against real temporary files.

mod support;

use std::{
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use gray_discovery::{Error, WatchedFile};
use support::{TempDir, WAIT, assert_quiet, next, take};

/// Writes `content` to `path` the way editors and config tools do: a new file renamed over
/// the old one.
fn write(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const YAML: &str = r#"services:
  orders:
    - id: a
      address: 127.0.0.1:1
    - id: b
      address: 127.0.0.1:2
      labels: { gray: true }
  payments:
    - id: p
      address: 127.0.0.1:9
"#;

#[tokio::test]
async fn an_edit_is_applied_as_a_diff() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.yaml");
    write(&path, YAML);
    let file = WatchedFile::open(&path).await.unwrap();
    assert_eq!(file.services(), ["orders", "payments"]);
    let mut orders = file.service("orders").unwrap();
    let mut payments = file.service("payments").unwrap();
    assert_eq!(
        take(&mut orders, 2).await,
        [
            "+a http://127.0.0.1:1 {}",
            "+b http://127.0.0.1:2 {gray=true}"
        ]
    );
    assert_eq!(next(&mut payments).await, "+p http://127.0.0.1:9 {}");

    // a gets labels, b goes, c comes; payments is untouched.
    write(
        &path,
        r#"services:
  orders:
    - id: a
      address: 127.0.0.1:1
      labels: { version: "2.0" }
    - id: c
      address: 127.0.0.1:3
  payments:
    - id: p
      address: 127.0.0.1:9
"#,
    );
    assert_eq!(
        take(&mut orders, 3).await,
        [
            "-b",
            "+a http://127.0.0.1:1 {version=2.0}",
            "+c http://127.0.0.1:3 {}"
        ]
    );
    assert_quiet(&mut payments, Duration::from_millis(600)).await;

    // An in-place edit of the same size and within the same second is seen too.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.write_all(YAML.replace("127.0.0.1:9", "127.0.0.1:8").as_bytes())
        .unwrap();
    drop(f);
    assert_eq!(next(&mut payments).await, "+p http://127.0.0.1:8 {}");
}

/// Collects what `tracing` prints.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_invalid_edit_keeps_the_last_good_set_and_names_file_line_and_field() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // A current-thread runtime: the poller task runs on this thread, under this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = TempDir::new("file");
    let path = dir.path().join("instances.toml");
    write(
        &path,
        "[[services.orders]]\nid = \"a\"\naddress = \"127.0.0.1:1\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    let file = WatchedFile::open(&path).await.unwrap();
    let mut orders = file.service("orders").unwrap();
    assert_eq!(take(&mut orders, 2).await.len(), 2);

    // Line 7: b's address is not an address. The whole edit is rejected, including the
    // removal of a that it also made.
    write(
        &path,
        "[[services.orders]]\nid = \"c\"\naddress = \"127.0.0.1:3\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:two\"\n",
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while !logs.text().contains("instance file rejected") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no error logged: {}",
            logs.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = logs.text();
    let line = log
        .lines()
        .find(|l| l.contains("instance file rejected"))
        .unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(line.contains("line=7"), "{line}");
    assert!(
        line.contains(r#"field="services.orders[1].address""#),
        "{line}"
    );
    assert!(line.contains("invalid address `127.0.0.1:two`"), "{line}");
    assert_quiet(&mut orders, Duration::from_millis(600)).await;
    let ids: Vec<String> = file
        .instances("orders")
        .iter()
        .map(|i| i.id().to_string())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    // Reported once, not at every poll.
    assert_eq!(log.matches("instance file rejected").count(), 1, "{log}");

    // The next good edit is diffed against the last good set.
    write(
        &path,
        "[[services.orders]]\nid = \"c\"\naddress = \"127.0.0.1:3\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    assert_eq!(
        take(&mut orders, 2).await,
        ["-a", "+c http://127.0.0.1:3 {}"]
    );

    // A file that disappears keeps the set too.
    std::fs::remove_file(&path).unwrap();
    assert_quiet(&mut orders, Duration::from_millis(600)).await;
    write(
        &path,
        "[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    assert_eq!(next(&mut orders).await, "-c");
}

#[tokio::test]
async fn json_files_and_a_service_that_appears_later() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.json");
    write(&path, r#"{"services": {}}"#);
    let file = WatchedFile::open(&path).await.unwrap();
    let mut orders = file.service("orders").unwrap();
    assert_quiet(&mut orders, Duration::from_millis(400)).await;
    write(
        &path,
        r#"{"services": {"orders": [{"address": "127.0.0.1:1", "labels": {"version": 2}}]}}"#,
    );
    // Without an id, the address is the id.
    assert_eq!(
        next(&mut orders).await,
        "+127.0.0.1:1 http://127.0.0.1:1 {version=2}"
    );
}

#[tokio::test]
async fn opening_a_bad_file_says_where_and_why() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.json");
    write(
        &path,
        "{\"services\": {\"orders\": [\n  {\"id\": \"a\", \"address\": \"127.0.0.1:1\", \"lables\": {}}\n]}}",
    );
    let err = WatchedFile::open(&path).await.unwrap_err();
    let Error::Parse(parse) = &err else {
        panic!("{err}")
    };
    assert_eq!(parse.line(), Some(2));
    assert_eq!(parse.field(), Some("services.orders[0].lables"));
    assert!(
        err.to_string()
            .starts_with(&format!("{}:2:", path.display())),
        "{err}"
    );
    assert!(err.to_string().contains("unknown field `lables`"), "{err}");

    let missing = dir.path().join("missing.yaml");
    let err = WatchedFile::open(&missing).await.unwrap_err();
    assert!(matches!(err, Error::Read { .. }), "{err}");
    assert!(err.to_string().contains("missing.yaml"), "{err}");

    let err = WatchedFile::open(dir.path().join("instances.ini"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown format"), "{err}");
}

#[tokio::test]
async fn the_poller_stops_with_the_last_handle() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.yaml");
    write(&path, YAML);
    let file = WatchedFile::open(&path).await.unwrap();
    let mut orders = file.service("orders").unwrap();
    drop(file);
    assert_eq!(take(&mut orders, 2).await.len(), 2);
    // A stream alone keeps the file watched.
    write(&path, &YAML.replace("127.0.0.1:1", "127.0.0.1:5"));
    assert_eq!(next(&mut orders).await, "+a http://127.0.0.1:5 {}");
}
