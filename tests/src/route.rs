//! A service `d` with a baseline and a gray instance on loopback ports, and a client that
//! routes to them by the stain: gray-balance over gray-discovery's HTTP endpoints, behind
//! `CaptureStainLayer` and `PropagateStainLayer`, as a deployment builds it.

use std::collections::HashMap;

use axum::{Router, extract::State, http::HeaderMap, routing::get};
use bytes::Bytes;
use gray_balance::BalanceLayer;
use gray_core::{Carriers, Labels, Stain};
use gray_discovery::{Instance, StaticDiscover, http::HttpEndpoints};
use gray_policy::{Fallback, Policy};
use gray_tower::{CaptureStainLayer, ExtractStainLayer, PropagateStainLayer};
use http::Request;
use http_body_util::{BodyExt, Empty};
use tower::{BoxError, ServiceBuilder, ServiceExt, buffer::Buffer, util::BoxCloneSyncService};

use crate::{Server, serve};

/// The baseline and the gray instance of `d`; stopped when dropped.
#[derive(Debug)]
pub struct Instances {
    /// `d-base`, unlabelled.
    pub base: Server,
    /// `d-gray`, labelled `lane=gray`.
    pub gray: Server,
}

/// A client of `d` that routes by the stain.
pub type RoutedClient = BoxCloneSyncService<Request<Empty<Bytes>>, Lines, BoxError>;

/// `key=value` lines, as the test services answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lines(pub HashMap<String, String>);

impl Lines {
    /// Parses `key=value` lines (the value runs to the end of the line).
    #[must_use]
    pub fn parse(body: &str) -> Lines {
        Lines(
            body.lines()
                .filter_map(|line| line.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The value of `key`; `""` when absent.
    pub fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Every line, each key prefixed with `prefix`, in a `key=value` body.
    #[must_use]
    pub fn prefixed(&self, prefix: &str) -> String {
        let mut lines: Vec<_> = self
            .0
            .iter()
            .map(|(k, v)| format!("{prefix}{k}={v}\n"))
            .collect();
        lines.sort();
        lines.concat()
    }
}

/// The lane of the current stain (task-local), `""` for baseline.
#[must_use]
pub fn current_lane() -> String {
    gray_tower::current()
        .and_then(|s| s.lane().map(ToString::to_string))
        .unwrap_or_default()
}

async fn instance(
    State(id): State<&'static str>,
    stain: Option<axum::Extension<Stain>>,
    headers: HeaderMap,
) -> String {
    let inherited = stain
        .and_then(|axum::Extension(s)| s.baggage().map(|b| b.as_str().to_owned()))
        .unwrap_or_default();
    let baggage = headers
        .get_all("baggage")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "id={id}\nlane={}\ninherited={inherited}\nbaggage={baggage}\n",
        current_lane()
    )
}

/// Starts both instances of `d`, each reading `carriers`.
pub async fn instances(carriers: &Carriers) -> Instances {
    let app = |id: &'static str| {
        Router::new()
            .route("/", get(instance))
            .with_state(id)
            .layer(ExtractStainLayer::new().with_carriers(carriers.clone()))
    };
    Instances {
        base: serve(app("d-base")).await,
        gray: serve(app("d-gray")).await,
    }
}

/// A client of `d` routing by the stain; with `capture`, `CaptureStainLayer` hands the
/// caller's stain to the balancer in the buffer's worker task (else only the stain
/// `PropagateStainLayer` puts into the extensions reaches it).
#[must_use]
pub fn routed_client(d: &Instances, carriers: &Carriers, capture: bool) -> RoutedClient {
    let instance = |id: &str, server: &Server, labels: Labels| {
        Instance::new(
            id.parse().expect("instance id"),
            server.addr().to_string().parse().expect("instance address"),
            labels,
        )
    };
    let discover = StaticDiscover::new([
        instance("d-base", &d.base, Labels::new()),
        instance("d-gray", &d.gray, Labels::from_iter([("lane", "gray")])),
    ]);
    let endpoints = HttpEndpoints::<_, Empty<Bytes>>::new().discover(discover);
    let policy = Policy::new().with_fallback(Fallback::Baseline);
    let balance = Buffer::new(BalanceLayer::new("d", policy).build(endpoints), 256);
    let propagate = PropagateStainLayer::new().with_carriers(carriers.clone());
    let read = |res: http::Response<gray_discovery::http::ResponseBody>| async move {
        let body = res.into_body().collect().await?.to_bytes();
        Ok::<_, BoxError>(Lines::parse(&String::from_utf8_lossy(&body)))
    };
    if capture {
        let client = ServiceBuilder::new()
            .layer(CaptureStainLayer::new().with_carriers(carriers.clone()))
            .layer(propagate)
            .service(balance)
            .and_then(read);
        BoxCloneSyncService::new(client)
    } else {
        let client = ServiceBuilder::new()
            .layer(propagate)
            .service(balance)
            .and_then(read);
        BoxCloneSyncService::new(client)
    }
}

/// `GET /` for the routed client.
#[must_use]
pub fn get_root() -> Request<Empty<Bytes>> {
    Request::get("/")
        .body(Empty::new())
        .expect("a valid request")
}
