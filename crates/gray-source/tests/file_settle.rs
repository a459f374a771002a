//! A file written in place (truncated, then written in several writes) is handed out only
//! whole: a version waits for a second read, the settle delay later, that gives the same
//! bytes. The writer here writes its next chunk as soon as the source has read the last
//! one (seen in the status's last contact), so every torn state is read, and the pauses
//! between writes stay well below the settle delay.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use futures_util::StreamExt;
use gray_source::{Source, StatusHandle, Update, file::FileSource};
use gray_test_support::{TempDir, WAIT};
use tokio::sync::mpsc;

const OLD: &str = "# the old version\nfirst = 1\nsecond = 2\n";
const NEW: &str = "# the new version\nfirst = 10\nsecond = 20\nthird = 30\n";

/// The new version in the pieces the writer writes, each after the previous was read.
fn chunks() -> Vec<&'static str> {
    let mut chunks = Vec::new();
    let mut rest = NEW;
    for cut in [18, 11, 5, 7] {
        let (chunk, tail) = rest.split_at(cut);
        chunks.push(chunk);
        rest = tail;
    }
    chunks.push(rest);
    assert_eq!(chunks.concat(), NEW);
    chunks
}

/// Updates forwarded from a task that polls the watch, and its status.
struct Watched {
    rx: mpsc::UnboundedReceiver<Update>,
    status: StatusHandle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watched {
    fn start(source: &FileSource) -> Watched {
        let mut updates = source.watch();
        let status = updates.status_handle();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(update) = updates.next().await {
                if tx.send(update).is_err() {
                    return;
                }
            }
        });
        Watched { rx, status, task }
    }

    /// The content of the next update, within [`WAIT`].
    async fn next(&mut self) -> String {
        match tokio::time::timeout(WAIT, self.rx.recv()).await {
            Ok(Some(Update::Reset(s))) => String::from_utf8(s.entries[0].value.clone()).unwrap(),
            other => panic!("expected a version, got {other:?}"),
        }
    }

    /// Waits until the source has read the file `reads` times after `since`.
    async fn read_since(&self, since: Instant, reads: usize) {
        let deadline = Instant::now() + WAIT;
        let mut after = since;
        for _ in 0..reads {
            loop {
                if let Some(contact) = self.status.get().last_contact.filter(|c| *c > after) {
                    after = contact;
                    break;
                }
                assert!(Instant::now() < deadline, "no read within {WAIT:?}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}

/// One state the file was in while the writer wrote it.
struct Held {
    /// The file's content.
    content: String,
    /// At least as long as the file held it: from before the write that made it to after
    /// the next write (`None` for the last state, which stays).
    at_most: Option<Duration>,
}

/// Truncates `path`, then writes the new version chunk by chunk, each once `watched` has
/// read the file `reads` times since the previous write. Returns every state the file
/// went through and how long it held it at most.
async fn write_in_place(path: &Path, watched: &Watched, reads: usize) -> Vec<Held> {
    let mut began = Instant::now();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .expect("open the file in place");
    let mut held = Vec::new();
    let mut content = String::new();
    watched.read_since(Instant::now(), reads).await;
    for chunk in chunks() {
        let next = Instant::now();
        file.write_all(chunk.as_bytes()).expect("write a chunk");
        file.flush().expect("flush");
        held.push(Held {
            content: content.clone(),
            at_most: Some(began.elapsed()),
        });
        began = next;
        content.push_str(chunk);
        watched.read_since(Instant::now(), reads).await;
    }
    held.push(Held {
        content,
        at_most: None,
    });
    held
}

fn file(dir: &TempDir) -> PathBuf {
    let path = dir.path().join("settings.toml");
    std::fs::write(&path, OLD).expect("write the old version");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_in_place_is_handed_out_only_whole() {
    let dir = TempDir::new("settle");
    let path = file(&dir);
    // Far longer than the writer's pauses, which last until the next read (5 ms apart).
    let source = FileSource::new(&path)
        .with_interval(Duration::from_millis(5))
        .with_settle(Duration::from_millis(500));
    let mut watched = Watched::start(&source);
    assert_eq!(watched.next().await, OLD);

    let held = write_in_place(&path, &watched, 1).await;
    // Neither the empty file nor any prefix was handed out unless the file held it for the
    // settle delay: a writer starved that long on a loaded machine did leave that state
    // in place, and handing it out is then right. Each pause here is a few milliseconds
    // when the machine is not starved, so no torn version at all is handed out then.
    loop {
        let version = watched.next().await;
        if version == NEW {
            break;
        }
        let state = held.iter().find(|h| h.content == version);
        let at_most = state.and_then(|h| h.at_most);
        assert!(
            at_most.is_some_and(|d| d >= source.settle()),
            "a torn version was handed out: {version:?}, which the file held for {at_most:?}, \
             less than the settle delay"
        );
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(700), watched.rx.recv())
            .await
            .is_err(),
        "one version, once"
    );
}

/// What the settle delay prevents: the same writer, read by a source that hands out every
/// read, switches to the empty file and to prefixes of the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_settle_delay_torn_versions_are_handed_out() {
    let dir = TempDir::new("settle-off");
    let path = file(&dir);
    let source = FileSource::new(&path)
        .with_interval(Duration::from_millis(5))
        .with_settle(Duration::ZERO);
    let mut watched = Watched::start(&source);
    assert_eq!(watched.next().await, OLD);

    // Two reads after each write: the second one started after it.
    write_in_place(&path, &watched, 2).await;
    let mut seen = Vec::new();
    loop {
        let version = watched.next().await;
        let done = version == NEW;
        seen.push(version);
        if done {
            break;
        }
    }
    assert_eq!(seen.first().map(String::as_str), Some(""), "{seen:?}");
    assert!(seen.len() > 2, "prefixes handed out: {seen:?}");
    assert!(seen.iter().all(|v| NEW.starts_with(v.as_str())), "{seen:?}");
}

/// A load that finds the file half-written waits for it to settle; a file left alone for
/// a while is read at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_waits_for_a_file_being_written_but_not_for_a_quiet_one() {
    let dir = TempDir::new("settle-load");
    let path = file(&dir);
    let settle = Duration::from_millis(300);
    let source = FileSource::new(&path).with_settle(settle);

    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open the file in place");
    let chunks = chunks();
    file.write_all(chunks[0].as_bytes()).unwrap();
    let load = tokio::spawn({
        let source = source.clone();
        async move { source.load().await }
    });
    // The rest, in pauses far below the settle delay: the writer of the scenario, not a
    // synchronisation.
    for chunk in &chunks[1..] {
        tokio::time::sleep(Duration::from_millis(10)).await;
        file.write_all(chunk.as_bytes()).unwrap();
    }
    let loaded = tokio::time::timeout(WAIT, load)
        .await
        .expect("load settles")
        .unwrap()
        .expect("loaded");
    assert_eq!(loaded.entries[0].value, NEW.as_bytes());

    // Left alone for a minute: one read. A load that waited for a second read would take
    // the settle delay, here far longer than the bound.
    let quiet = FileSource::new(&path).with_settle(Duration::from_secs(60));
    file.set_modified(SystemTime::now() - Duration::from_secs(60))
        .expect("set the modification time");
    let loaded = tokio::time::timeout(Duration::from_secs(10), quiet.load())
        .await
        .expect("a quiet file is read at once")
        .expect("loaded");
    assert_eq!(loaded.entries[0].value, NEW.as_bytes());
}
