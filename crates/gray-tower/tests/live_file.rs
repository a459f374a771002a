//! The watched rule file, with a real file on disk.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use gray_core::rules::{Format, content_hash};
use gray_tower::edge::{FileSource, LiveRules, Revision, SourceError, Status};
use tokio::sync::watch;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "gray-live-file-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes atomically: a temporary file, then a rename.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Waits (bounded) until the status satisfies `ok`.
async fn wait_for(
    rx: &mut watch::Receiver<Status>,
    what: &str,
    ok: impl Fn(&Status) -> bool,
) -> Status {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
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

fn lane_of_first_rule(live: &LiveRules) -> Option<String> {
    live.load()
        .rules()
        .rules()
        .first()
        .and_then(|r| r.name().map(str::to_owned))
}

#[tokio::test]
async fn a_watched_file_reloads_rejects_and_survives_deletion() {
    let dir = TempDir::new("toml");
    let path = dir.0.join("rules.toml");
    let v1 = "[[rules]]\nname = \"one\"\nlane = \"gray\"\n";
    write(&path, v1);

    let source = FileSource::new(&path).with_interval(Duration::from_millis(20));
    let live = source.live().await.expect("first load");
    assert_eq!(
        live.status().revision,
        Revision::File {
            modified: std::fs::metadata(&path).and_then(|m| m.modified()).ok(),
            hash: content_hash(v1.as_bytes())
        }
    );
    let mut rx = live.subscribe();
    let _watch = source.watch(live.clone());

    // A new valid version is picked up.
    let v2 = "[[rules]]\nname = \"two\"\nlane = \"gray\"\nwhen = { ip = [\"10.0.0.0/8\"] }\n";
    write(&path, v2);
    let s = wait_for(&mut rx, "version 2", |s| s.generation == 2).await;
    assert!(
        matches!(s.revision, Revision::File { hash, .. } if hash == content_hash(v2.as_bytes()))
    );
    assert_eq!(lane_of_first_rule(&live).as_deref(), Some("two"));

    // An invalid one is rejected; version 2 stays in force.
    write(
        &path,
        "[[rules]]\nname = \"three\"\nlane = \"gray\"\nwhen = { ip = [\"10.0.0.0/99\"] }\n",
    );
    let s = wait_for(&mut rx, "the rejection", |s| s.rejected == 1).await;
    assert_eq!(s.generation, 2);
    let err = s.last_error.expect("error");
    assert!(err.contains("rules.toml"), "{err}");
    assert!(
        err.contains("rules[0] (\"three\"), field `when.ip[0]`"),
        "{err}"
    );
    assert_eq!(lane_of_first_rule(&live).as_deref(), Some("two"));

    // The file disappears: reported, nothing changes.
    std::fs::remove_file(&path).expect("remove");
    let s = wait_for(&mut rx, "the read failure", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("cannot read rule file"))
    })
    .await;
    assert_eq!(s.generation, 2);
    assert_eq!(lane_of_first_rule(&live).as_deref(), Some("two"));

    // It comes back with a new version.
    write(&path, "[[rules]]\nname = \"four\"\nbaseline = true\n");
    let s = wait_for(&mut rx, "version 4", |s| s.generation == 3).await;
    assert_eq!(s.rejected, 1);
    assert_eq!(lane_of_first_rule(&live).as_deref(), Some("four"));
}

#[tokio::test]
async fn the_first_load_reports_what_is_wrong() {
    let dir = TempDir::new("first");
    let missing = FileSource::new(dir.0.join("absent.yaml"));
    assert!(matches!(missing.load().await, Err(SourceError::Io { .. })));

    let odd = dir.0.join("rules.conf");
    write(&odd, "{}");
    let err = FileSource::new(&odd)
        .load()
        .await
        .expect_err("unknown format");
    assert!(
        err.to_string()
            .contains("expected a .toml, .yaml, .yml or .json extension"),
        "{err}"
    );
    // An explicit format overrides the extension.
    let (rules, _) = FileSource::new(&odd)
        .with_format(Format::Json)
        .load()
        .await
        .expect("json");
    assert!(rules.rules().is_empty());

    let yaml = dir.0.join("rules.yml");
    write(
        &yaml,
        "rules:\n  - name: x\n    lane: gray\n    when: { sticky: { by: client_ip, percent: 101 } }\n",
    );
    let err = FileSource::new(&yaml).load().await.expect_err("invalid");
    let text = err.to_string();
    assert!(text.contains("rules.yml:4:47: rules[0] (\"x\"), field `when.sticky.percent`: expected a percentage from 0 to 100, found 101"), "{text}");
}
