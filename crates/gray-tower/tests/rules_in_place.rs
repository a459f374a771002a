//! Rules files written in place and empty rules files, with a real file on disk: the rules
//! in force are always a whole version, never none for a moment, and an empty document is
//! refused with an error that names the file.

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gray_rules::Format;
use gray_test_support::{TempDir, WAIT};
use gray_tower::edge::{FileSource, LiveRules, RuleSourceError, WatchHandle};

/// Three rules. A TOML file cut after any of them still parses: a rule set of fewer.
fn rules(names: [&str; 3]) -> String {
    let mut text = String::from("# Staining rules (written in place by a config tool)\n");
    for name in names {
        text.push_str(&format!(
            "\n[[rules]]\nname = \"{name}\"\nwhen = {{ header = {{ name = \"x-{name}\", present = true }} }}\nlane = \"gray\"\n"
        ));
    }
    text
}

const OLD: [&str; 3] = ["old-1", "old-2", "old-3"];
const NEW: [&str; 3] = ["new-1", "new-2", "new-3"];

fn names(live: &LiveRules) -> Vec<String> {
    live.load()
        .rules()
        .rules()
        .iter()
        .filter_map(|r| r.name().map(str::to_owned))
        .collect()
}

/// Waits until `watch` has read the file once after `since` (its status's last contact).
async fn read_since(watch: &WatchHandle, since: Instant) {
    let deadline = Instant::now() + WAIT;
    while watch.status().last_contact.is_none_or(|c| c <= since) {
        assert!(Instant::now() < deadline, "no read within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A config tool rewrites the rules file in place: it truncates it, then writes the new
/// version in pieces (the opening comment alone, after the first rule, in the middle of the
/// second, ...), each once the file was read. A checker records the rules in force at every
/// status change. Only the whole new version is ever put in force: one new generation, no
/// rejection, and the checker never saw anything but the whole old or the whole new set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_file_written_in_place_never_switches_the_rules_off() {
    let dir = TempDir::new("rules-in-place");
    let path = dir.path().join("rules.toml");
    let (old, new) = (rules(OLD), rules(NEW));
    std::fs::write(&path, &old).unwrap();
    let source = FileSource::new(&path)
        .with_interval(Duration::from_millis(5))
        .with_settle(Duration::from_millis(500));
    let live = LiveRules::from_source(&source, None)
        .await
        .expect("first load");
    assert_eq!(names(&live), OLD);
    let watch = live.follow(&source, None);

    // The checker: the rules in force at every status change.
    let seen: Arc<Mutex<Vec<(u64, Vec<String>)>>> = Arc::default();
    let checker = tokio::spawn({
        let (live, seen) = (live.clone(), seen.clone());
        let mut rx = live.subscribe();
        async move {
            while rx.changed().await.is_ok() {
                let generation = rx.borrow_and_update().generation;
                seen.lock().unwrap().push((generation, names(&live)));
            }
        }
    });
    // The follower's first read (the version in force) is done.
    read_since(&watch, Instant::now()).await;

    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    read_since(&watch, Instant::now()).await;
    let second = new.find("name = \"new-2\"").expect("the second rule");
    let cuts = [
        new.find('\n').unwrap() + 1, // the comment alone
        new.find("[[rules]]").unwrap() + 4,
        second,      // after the first rule: a valid rule set of one
        second + 10, // in the middle of the second
        new.len() - 3,
        new.len(),
    ];
    let mut at = 0;
    for cut in cuts {
        file.write_all(&new.as_bytes()[at..cut]).unwrap();
        file.flush().unwrap();
        at = cut;
        assert_eq!(names(&live), OLD, "switched before the write was done");
        read_since(&watch, Instant::now()).await;
    }

    let mut rx = live.subscribe();
    tokio::time::timeout(WAIT, rx.wait_for(|s| s.generation > 1))
        .await
        .expect("the new version in force")
        .unwrap();
    assert_eq!(names(&live), NEW);
    let status = live.status();
    assert_eq!(
        status.generation, 2,
        "one new version, the whole: {status:?}"
    );
    assert_eq!(status.rejected, 0, "{status:?}");
    checker.abort();
    for (generation, in_force) in seen.lock().unwrap().iter() {
        assert!(
            in_force == &OLD || in_force == &NEW,
            "generation {generation}: {in_force:?}"
        );
    }
}

/// An empty rules file (0 bytes, blanks, comments only) is refused at start with an error
/// that names it, and rejected when it appears later: the rules in force stay. An explicit
/// empty list is "no rules".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_rules_file_is_refused_with_an_error_that_names_it() {
    let dir = TempDir::new("rules-empty");
    for (name, text, example) in [
        ("rules.toml", "", "rules = []"),
        ("rules.toml", " \n\t\n", "rules = []"),
        ("rules.toml", "# Staining rules\n\n", "rules = []"),
        ("rules.yaml", "# nothing yet\n---\n", "rules: []"),
        ("rules.json", "\n", r#"{"rules": []}"#),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let error = LiveRules::from_source(&FileSource::new(&path), None)
            .await
            .expect_err("an empty rules file");
        assert!(
            matches!(error, RuleSourceError::Empty { .. }),
            "{text:?}: {error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "{}: empty: a rule set must say what it holds; write `{example}` to turn every rule off",
                path.display()
            )
        );
    }
    for (name, text) in [
        ("none.toml", "rules = []\n"),
        ("none.yaml", "rules: []\n"),
        ("none.json", r#"{"rules": []}"#),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let live = LiveRules::from_source(&FileSource::new(&path), None)
            .await
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(live.load().rules().rules().is_empty());
    }

    // Emptied while followed: rejected, the rules in force stay.
    let path = dir.path().join("rules.toml");
    std::fs::write(&path, rules(OLD)).unwrap();
    let source = FileSource::new(&path)
        .with_interval(Duration::from_millis(5))
        .with_settle(Duration::from_millis(20));
    let live = LiveRules::from_source(&source, Format::Toml).await.unwrap();
    let _watch = live.follow(&source, Format::Toml);
    let mut rx = live.subscribe();
    std::fs::write(&path, "").unwrap();
    let status = tokio::time::timeout(WAIT, rx.wait_for(|s| s.rejected > 0))
        .await
        .expect("the empty file rejected")
        .unwrap()
        .clone();
    let error = status.last_error.unwrap_or_default();
    assert!(
        error.starts_with(&format!("{}: empty: ", path.display())),
        "{error}"
    );
    assert_eq!(status.generation, 1);
    assert_eq!(names(&live), OLD);

    // Then an explicit "no rules" is put in force.
    std::fs::write(&path, "rules = []\n").unwrap();
    tokio::time::timeout(WAIT, rx.wait_for(|s| s.generation == 2))
        .await
        .expect("no rules, said explicitly")
        .unwrap();
    assert!(live.load().rules().rules().is_empty());
}
