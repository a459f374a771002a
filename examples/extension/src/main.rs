//! Run with: cargo run -p example-extension
//!
//! gray extended from outside its crates, through their public API only, at the three
//! points a new deployment usually needs:
//!
//! - **an instance source**: `ConsulSource` polls a Consul-style HTTP catalogue
//!   (`GET /v1/health/service/<name>`, served here by a small axum server on loopback) and
//!   hands out one entry per service (`gray_source::Source`); `ConsulDecoder` turns each
//!   listing into instances (`gray_discovery::Decoder`); `Registry::start_with` joins them;
//! - **a carrier**: `x-canary: <lane>@<signature>` (`gray_core::codec::CustomCarrier`),
//!   read by `ExtractStainLayer`, written by `PropagateStainLayer` and the edge, and
//!   stripped by the edge from untrusted clients;
//! - **a pick strategy**: `LowestRank`, the ready instance with the lowest `rank` label
//!   (`gray_balance::Strategy`).
//!
//! It starts the catalogue, four instances of `stock` (three registered) and an edge in
//! front of them, sends requests through the edge, changes the catalogue (an instance
//! relabelled, removed, added) and checks every answer. A failed check exits non-zero.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    extract::{Path, State},
    response::IntoResponse,
    routing::get,
};
use bytes::Bytes;
use gray_balance::{
    BalanceLayer,
    strategy::{Candidates, Load, Strategy},
};
use gray_core::{
    Carriers, Labels, Names, Stain,
    codec::{Carrier, CustomCarrier, Decoded, Reason, Rejection},
    hash::keyed_hash,
    rand::Rng,
};
use gray_discovery::{
    Error, Instance, Registry,
    error::ConfigError,
    http::HttpEndpoints,
    registry::{Decoder, Effect},
};
use gray_policy::Policy;
use gray_rules::{Format, RuleSet};
use gray_source::{Entry, Revision, Snapshot, Source, SourceError, StatusHandle, Update, Updates};
use gray_tower::{EdgeLayer, ExtractStainLayer, PropagateStainLayer};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Empty};
use tokio::net::TcpListener;
use tower::{Layer, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// === The carrier: `x-canary: <lane>@<signature>` ===

static X_CANARY: HeaderName = HeaderName::from_static("x-canary");
/// The key lanes are signed with (a stand-in for an HMAC key the services share).
const KEY: &[u8] = b"example-extension";

fn signature(lane: &str) -> u64 {
    keyed_hash(KEY, lane.as_bytes())
}

/// A lane with its signature; anything else is rejected (the request is unstained).
#[derive(Debug)]
struct SignedCanary;

impl CustomCarrier for SignedCanary {
    fn header_name(&self) -> &HeaderName {
        &X_CANARY
    }

    fn decode(&self, headers: &HeaderMap, names: &Names) -> Result<Option<Decoded>, Rejection> {
        let Some(value) = headers.get(&X_CANARY) else {
            return Ok(None);
        };
        let reject = |why: &'static str| Rejection::new(&X_CANARY, Reason::Other(why.into()));
        let text = value
            .to_str()
            .map_err(|_| reject("its value is not text"))?;
        let (lane, sig) = text
            .split_once('@')
            .ok_or_else(|| reject("its value is not <lane>@<signature>"))?;
        let lane = names
            .lane(lane.as_bytes())
            .map_err(|e| Rejection::new(&X_CANARY, Reason::InvalidName(e)))?;
        if u64::from_str_radix(sig, 16).ok() != Some(signature(lane.as_str())) {
            return Err(reject("its signature does not match"));
        }
        Ok(Some(Decoded::Lane(lane)))
    }

    fn encode(&self, stain: &Stain, headers: &mut HeaderMap) {
        let value = stain.lane().and_then(|lane| {
            HeaderValue::try_from(format!("{lane}@{:016x}", signature(lane.as_str()))).ok()
        });
        match value {
            Some(value) => headers.insert(&X_CANARY, value),
            None => headers.remove(&X_CANARY),
        };
    }
}

/// Every layer here reads and writes this one carrier, and no other.
fn carriers() -> Carriers {
    Carriers::new().with(Carrier::custom(SignedCanary))
}

// === The strategy: the lowest `rank` label wins ===

/// The ready instance with the lowest `rank` label (unranked last; ties: fewest requests
/// in flight). New instances get no probe requests: the rank alone decides.
#[derive(Debug)]
struct LowestRank;

impl Strategy for LowestRank {
    fn choose(&self, candidates: &Candidates<'_>, _: &mut Rng) -> usize {
        let rank = |load: &Load<'_>| load.labels().get("rank")?.parse::<u32>().ok();
        let key = |load: Load<'_>| (rank(&load).unwrap_or(u32::MAX), load.in_flight());
        let keyed = (0..candidates.len()).filter_map(|i| Some((key(candidates.get(i)?), i)));
        keyed.min().map_or(0, |(_, i)| i)
    }

    fn probes(&self) -> bool {
        false
    }
}

// === The catalogue: a Consul-style HTTP API on loopback ===

/// The instances of `stock` by id (port, `Meta` labels), and Consul's change index.
#[derive(Clone, Default)]
struct Catalog(Arc<Mutex<(u64, BTreeMap<&'static str, (u16, Meta)>)>>);

type Meta = &'static [(&'static str, &'static str)];

impl Catalog {
    /// Registers (`Some`) or deregisters (`None`) an instance, as an operator or an agent
    /// would.
    fn set(&self, id: &'static str, registration: Option<(u16, Meta)>) {
        let mut state = self.0.lock().expect("catalogue");
        state.0 += 1;
        match registration {
            Some(registration) => state.1.insert(id, registration),
            None => state.1.remove(id),
        };
    }
}

/// `GET /v1/health/service/<name>`, in Consul's shape, with its `X-Consul-Index`.
async fn health(State(catalog): State<Catalog>, Path(name): Path<String>) -> impl IntoResponse {
    let state = catalog.0.lock().expect("catalogue");
    let listed = (state.1.iter().filter(|_| name == "stock")).map(|(id, (port, meta))| {
        let meta: BTreeMap<_, _> = meta.iter().copied().collect();
        serde_json::json!({
            "Node": { "Node": "node-1", "Address": "127.0.0.1" },
            "Service": { "ID": id, "Service": name, "Address": "127.0.0.1", "Port": port, "Meta": meta },
            "Checks": [{ "Status": "passing" }],
        })
    });
    let index = [("x-consul-index", state.0.to_string())];
    (index, Json(listed.collect::<Vec<_>>()))
}

// === The source: polls one service's listing ===

/// The listing of `service`, polled every `interval`: one entry, keyed by the service
/// name, holding the catalogue's JSON. (A production Consul source would use blocking
/// queries on `X-Consul-Index` instead of a fixed interval, and list services too.)
#[derive(Debug, Clone)]
struct ConsulSource {
    url: String,
    service: String,
    client: reqwest::Client,
    interval: Duration,
}

impl ConsulSource {
    async fn read(&self) -> Result<Snapshot, SourceError> {
        let failed = |e| SourceError::other(format!("GET {}", self.url), e);
        let get = self.client.get(&self.url).send().await;
        let res = get.and_then(|r| r.error_for_status()).map_err(failed)?;
        let index = res.headers().get("x-consul-index");
        let index = index
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        let (key, revision) = (self.service.clone(), Revision::Manual(index));
        let value = res.bytes().await.map_err(failed)?.to_vec();
        let entries = vec![Entry {
            key,
            value,
            revision: revision.clone(),
        }];
        Ok(Snapshot { entries, revision })
    }
}

impl Source for ConsulSource {
    fn describe(&self) -> String {
        format!("consul catalogue {}", self.url)
    }

    fn load(&self) -> Pin<Box<dyn Future<Output = Result<Snapshot, SourceError>> + Send + '_>> {
        Box::pin(self.read())
    }

    /// The listing first, then a `Put` each time it changes. Failures are recorded in the
    /// status and retried at the next poll.
    fn watch(&self) -> Updates {
        let status = StatusHandle::new();
        let poll = (self.clone(), status.clone(), None::<Vec<u8>>);
        let updates = futures_util::stream::unfold(poll, |mut poll| async move {
            let (source, status, seen) = &mut poll;
            loop {
                if seen.is_some() || status.get().failures > 0 {
                    tokio::time::sleep(source.interval).await;
                }
                let mut snapshot = match source.read().await {
                    Ok(snapshot) => snapshot,
                    Err(e) => {
                        status.failure(&e);
                        continue;
                    }
                };
                status.contact(None);
                let value = &snapshot.entries[0].value;
                let update = match seen.replace(value.clone()) {
                    None => Update::Reset(snapshot),
                    Some(before) if before != *value => Update::Put(snapshot.entries.remove(0)),
                    Some(_) => continue,
                };
                return Some((update, poll));
            }
        });
        Updates::new(updates, status)
    }
}

// === The decoder: a listing becomes the service's instances ===

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Listed {
    service: ListedService,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListedService {
    #[serde(rename = "ID")]
    id: String,
    address: String,
    port: u16,
    #[serde(default)]
    meta: BTreeMap<String, String>,
}

/// Reads Consul's listings: `Service.ID`, `Address:Port`, and `Meta` as the labels.
#[derive(Debug)]
struct ConsulDecoder;

impl ConsulDecoder {
    fn instances(entry: &Entry) -> Result<Vec<Instance>, Error> {
        let listed: Vec<Listed> = serde_json::from_slice(&entry.value)
            .map_err(|e| ConfigError::new(&entry.key, format_args!("not a listing: {e}")))?;
        (listed.into_iter())
            .map(|Listed { service: s }| {
                let address = format!("{}:{}", s.address, s.port).parse()?;
                Ok(Instance::new(
                    s.id.parse()?,
                    address,
                    Labels::from_iter(s.meta),
                ))
            })
            .collect()
    }
}

impl Decoder for ConsulDecoder {
    fn load(&self, snapshot: Snapshot) -> Result<Effect, Error> {
        let services = (snapshot.entries.iter())
            .map(|e| Ok((e.key.clone(), ConsulDecoder::instances(e)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Effect::reset(services))
    }

    /// A listing that does not decode changes nothing (and says why).
    fn apply(&self, update: Update) -> Effect {
        let decoded = match update {
            Update::Reset(snapshot) => self.load(snapshot),
            Update::Put(entry) => ConsulDecoder::instances(&entry)
                .map(|instances| Effect::replace(entry.key, instances)),
            Update::Delete { key, .. } => Ok(Effect::replace(key, [])),
            _ => Ok(Effect::none()),
        };
        decoded.unwrap_or_else(|e| {
            eprintln!("catalogue listing ignored: {e}");
            Effect::none()
        })
    }
}

// === The services ===

async fn serve(app: Router) -> Result<u16, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// An instance of `stock`: its id and the lane it was called in, which only the custom
/// carrier can have brought.
async fn stock(id: &'static str) -> Result<u16, BoxError> {
    let items = move || async move {
        let stain = gray_tower::current().unwrap_or_default();
        format!(
            "{id} lane={}",
            stain.lane().map_or("baseline", |l| l.as_str())
        )
    };
    let app = Router::new().route("/items", get(items));
    serve(app.layer(ExtractStainLayer::new().with_carriers(carriers()))).await
}

/// The edge: rules stain, the handler calls `stock` through the strategy's balancer.
async fn edge(registry: &Registry) -> Result<(u16, EdgeLayer), BoxError> {
    let endpoints = registry.service("stock")?.endpoints(HttpEndpoints::new());
    let balance = BalanceLayer::new("stock", Policy::new()).with_strategy(LowestRank);
    let client = ServiceBuilder::new()
        .layer(PropagateStainLayer::new().with_carriers(carriers()))
        .service(balance.build(endpoints));
    let call_stock = move || async move {
        let req = Request::get("/items")
            .body(Empty::<Bytes>::new())
            .expect("request");
        match client.oneshot(req).await {
            Ok(res) => match res.into_body().collect().await {
                Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        }
    };
    let rules = r#"{"rules": [{"name": "beta testers", "lane": "gray",
        "when": {"header": {"name": "x-beta", "exact": "1"}}}]}"#;
    let rules = RuleSet::parse(rules, Format::Json, "rules.json")?;
    // No trusted clients: every client's x-canary is stripped before anything reads it.
    let layer = EdgeLayer::new(rules).with_carriers(carriers());
    // The edge wraps the router: it runs before routing (gray-tower's edge docs).
    let app =
        Router::new().fallback_service(layer.layer(Router::new().route("/stock", get(call_stock))));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((port, layer))
}

/// `GET http://127.0.0.1:<port><path>` with `headers`; the answer's text.
async fn ask(http: &reqwest::Client, port: u16, path: &str, headers: &[(&str, &str)]) -> String {
    let mut req = http.get(format!("http://127.0.0.1:{port}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    match req.send().await {
        Ok(res) => res.text().await.unwrap_or_else(|e| format!("error: {e}")),
        Err(e) => format!("error: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let http = &reqwest::Client::builder().no_proxy().build()?;
    let [one, two, three, canary] = [
        stock("stock-1").await?,
        stock("stock-2").await?,
        stock("stock-3").await?,
        stock("stock-gray").await?,
    ];
    let catalog = Catalog::default();
    catalog.set("stock-1", Some((one, &[("rank", "2")])));
    catalog.set("stock-2", Some((two, &[("rank", "1")])));
    catalog.set(
        "stock-gray",
        Some((canary, &[("rank", "1"), ("lane", "gray")])),
    );
    let api = Router::new().route("/v1/health/service/{name}", get(health));
    let api = serve(api.with_state(catalog.clone())).await?;

    // (a) The source and its decoder, joined by a registry the balancer follows.
    let source = ConsulSource {
        url: format!("http://127.0.0.1:{api}/v1/health/service/stock"),
        service: "stock".to_owned(),
        client: http.clone(),
        interval: Duration::from_millis(50),
    };
    let registry = Registry::start_with(source, ConsulDecoder).await?;
    let instances = registry.service("stock")?.instances();
    let listed: Vec<_> = instances.iter().map(|i| i.id().as_str()).collect();
    println!("registry                   -> {listed:?}");
    assert_eq!(listed, ["stock-1", "stock-2", "stock-gray"]);
    let (edge, layer) = edge(&registry).await?;
    let through_edge =
        move |headers: &'static [(&'static str, &'static str)]| ask(http, edge, "/stock", headers);

    // (c) The strategy decides: every baseline request goes to the lowest rank.
    for _ in 0..10 {
        assert_eq!(through_edge(&[]).await, "stock-2 lane=baseline");
    }
    println!("baseline x10               -> stock-2 (rank 1) every time");

    // (b) A rule stains the request at the edge; PropagateStainLayer writes the stain as
    // x-canary; the instance's ExtractStainLayer reads it back.
    let beta = through_edge(&[("x-beta", "1")]).await;
    println!("x-beta: 1                  -> {beta}");
    assert_eq!(beta, "stock-gray lane=gray");

    // (d) A client that forges a well-signed x-canary: the edge strips it, by construction.
    let forged = &format!("gray@{:016x}", signature("gray"));
    assert!(layer.stripped_headers().contains(&X_CANARY));
    let answer = ask(http, edge, "/stock", &[("x-canary", forged)]).await;
    println!("forged x-canary at edge    -> {answer}");
    assert_eq!(answer, "stock-2 lane=baseline");
    // ... which a service that trusts its callers would have honoured; a bad signature not.
    let direct = ask(http, canary, "/items", &[("x-canary", forged)]).await;
    assert_eq!(direct, "stock-gray lane=gray");
    let bad = [("x-canary", "gray@0123456789abcdef")];
    let tampered = ask(http, canary, "/items", &bad).await;
    assert_eq!(tampered, "stock-gray lane=baseline");
    println!("forged x-canary inside     -> {direct}; tampered: {tampered}");

    // (a) The catalogue changes; the balancer follows, and the strategy chooses anew.
    let expect = |what: &'static str, winner: &'static str| async move {
        let expected = format!("{winner} lane=baseline");
        // Polled every 20 ms, for at most 10 s.
        for polls in 0.. {
            match through_edge(&[]).await == expected {
                true => break,
                false if polls == 500 => return Err(format!("{what}: not followed in 10 s")),
                false => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        for _ in 0..5 {
            assert_eq!(through_edge(&[]).await, expected, "after: {what}");
        }
        println!("{what:<27}-> {winner} every time");
        Ok(())
    };
    catalog.set("stock-1", Some((one, &[("rank", "0")])));
    expect("stock-1 relabelled rank 0", "stock-1").await?;
    catalog.set("stock-1", None);
    expect("stock-1 removed", "stock-2").await?;
    catalog.set("stock-3", Some((three, &[("rank", "0")])));
    expect("stock-3 added with rank 0", "stock-3").await?;
    assert_eq!(
        through_edge(&[("x-beta", "1")]).await,
        "stock-gray lane=gray"
    );
    println!("all checks passed");
    Ok(())
}
