//! A registry over a real instance file: edits as diffs, rejected edits, empty files, and
//! freshness with no traffic at all.

mod support;

use std::{io::Write, path::Path, time::Duration};

use gray_discovery::{Error, Registry, source::file::FileSource};
use support::{TempDir, WAIT, capture, instances, next, take, until_instances};

/// Writes `content` to `path` the way editors and config tools do: a new file renamed over
/// the old one.
fn write(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A registry of `path`, polled every 20 ms.
async fn registry(path: &Path) -> Result<Registry, Error> {
    Registry::start(FileSource::new(path).with_interval(Duration::from_millis(20))).await
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
    let registry = registry(&path).await.unwrap();
    assert_eq!(registry.services(), ["orders", "payments"]);
    let mut orders = registry.service("orders").unwrap().discover();
    let mut payments = registry.service("payments").unwrap().discover();
    assert_eq!(
        take(&mut orders, 2).await,
        ["+a 127.0.0.1:1 {}", "+b 127.0.0.1:2 {gray=true}"]
    );
    assert_eq!(next(&mut payments).await, "+p 127.0.0.1:9 {}");

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
        ["-b", "+a 127.0.0.1:1 {version=2.0}", "+c 127.0.0.1:3 {}"]
    );

    // An in-place edit of the same size and within the same second is seen too. It is
    // the next change of payments: the edit above, applied whole already, gave it none.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.write_all(YAML.replace("127.0.0.1:9", "127.0.0.1:8").as_bytes())
        .unwrap();
    drop(f);
    assert_eq!(next(&mut payments).await, "+p 127.0.0.1:8 {}");
}

#[tokio::test]
async fn instances_follow_the_file_with_no_traffic_at_all() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.toml");
    let one = |id: &str, port: u16, labels: &str| {
        format!(
            "[[services.orders]]\nid = \"{id}\"\naddress = \"127.0.0.1:{port}\"\nlabels = {{ {labels} }}\n\n"
        )
    };
    write(&path, &one("a", 1, ""));
    // The default interval, as a gateway runs it; nothing reads a stream.
    let registry = Registry::start(FileSource::new(&path)).await.unwrap();
    let orders = registry.service("orders").unwrap();
    assert_eq!(instances(&orders), ["a 127.0.0.1:1 {}"]);

    // Registered.
    write(
        &path,
        &[one("a", 1, ""), one("b", 2, "gray = true")].concat(),
    );
    until_instances(&orders, &["a 127.0.0.1:1 {}", "b 127.0.0.1:2 {gray=true}"]).await;
    // Relabelled.
    write(
        &path,
        &[one("a", 1, "version = \"2.0\""), one("b", 2, "gray = true")].concat(),
    );
    until_instances(
        &orders,
        &["a 127.0.0.1:1 {version=2.0}", "b 127.0.0.1:2 {gray=true}"],
    )
    .await;
    // Deleted.
    write(&path, &one("b", 2, "gray = true"));
    until_instances(&orders, &["b 127.0.0.1:2 {gray=true}"]).await;
    assert!(registry.status().last_contact.is_some());
}

#[tokio::test(flavor = "current_thread")]
async fn an_invalid_edit_keeps_the_last_good_set_and_names_file_line_and_field() {
    let (logs, _guard) = capture();
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.toml");
    write(
        &path,
        "[[services.orders]]\nid = \"a\"\naddress = \"127.0.0.1:1\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    let registry = registry(&path).await.unwrap();
    let service = registry.service("orders").unwrap();
    let mut orders = service.discover();
    assert_eq!(take(&mut orders, 2).await.len(), 2);

    // Line 7: b's address is not an address. The whole edit is rejected, including the
    // removal of a that it also made.
    write(
        &path,
        "[[services.orders]]\nid = \"c\"\naddress = \"127.0.0.1:3\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:two\"\n",
    );
    let line = logs.line("instance file rejected").await;
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&path.display().to_string()), "{line}");
    assert!(line.contains("line=7"), "{line}");
    assert!(
        line.contains(r#"field="services.orders[1].address""#),
        "{line}"
    );
    assert!(line.contains("invalid address `127.0.0.1:two`"), "{line}");
    // Logged once the version was rejected, so what it would have changed would be there.
    assert_eq!(
        instances(&service),
        ["a 127.0.0.1:1 {}", "b 127.0.0.1:2 {}"]
    );
    // Reported once, not at every poll.
    let log = logs.text();
    assert_eq!(log.matches("instance file rejected").count(), 1, "{log}");

    // The next good edit is diffed against the last good set; its changes are the next
    // ones of the stream (the rejected edit gave it none).
    write(
        &path,
        "[[services.orders]]\nid = \"c\"\naddress = \"127.0.0.1:3\"\n\n[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    assert_eq!(take(&mut orders, 2).await, ["-a", "+c 127.0.0.1:3 {}"]);

    // A file that disappears keeps the set too: once the registry has failed to read it,
    // the next version's change is the next one of the stream.
    let failures = registry.status().failures;
    std::fs::remove_file(&path).unwrap();
    let mut status = registry.status();
    let deadline = tokio::time::Instant::now() + WAIT;
    while status.failures == failures {
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = registry.status();
    }
    assert!(!status.connected, "{status:?}");
    assert_eq!(
        instances(&service),
        ["b 127.0.0.1:2 {}", "c 127.0.0.1:3 {}"]
    );
    write(
        &path,
        "[[services.orders]]\nid = \"b\"\naddress = \"127.0.0.1:2\"\n",
    );
    assert_eq!(next(&mut orders).await, "-c");
}

#[tokio::test(flavor = "current_thread")]
async fn an_empty_file_never_empties_a_service_but_an_empty_table_does() {
    let (logs, _guard) = capture();
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.toml");

    // At start, an empty file is an error that says what to write.
    std::fs::write(&path, "").unwrap();
    let err = registry(&path).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: empty: an instance file must have a `services` table; write `services = {{}}` to remove every instance",
            path.display()
        )
    );

    write(
        &path,
        "[[services.orders]]\nid = \"a\"\naddress = \"127.0.0.1:1\"\n",
    );
    let registry = registry(&path).await.unwrap();
    let service = registry.service("orders").unwrap();
    let mut orders = service.discover();
    assert_eq!(next(&mut orders).await, "+a 127.0.0.1:1 {}");

    // Caught half-written (truncated in place, 0 bytes): rejected, the instance stays.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let line = logs.line("instance file rejected").await;
    assert!(line.contains("ERROR") && line.contains("empty"), "{line}");
    assert_eq!(instances(&service), ["a 127.0.0.1:1 {}"]);

    // Said on purpose: no instances. The removal is the stream's next change.
    write(&path, "services = {}\n");
    assert_eq!(next(&mut orders).await, "-a");
    assert!(service.instances().is_empty());
    assert!(registry.services().is_empty());
}

#[tokio::test]
async fn json_files_and_a_service_that_appears_later() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.json");
    write(&path, r#"{"services": {}}"#);
    let registry = registry(&path).await.unwrap();
    let mut orders = registry.service("orders").unwrap().discover();
    write(
        &path,
        r#"{"services": {"orders": [{"address": "127.0.0.1:1", "labels": {"version": 2}}]}}"#,
    );
    // Without an id, the address is the id. The first change of the stream: the empty
    // table at start gave it none.
    assert_eq!(
        next(&mut orders).await,
        "+127.0.0.1:1 127.0.0.1:1 {version=2}"
    );
}

#[tokio::test]
async fn starting_on_a_bad_file_says_where_and_why() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.json");
    write(
        &path,
        "{\"services\": {\"orders\": [\n  {\"id\": \"a\", \"address\": \"127.0.0.1:1\", \"lables\": {}}\n]}}",
    );
    let err = registry(&path).await.unwrap_err();
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
    let err = registry(&missing).await.unwrap_err();
    assert!(matches!(err, Error::Source(_)), "{err}");
    assert!(err.to_string().contains("missing.yaml"), "{err}");

    let err = registry(&dir.path().join("instances.ini"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown format"), "{err}");
}

#[tokio::test]
async fn a_stream_alone_keeps_the_registry_running() {
    let dir = TempDir::new("file");
    let path = dir.path().join("instances.yaml");
    write(&path, YAML);
    let registry = registry(&path).await.unwrap();
    let mut orders = registry.service("orders").unwrap().discover();
    drop(registry);
    assert_eq!(take(&mut orders, 2).await.len(), 2);
    write(&path, &YAML.replace("127.0.0.1:1", "127.0.0.1:5"));
    assert_eq!(next(&mut orders).await, "+a 127.0.0.1:5 {}");
}
