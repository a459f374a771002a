//! Live rules from a polled file, with a real file on disk.

use std::{path::Path, time::Duration};

use gray_core::hash::content_hash;
use gray_rules::Format;
use gray_source::SourceError;
use gray_test_support::{TempDir, WAIT};
use gray_tower::edge::{FileSource, LiveRules, Revision, RuleSourceError, RulesStatus};
use tokio::sync::watch;

/// Writes atomically: a temporary file, then a rename.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// Waits (bounded) until the status satisfies `ok`.
async fn wait_for(
    rx: &mut watch::Receiver<RulesStatus>,
    what: &str,
    ok: impl Fn(&RulesStatus) -> bool,
) -> RulesStatus {
    let waited = match tokio::time::timeout(WAIT, rx.wait_for(|s| ok(s))).await {
        Ok(Ok(status)) => Some(status.clone()),
        _ => None,
    };
    waited.unwrap_or_else(|| panic!("timed out waiting for {what}: {:?}", *rx.borrow()))
}

fn first_rule(live: &LiveRules) -> Option<String> {
    live.load()
        .rules()
        .rules()
        .first()
        .and_then(|r| r.name().map(str::to_owned))
}

#[tokio::test]
async fn a_followed_file_reloads_rejects_and_survives_deletion() {
    let dir = TempDir::new("live-file");
    let path = dir.path().join("rules.toml");
    let v1 = "[[rules]]\nname = \"one\"\nlane = \"gray\"\n";
    write(&path, v1);

    let source = FileSource::new(&path).with_interval(Duration::from_millis(20));
    let live = LiveRules::from_source(&source, None)
        .await
        .expect("first load");
    assert_eq!(
        live.status().revision,
        Revision::File {
            modified: std::fs::metadata(&path).and_then(|m| m.modified()).ok(),
            hash: content_hash(v1.as_bytes())
        }
    );
    let mut rx = live.subscribe();
    let watch = live.follow(&source, None);
    // The version in force is not applied a second time.
    let connected = wait_status(&watch, "the first read", |s| s.connected).await;
    assert!(connected.last_contact.is_some());
    assert_eq!(live.status().generation, 1);

    // A new valid version is picked up.
    let v2 = "[[rules]]\nname = \"two\"\nlane = \"gray\"\nwhen = { ip = [\"10.0.0.0/8\"] }\n";
    write(&path, v2);
    let s = wait_for(&mut rx, "version 2", |s| s.generation == 2).await;
    assert!(
        matches!(s.revision, Revision::File { hash, .. } if hash == content_hash(v2.as_bytes()))
    );
    assert_eq!(first_rule(&live).as_deref(), Some("two"));

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
    assert_eq!(first_rule(&live).as_deref(), Some("two"));

    // The file disappears: reported (once), nothing changes.
    std::fs::remove_file(&path).expect("remove");
    let s = wait_for(&mut rx, "the read failure", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("cannot read") && e.contains("rules.toml"))
    })
    .await;
    assert_eq!(s.generation, 2);
    assert_eq!(first_rule(&live).as_deref(), Some("two"));
    assert!(!watch.status().connected);

    // It comes back with a new version.
    write(&path, "[[rules]]\nname = \"four\"\nbaseline = true\n");
    let s = wait_for(&mut rx, "version 4", |s| s.generation == 3).await;
    assert_eq!(s.rejected, 1);
    assert_eq!(first_rule(&live).as_deref(), Some("four"));
    assert!(watch.status().connected);

    // Stopped: the follower is gone (its status has no writer left, the event that proves
    // it), and later versions are not picked up.
    let mut source_status = watch.status_handle().subscribe();
    drop(watch);
    tokio::time::timeout(WAIT, async {
        while source_status.changed().await.is_ok() {}
    })
    .await
    .expect("the follower stops with its handle");
    write(&path, "[[rules]]\nname = \"five\"\nbaseline = true\n");
    assert_eq!(first_rule(&live).as_deref(), Some("four"));
    assert_eq!(live.status().generation, 3);
}

async fn wait_status(
    watch: &gray_tower::edge::WatchHandle,
    what: &str,
    ok: impl Fn(&gray_source::Status) -> bool,
) -> gray_source::Status {
    let mut rx = watch.status_handle().subscribe();
    match tokio::time::timeout(WAIT, rx.wait_for(|s| ok(s))).await {
        Ok(Ok(status)) => status.clone(),
        _ => panic!("timed out waiting for {what}: {:?}", watch.status()),
    }
}

#[tokio::test]
async fn the_first_load_reports_what_is_wrong() {
    let dir = TempDir::new("live-file-first");
    let missing = FileSource::new(dir.path().join("absent.yaml"));
    let err = LiveRules::from_source(&missing, None).await.unwrap_err();
    assert!(
        matches!(err, RuleSourceError::Source(SourceError::Read { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("absent.yaml"), "{err}");

    let odd = dir.path().join("rules.conf");
    write(&odd, "{}");
    let err = LiveRules::from_source(&FileSource::new(&odd), None)
        .await
        .expect_err("unknown format");
    assert!(
        err.to_string()
            .contains("expected a .toml, .yaml, .yml or .json extension"),
        "{err}"
    );
    // An explicit format overrides the extension.
    let live = LiveRules::from_source(&FileSource::new(&odd), Format::Json)
        .await
        .expect("json");
    assert!(live.load().rules().rules().is_empty());

    let binary = dir.path().join("rules.json");
    std::fs::write(&binary, [0xff, 0xfe]).expect("write");
    let err = LiveRules::from_source(&FileSource::new(&binary), None)
        .await
        .expect_err("not text");
    assert!(matches!(err, RuleSourceError::NotText(_)), "{err:?}");

    let yaml = dir.path().join("rules.yml");
    write(
        &yaml,
        "rules:\n  - name: x\n    lane: gray\n    when: { sticky: { by: client_ip, percent: 101 } }\n",
    );
    let err = LiveRules::from_source(&FileSource::new(&yaml), None)
        .await
        .expect_err("invalid");
    let text = err.to_string();
    assert!(text.contains("rules.yml:4:47: rules[0] (\"x\"), field `when.sticky.percent`: expected a percentage from 0 to 100, found 101"), "{text}");
}
