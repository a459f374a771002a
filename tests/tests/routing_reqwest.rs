//! A reqwest chain A → B → C that routes by the stain, over a real etcd.
//!
//! `svc-b` and `svc-c` each run a baseline and a gray instance (axum servers on loopback
//! ports, behind `ExtractStainLayer`). The B instances register themselves with
//! `gray_discovery::etcd::Registrar`; the C instances are put by hand, as an operator does
//! with `etcdctl`. A and each B instance are processes of their own: each has its own
//! `Registry` on the etcd prefix, one `Balance` for the service it calls, and a reqwest
//! client with `PropagateMiddleware` + `RouteMiddleware` that sends `http://svc-b/…` (or
//! `http://svc-c/…`) to an instance picked by the stain. Every instance answers with its
//! id and the lane it saw, after the answer of the next hop: the reply is the whole path.

use axum::{Router, extract::State, http::StatusCode, routing::get};
use gray_balance::{Balance, BalanceLayer, reqwest::RouteMiddleware};
use gray_discovery::{
    Instance, InstanceId, Registry,
    etcd::{Registrar, Registration},
    source::etcd::{EtcdConfig, EtcdSource},
};
use gray_policy::Policy;
use gray_test_support::{WAIT, etcd::Etcd};
use gray_tests::{Server, route::current_lane, serve, until};
use gray_tower::{
    ExtractStainLayer,
    reqwest::{ClientBuilder, ClientWithMiddleware, PropagateMiddleware},
};
use tokio::task::JoinSet;

const PREFIX: &str = "/gray";

/// A balancer over the instances of one service, found in etcd.
type Instances = Balance<InstanceId, Instance>;

/// One instance of the chain: `id:lane`, then what the next hop answered, if it calls one.
#[derive(Clone)]
struct Hop {
    id: &'static str,
    next: Option<(ClientWithMiddleware, &'static str)>,
}

async fn hop(State(hop): State<Hop>) -> Result<String, (StatusCode, String)> {
    let me = format!("{}:{}", hop.id, current_lane());
    let Some((client, url)) = &hop.next else {
        return Ok(me);
    };
    // No stain is passed by hand: the middlewares read the task-local one.
    let bad_gateway = |e: reqwest_middleware::Error| (StatusCode::BAD_GATEWAY, e.to_string());
    let res = client.get(*url).send().await.map_err(bad_gateway)?;
    let status = res.status();
    let body = res.text().await.map_err(|e| bad_gateway(e.into()))?;
    if !status.is_success() {
        return Err((status, body));
    }
    Ok(format!("{me} {body}"))
}

async fn start(state: Hop) -> Server {
    let app = Router::new()
        .route("/hop", get(hop))
        .with_state(state)
        .layer(ExtractStainLayer::new());
    serve(app).await
}

fn config(etcd: &Etcd) -> EtcdConfig {
    EtcdConfig::new([etcd.endpoint()])
}

/// What one process routes `service` with: its own registry on the etcd prefix, a
/// balancer, and a reqwest client that sends `http://<service>/…` to a picked instance.
async fn client_to(etcd: &Etcd, service: &str) -> (ClientWithMiddleware, Instances) {
    let source = EtcdSource::prefix(config(etcd), format!("{PREFIX}/"));
    let registry = Registry::start(source).await.expect("the registry starts");
    let instances = registry.service(service).expect("a valid name").discover();
    // No fallback: a request no instance of its lane can serve fails, it never misroutes.
    let balance = BalanceLayer::new(service, Policy::new()).build(instances);
    let client = ClientBuilder::new(gray_tests::reqwest_client())
        .with(PropagateMiddleware::new())
        .with(RouteMiddleware::new().route(service, balance.clone()))
        .build();
    (client, balance)
}

/// The chain, running; everything stops when it is dropped.
struct Chain {
    a: Server,
    _servers: Vec<Server>,
    _registrations: Vec<Registration>,
    _etcd: Etcd,
}

async fn chain() -> Chain {
    let etcd = Etcd::start().await;

    // C: two instances, put by hand (`etcdctl put /gray/svc-c/c-gray '{…}'`).
    let c_base = start(Hop {
        id: "c-base",
        next: None,
    })
    .await;
    let c_gray = start(Hop {
        id: "c-gray",
        next: None,
    })
    .await;
    let records = [
        ("c-base", &c_base, ""),
        ("c-gray", &c_gray, r#", "labels": {"lane": "gray"}"#),
    ];
    for (id, server, labels) in records {
        let record = format!(r#"{{"address": "{}"{labels}}}"#, server.addr());
        etcd.put(&format!("{PREFIX}/svc-c/{id}"), record).await;
    }

    // B: two instances, each its own process with its own registry; they register
    // themselves under a lease.
    let registrar = Registrar::new(config(&etcd), PREFIX);
    let mut servers = vec![c_base, c_gray];
    let mut registrations = Vec::new();
    let mut to_c = Vec::new();
    for (id, labels) in [("b-base", &[][..]), ("b-gray", &[("gray", "true")][..])] {
        let (client, balance) = client_to(&etcd, "svc-c").await;
        let b = start(Hop {
            id,
            next: Some((client, "http://svc-c/hop")),
        })
        .await;
        let registration = registrar
            .register("svc-b", &b.instance(id, labels))
            .await
            .expect("B registers itself");
        servers.push(b);
        registrations.push(registration);
        to_c.push(balance);
    }

    // A: the entry, which calls B.
    let (client, to_b) = client_to(&etcd, "svc-b").await;
    let a = start(Hop {
        id: "a",
        next: Some((client, "http://svc-b/hop")),
    })
    .await;

    for balance in to_c.iter().chain([&to_b]) {
        let what = format!("{} in the balancer", balance.service_name());
        until(WAIT, &what, || balance.len() == 2).await;
    }
    Chain {
        a,
        _servers: servers,
        _registrations: registrations,
        _etcd: etcd,
    }
}

/// Sends one request to A (stained with `lane` when given); returns its status and body.
async fn send(client: &reqwest::Client, a: &Server, lane: Option<&str>) -> (u16, String) {
    let mut req = client.get(a.url("/hop"));
    if let Some(lane) = lane {
        req = req.header("x-gray-lane", lane);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status().as_u16();
            (status, res.text().await.unwrap_or_else(|e| e.to_string()))
        }
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stained_requests_reach_only_gray_instances_and_unstained_only_baseline() {
    const REQUESTS: usize = 2_000;
    const IN_FLIGHT: usize = 64;

    let chain = chain().await;
    let client = gray_tests::reqwest_client();
    let gray = "a:gray b-gray:gray c-gray:gray";
    let baseline = "a: b-base: c-base:";
    assert_eq!(
        send(&client, &chain.a, Some("gray")).await,
        (200, gray.into())
    );
    assert_eq!(send(&client, &chain.a, None).await, (200, baseline.into()));

    // 2,000 mixed requests, 64 at a time: every one takes exactly the path of its stain.
    let a = std::sync::Arc::new(chain.a);
    let mut requests = JoinSet::new();
    let mut misroutes = Vec::new();
    for i in 0..REQUESTS {
        if requests.len() == IN_FLIGHT {
            misroutes.extend(
                requests
                    .join_next()
                    .await
                    .expect("a request")
                    .expect("joined"),
            );
        }
        let (client, a) = (client.clone(), a.clone());
        requests.spawn(async move {
            let stained = i % 2 == 0;
            let got = send(&client, &a, stained.then_some("gray")).await;
            let expected = if stained { gray } else { baseline };
            (got != (200, expected.to_owned())).then_some((i, got))
        });
    }
    while let Some(joined) = requests.join_next().await {
        misroutes.extend(joined.expect("joined"));
    }
    assert!(
        misroutes.is_empty(),
        "{} of {REQUESTS} requests went astray, the first ones: {:?}",
        misroutes.len(),
        &misroutes[..misroutes.len().min(5)]
    );

    // A lane no instance of B serves fails at A, before anything is sent, and says why.
    let (status, body) = send(&client, &a, Some("blue")).await;
    assert_eq!(
        (status, body.as_str()),
        (
            502,
            "no instance of `svc-b` fits lane `blue` (policy `default`, fallback `none`)"
        )
    );
}
