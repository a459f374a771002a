//! A decoder written outside the crate ([`Decoder`]) driving a [`Registry`]: one key per
//! service whose value lists its instances, the way Consul and Nacos answer.

use std::{future::Future, pin::Pin, sync::Mutex, time::Duration};

use futures_util::StreamExt;
use gray_core::Labels;
use gray_discovery::{
    Error, Instance, InstanceId, Registry,
    registry::{Decoder, Effect},
    source::{Entry, Revision, Snapshot, Source, SourceError, StatusHandle, Update, Updates},
};
use tokio::sync::mpsc;
use tower::discover::Change;

/// How long a change may take to reach a subscriber (the registry's task applies it at
/// once; the bound is for a loaded machine).
const WAIT: Duration = Duration::from_secs(10);

/// `[{"id": "orders-1", "address": "127.0.0.1:8081", "tags": {"gray": "true"}}, ..]`
#[derive(serde::Deserialize)]
struct Listed {
    id: String,
    address: String,
    #[serde(default)]
    tags: Vec<(String, String)>,
}

/// Each key names a service; its value lists the service's instances.
#[derive(Debug)]
struct Catalogue;

impl Catalogue {
    fn parse(entry: &Entry) -> Result<Vec<Instance>, Error> {
        let listed: Vec<Listed> = serde_json::from_slice(&entry.value)
            .map_err(|e| Error::Parse(gray_discovery::error::ConfigError::new(&entry.key, e)))?;
        listed
            .into_iter()
            .map(|l| {
                let id = InstanceId::new(&l.id)?;
                let address = l.address.parse()?;
                Ok(Instance::new(id, address, Labels::from_iter(l.tags)))
            })
            .collect()
    }
}

impl Decoder for Catalogue {
    /// A first content that does not parse stops the registry from starting.
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        let mut services = Vec::new();
        for entry in &snapshot.entries {
            services.push((entry.key.clone(), Catalogue::parse(entry)?));
        }
        Ok(Effect::reset(services))
    }

    /// Later, a listing that does not parse changes nothing.
    fn apply(&self, update: Update) -> Effect {
        match update {
            Update::Reset(snapshot) => self.load(snapshot).unwrap_or(Effect::None),
            Update::Put(entry) => match Catalogue::parse(&entry) {
                Ok(instances) => Effect::replace(entry.key, instances),
                Err(_) => Effect::none(),
            },
            Update::Delete { key, .. } => Effect::replace(key, []),
            _ => Effect::none(),
        }
    }
}

/// A source whose updates the test sends by hand.
#[derive(Debug)]
struct Manual {
    first: Vec<Entry>,
    updates: Mutex<Option<mpsc::UnboundedReceiver<Update>>>,
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        revision: Revision::Manual(1),
    }
}

impl Source for Manual {
    fn describe(&self) -> String {
        "catalogue".to_owned()
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        let snapshot = Snapshot {
            entries: self.first.clone(),
            revision: Revision::Manual(1),
        };
        Box::pin(async move { Ok(snapshot) })
    }

    fn watch(&self) -> Updates {
        let rx = self.updates.lock().unwrap().take().expect("one watch");
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|update| (update, rx))
        });
        Updates::new(stream, StatusHandle::new())
    }
}

fn manual(first: &[(&str, &str)]) -> (Manual, mpsc::UnboundedSender<Update>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let source = Manual {
        first: first.iter().map(|(k, v)| entry(k, v)).collect(),
        updates: Mutex::new(Some(rx)),
    };
    (source, tx)
}

/// The next change a subscriber sees, as `+id labels` or `-id`.
async fn next(stream: &mut gray_discovery::InstanceDiscover) -> String {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Ok(Some(Ok(Change::Insert(id, instance)))) => {
            let labels: Vec<_> = instance
                .labels()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("+{id} {}", labels.join(","))
        }
        Ok(Some(Ok(Change::Remove(id)))) => format!("-{id}"),
        other => panic!("no change within {WAIT:?}: {other:?}"),
    }
}

const ORDERS: &str = r#"[{"id": "orders-1", "address": "127.0.0.1:8081"},
    {"id": "orders-2", "address": "127.0.0.1:8082", "tags": [["gray", "true"]]}]"#;

#[tokio::test]
async fn a_custom_decoder_drives_a_registry() {
    let (source, tx) = manual(&[("orders", ORDERS), ("stock", "[]")]);
    let registry = Registry::start_with(source, Catalogue)
        .await
        .expect("started");
    assert_eq!(registry.services(), ["orders"]);
    let orders = registry.service("orders").unwrap();
    let mut changes = orders.discover();
    assert_eq!(next(&mut changes).await, "+orders-1 ");
    assert_eq!(next(&mut changes).await, "+orders-2 gray=true");

    // One service listed again: only the difference reaches the subscriber.
    let relabelled = r#"[{"id": "orders-2", "address": "127.0.0.1:8082", "tags": [["lane", "blue"]]},
        {"id": "orders-3", "address": "127.0.0.1:8083"}]"#;
    tx.send(Update::Put(entry("orders", relabelled))).unwrap();
    let mut seen = vec![
        next(&mut changes).await,
        next(&mut changes).await,
        next(&mut changes).await,
    ];
    seen.sort();
    assert_eq!(seen, ["+orders-2 lane=blue", "+orders-3 ", "-orders-1"]);

    // A listing that does not parse changes nothing; the next good one applies.
    tx.send(Update::Put(entry("orders", "not json"))).unwrap();
    tx.send(Update::Put(entry(
        "stock",
        r#"[{"id": "stock-1", "address": "127.0.0.1:9001"}]"#,
    )))
    .unwrap();
    let stock = registry.service("stock").unwrap();
    let mut stock_changes = stock.discover();
    assert_eq!(next(&mut stock_changes).await, "+stock-1 ");
    assert_eq!(
        orders.instances().len(),
        2,
        "the bad listing changed nothing"
    );

    // A service deleted: its instances go; a reset replaces everything.
    tx.send(Update::Delete {
        key: "stock".to_owned(),
        revision: Revision::Manual(2),
    })
    .unwrap();
    assert_eq!(next(&mut stock_changes).await, "-stock-1");
    tx.send(Update::Reset(Snapshot {
        entries: vec![entry("orders", ORDERS)],
        revision: Revision::Manual(3),
    }))
    .unwrap();
    let mut seen = vec![
        next(&mut changes).await,
        next(&mut changes).await,
        next(&mut changes).await,
    ];
    seen.sort();
    assert_eq!(seen, ["+orders-1 ", "+orders-2 gray=true", "-orders-3"]);
}

#[tokio::test]
async fn a_first_content_the_decoder_rejects_stops_the_start() {
    let (source, _tx) = manual(&[("orders", r#"[{"id": "a/b", "address": "127.0.0.1:1"}]"#)]);
    let err = Registry::start_with(source, Catalogue).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid instance id `a/b`: it contains `/`"
    );
}

#[tokio::test]
async fn an_invalid_service_name_is_skipped() {
    /// Names every service `bad/name`, except `ok`.
    #[derive(Debug)]
    struct Renaming;

    impl Decoder for Renaming {
        fn apply(&self, update: Update) -> Effect {
            let Update::Put(entry) = update else {
                return Effect::none();
            };
            let listed = Catalogue::parse(&entry).unwrap_or_default();
            let service = if entry.key == "ok" { "ok" } else { "bad/name" };
            Effect::replace(service, listed)
        }
    }

    let (source, tx) = manual(&[]);
    // Any decoder behind a pointer is one too.
    let decoder: Box<dyn Decoder> = Box::new(Renaming);
    let registry = Registry::start_with(source, decoder)
        .await
        .expect("started");
    let ok = registry.service("ok").unwrap();
    let mut changes = ok.discover();
    tx.send(Update::Put(entry("x", ORDERS))).unwrap();
    tx.send(Update::Put(entry("ok", ORDERS))).unwrap();
    assert_eq!(next(&mut changes).await, "+orders-1 ");
    assert_eq!(registry.services(), ["ok"], "bad/name was skipped");
}

#[test]
fn effects_from_their_constructors() {
    let one = |id: &str| {
        Instance::new(
            id.parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
            Labels::new(),
        )
    };
    let Effect::Reset(all) =
        Effect::reset([("a", vec![one("1")]), ("a", vec![one("2")]), ("b", vec![])])
    else {
        panic!("a reset")
    };
    assert_eq!(all["a"].len(), 2, "a service named twice gets both lists");
    assert!(all["b"].is_empty());
    assert_eq!(
        Effect::put("a", one("1")),
        Effect::Put("a".to_owned(), one("1"))
    );
    assert_eq!(
        Effect::remove("a", "1".parse().unwrap()),
        Effect::Remove("a".to_owned(), "1".parse().unwrap())
    );
    assert_eq!(Effect::none(), Effect::None);
}
