//! The registry itself, over a source the test drives by hand: what subscribers see, how
//! many changes a subscriber that is not polled keeps, and when the registry's task stops.

mod support;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gray_discovery::{
    Error, Instance, Layout, Registry,
    source::{Entry, Revision, Snapshot, Source, SourceError, StatusHandle, Update, Updates},
};
use support::{WAIT, assert_nothing_ready, instances, next, take, until_instances};
use tokio::sync::mpsc;

/// A source of etcd-like keys whose updates the test sends by hand.
#[derive(Debug)]
struct Manual {
    first: Vec<(String, String)>,
    updates: Mutex<Option<mpsc::UnboundedReceiver<Update>>>,
    status: StatusHandle,
    /// Set when the watch stream is dropped: the registry's task has stopped.
    stopped: Arc<AtomicBool>,
    fail: bool,
}

/// Sets a flag when dropped.
struct Flag(Arc<AtomicBool>);

impl Drop for Flag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        revision: Revision::Manual(0),
    }
}

impl Source for Manual {
    fn describe(&self) -> String {
        "manual".to_owned()
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(async move {
            if self.fail {
                return Err(SourceError::Config {
                    field: "endpoints",
                    message: "nothing to read".to_owned(),
                });
            }
            Ok(Snapshot {
                entries: self.first.iter().map(|(k, v)| entry(k, v)).collect(),
                revision: Revision::Manual(0),
            })
        })
    }

    fn watch(&self) -> Updates {
        let rx = self.updates.lock().unwrap().take().expect("one watch");
        // The flag is dropped with the stream.
        let state = (rx, Flag(self.stopped.clone()));
        let stream = futures_util::stream::unfold(state, |(mut rx, flag)| async move {
            rx.recv().await.map(|update| (update, (rx, flag)))
        });
        Updates::new(stream, self.status.clone())
    }
}

struct Harness {
    tx: mpsc::UnboundedSender<Update>,
    stopped: Arc<AtomicBool>,
    status: StatusHandle,
}

impl Harness {
    fn put(&self, key: &str, value: &str) {
        self.tx.send(Update::Put(entry(key, value))).unwrap();
    }

    fn delete(&self, key: &str) {
        self.tx
            .send(Update::Delete {
                key: key.to_owned(),
                revision: Revision::Manual(0),
            })
            .unwrap();
    }

    fn reset(&self, entries: &[(&str, &str)]) {
        self.tx
            .send(Update::Reset(Snapshot {
                entries: entries.iter().map(|(k, v)| entry(k, v)).collect(),
                revision: Revision::Manual(0),
            }))
            .unwrap();
    }
}

async fn start(first: &[(&str, &str)]) -> (Registry, Harness) {
    let (tx, rx) = mpsc::unbounded_channel();
    let stopped = Arc::new(AtomicBool::new(false));
    let status = StatusHandle::new();
    let source = Manual {
        first: first
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        updates: Mutex::new(Some(rx)),
        status: status.clone(),
        stopped: stopped.clone(),
        fail: false,
    };
    let registry = Registry::start_with(source, Layout::keys("/gray"))
        .await
        .unwrap();
    (
        registry,
        Harness {
            tx,
            stopped,
            status,
        },
    )
}

fn record(port: u16, labels: &str) -> String {
    format!(r#"{{"address": "127.0.0.1:{port}", "labels": {{{labels}}}}}"#)
}

#[tokio::test]
async fn a_change_reaches_every_subscriber_and_the_instances_without_traffic() {
    let (registry, source) = start(&[
        ("/gray/orders/a", &record(1, "")),
        ("/gray/orders/b", &record(2, r#""gray": "true""#)),
        ("/gray/stock/s", &record(9, "")),
        ("/grayish/orders/x", &record(7, "")),
    ])
    .await;
    assert_eq!(registry.services(), ["orders", "stock"]);
    assert_eq!(registry.source(), "manual");
    let orders = registry.service("orders").unwrap();
    assert_eq!(
        instances(&orders),
        ["a 127.0.0.1:1 {}", "b 127.0.0.1:2 {gray=true}"]
    );
    let mut first = orders.discover();
    let mut second = orders.discover();
    for stream in [&mut first, &mut second] {
        assert_eq!(
            take(stream, 2).await,
            ["+a 127.0.0.1:1 {}", "+b 127.0.0.1:2 {gray=true}"]
        );
    }

    source.put("/gray/orders/c", &record(3, ""));
    source.put("/gray/orders/a", &record(1, r#""version": "2.0""#));
    source.delete("/gray/orders/b");
    // A key nested deeper, another service, an unchanged put: nothing for `orders`.
    source.put("/gray/orders/c/extra", &record(4, ""));
    source.put("/gray/stock/t", &record(10, ""));
    source.put("/gray/orders/c", &record(3, ""));
    for stream in [&mut first, &mut second] {
        assert_eq!(
            take(stream, 3).await,
            ["+c 127.0.0.1:3 {}", "+a 127.0.0.1:1 {version=2.0}", "-b"]
        );
    }
    assert_eq!(
        instances(&orders),
        ["a 127.0.0.1:1 {version=2.0}", "c 127.0.0.1:3 {}"]
    );

    // A subscriber that comes later starts from the instances now.
    let mut late = orders.discover();
    assert_eq!(
        take(&mut late, 2).await,
        ["+a 127.0.0.1:1 {version=2.0}", "+c 127.0.0.1:3 {}"]
    );

    // A whole new content is diffed: removals, then inserts, each sorted by id.
    source.reset(&[
        ("/gray/orders/d", &record(4, "")),
        ("/gray/orders/c", &record(3, "")),
    ]);
    // The next changes of both streams: the nested key, the other service and the
    // unchanged put gave them none.
    for stream in [&mut first, &mut second] {
        assert_eq!(take(stream, 2).await, ["-a", "+d 127.0.0.1:4 {}"]);
    }
    until_instances(&registry.service("stock").unwrap(), &[]).await;
    assert_eq!(registry.services(), ["orders"]);
}

#[tokio::test]
async fn a_malformed_value_is_skipped_and_removes_what_it_replaced() {
    let (registry, source) = start(&[
        ("/gray/orders/a", &record(1, "")),
        ("/gray/orders/bad", "not json"),
        ("/gray/orders/d", &record(4, "")),
    ])
    .await;
    let orders = registry.service("orders").unwrap();
    let mut stream = orders.discover();
    assert_eq!(
        take(&mut stream, 2).await,
        ["+a 127.0.0.1:1 {}", "+d 127.0.0.1:4 {}"]
    );
    source.put("/gray/orders/e", "{");
    source.put("/gray/orders/a", r#"{"address": ""}"#);
    assert_eq!(next(&mut stream).await, "-a");
    source.put("/gray/orders/z", &record(26, ""));
    assert_eq!(next(&mut stream).await, "+z 127.0.0.1:26 {}");
}

#[tokio::test]
async fn a_subscriber_that_is_not_polled_keeps_one_change_per_instance() {
    let (registry, source) = start(&[("/gray/orders/a", &record(1, ""))]).await;
    let orders = registry.service("orders").unwrap();
    let mut idle = orders.discover();
    let mut busy = orders.discover();
    assert_eq!(next(&mut idle).await, "+a 127.0.0.1:1 {}");

    // 1,000 changes of two instances while `idle` is not polled; `busy` takes each one.
    assert_eq!(next(&mut busy).await, "+a 127.0.0.1:1 {}");
    for round in 0..500u16 {
        source.put("/gray/orders/a", &record(1000 + round, ""));
        assert_eq!(
            next(&mut busy).await,
            format!("+a 127.0.0.1:{} {{}}", 1000 + round)
        );
        source.put("/gray/orders/b", &record(2000 + round, ""));
        assert_eq!(
            next(&mut busy).await,
            format!("+b 127.0.0.1:{} {{}}", 2000 + round)
        );
    }
    // b comes and goes: `idle` never saw it, so it is told nothing about it.
    source.delete("/gray/orders/b");
    source.put("/gray/orders/c", &record(3, ""));
    assert_eq!(take(&mut busy, 2).await, ["-b", "+c 127.0.0.1:3 {}"]);

    // The idle one: the latest state of each instance, once.
    assert_eq!(
        take(&mut idle, 2).await,
        ["+a 127.0.0.1:1499 {}", "+c 127.0.0.1:3 {}"]
    );
    // Once: the next change it gets is a new one.
    source.put("/gray/orders/d", &record(4, ""));
    assert_eq!(next(&mut idle).await, "+d 127.0.0.1:4 {}");
}

#[tokio::test]
async fn the_task_stops_with_the_last_handle() {
    let (registry, source) = start(&[("/gray/orders/a", &record(1, ""))]).await;
    let orders = registry.service("orders").unwrap();
    let stream = orders.discover();
    drop(registry);
    drop(orders);
    // A stream still holds it: the source is still followed.
    source.put("/gray/orders/b", &record(2, ""));
    let mut stream = stream;
    assert_eq!(
        take(&mut stream, 2).await,
        ["+a 127.0.0.1:1 {}", "+b 127.0.0.1:2 {}"]
    );
    assert!(!source.stopped.load(Ordering::SeqCst));

    drop(stream);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !source.stopped.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the source is still watched"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_status_is_the_sources() {
    let (registry, source) = start(&[]).await;
    source.status.update(|s| {
        s.revision = Some(42);
        s.cluster_id = Some(7);
    });
    let status = registry.status();
    assert_eq!((status.revision, status.cluster_id), (Some(42), Some(7)));
    assert!(status.connected, "contact was made at start");
    assert!(status.since_last_contact().is_some());
}

#[tokio::test]
async fn a_source_that_cannot_be_read_does_not_start() {
    let source = Manual {
        first: Vec::new(),
        updates: Mutex::new(None),
        status: StatusHandle::new(),
        stopped: Arc::default(),
        fail: true,
    };
    let err = Registry::start_with(source, Layout::keys("/gray"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Source(_)), "{err}");
    assert_eq!(err.to_string(), "setting `endpoints`: nothing to read");
}

#[tokio::test]
async fn static_lists_and_names() {
    let instance = |id: &str, port: u16| support::instance(id, format!("127.0.0.1:{port}"), &[]);
    let registry = Registry::from_static([
        ("orders", vec![instance("b", 2), instance("a", 1)]),
        ("orders", vec![instance("a", 3)]),
        ("empty", vec![]),
    ])
    .unwrap();
    assert_eq!(registry.services(), ["orders"]);
    let orders = registry.service("orders").unwrap();
    // Sorted by id; a repeated id keeps the last one.
    assert_eq!(instances(&orders), ["a 127.0.0.1:3 {}", "b 127.0.0.1:2 {}"]);
    let mut stream = orders.discover();
    assert_eq!(
        take(&mut stream, 2).await,
        ["+a 127.0.0.1:3 {}", "+b 127.0.0.1:2 {}"]
    );
    assert_nothing_ready(&mut stream);
    assert!(registry.status().connected);

    let err = registry.service("a/b").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid service name `a/b`: it contains `/`"
    );
    let err = Registry::from_static([("", Vec::<Instance>::new())]).unwrap_err();
    assert_eq!(err.to_string(), "invalid service name ``: it is empty");
}
