//! A tonic chain A → B → C that routes by the stain over gRPC (HTTP/2), over live
//! discovery: the instances change while calls flow, and every call goes where the
//! instances say at that moment.
//!
//! `svc-b` runs a baseline and a gray instance, listed in an instance file that A's
//! registry polls; `svc-c` runs its instances in a real etcd, which each B instance's own
//! registry watches. Every instance is a tonic server on a loopback port, behind
//! `ExtractStainLayer`. A and each B instance call the next service through the generated
//! `HopClient` over a shared `gray_balance::Balance` of per-instance tonic channels
//! (`gray_discovery::grpc::GrpcChannels`), behind `PropagateStainLayer`. No adapter sits
//! between tonic's client and the balancer: `Balance<_, Endpoint<Channel>>` is a
//! `GrpcService` as it is (checked below at compile time). The one addition is in the
//! handler: tonic reports any client error as `Unknown`, so a call the balancer could not
//! route (its `Unroutable`, the status' source) is answered as `Unavailable`.
//!
//! Mid-test, a gray C instance is added, a C instance is relabelled from gray to baseline,
//! and the gray B instance is removed from the file. While each change spreads, calls keep
//! flowing and may only reach what either the old or the new instances allow; once every
//! balancer shows it, a burst of calls must follow the new instances exactly, with zero
//! misroutes.

use std::{collections::BTreeMap, net::SocketAddr, path::Path, time::Duration};

use gray_balance::{Balance, BalanceLayer, error::Unroutable};
use gray_core::{Lane, Stain};
use gray_discovery::{
    Endpoint, InstanceId, Registry,
    grpc::GrpcChannels,
    source::{
        etcd::{EtcdConfig, EtcdSource},
        file::FileSource,
    },
};
use gray_policy::Policy;
use gray_test_support::{TempDir, WAIT, etcd::Etcd};
use gray_tests::{
    Server,
    proto::{HopReply, HopRequest, hop_client::HopClient, hop_server::Hop},
    route::current_lane,
    serve_hop, until, write_instances,
};
use gray_tower::{PropagateStain, PropagateStainLayer};
use tokio::task::JoinSet;
use tonic::{Code, Request, Response, Status, metadata::MetadataValue, transport::Channel};
use tower::ServiceBuilder;

/// The balancer of one service's channels.
type Channels = Balance<InstanceId, Endpoint<Channel>>;

/// A generated client over the balancer; the stain is written outside it, in the
/// caller's task.
type Routed = HopClient<PropagateStain<Channels>>;

/// tonic's generated clients take any `GrpcService`: the balancer is one, as it is.
const _: () = {
    fn grpc_service<T: tonic::client::GrpcService<tonic::body::Body>>() {}
    let _ = grpc_service::<Channels>;
};

/// `Unavailable` for a call no instance could take, naming the service, the lane and the
/// policy; any other status as it is.
fn unavailable(status: Status) -> Status {
    let source = std::error::Error::source(&status);
    match source.and_then(|e| e.downcast_ref::<Unroutable>()) {
        Some(unroutable) => Status::unavailable(unroutable.to_string()),
        None => status,
    }
}

/// A client of `service` that routes by the stain over `registry`'s instances, and its
/// balancer (to see what it holds).
fn routed(registry: &Registry, service: &str) -> (Routed, Channels) {
    let channels = GrpcChannels::new().with_endpoint(|e| e.timeout(Duration::from_secs(30)));
    let endpoints = registry
        .service(service)
        .expect("a name")
        .endpoints(channels);
    // No fallback: a call no instance of its lane can serve fails, it never misroutes.
    let balance = BalanceLayer::new(service, Policy::new()).build(endpoints);
    let client = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(balance.clone());
    (HopClient::new(client), balance)
}

/// One instance of the chain: adds `id:lane` to the trail, then calls the next service.
struct Node {
    id: &'static str,
    next: Option<Routed>,
}

#[tonic::async_trait]
impl Hop for Node {
    async fn call(&self, request: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        let me = format!("{}:{}", self.id, current_lane());
        let Some(next) = &self.next else {
            return Ok(Response::new(HopReply {
                lane: current_lane(),
                route: String::new(),
                trail: vec![me],
            }));
        };
        // A fresh outbound request: the stain comes from the task-local, through the layer.
        let path = request.into_inner().path;
        let reply = next.clone().call(HopRequest { path }).await;
        let mut reply = reply.map_err(unavailable)?.into_inner();
        reply.trail.insert(0, me);
        Ok(Response::new(reply))
    }
}

/// The etcd record of a C instance at `addr`, gray or not.
fn record(addr: SocketAddr, gray: bool) -> String {
    let labels = if gray { r#"{"gray": "true"}"# } else { "{}" };
    format!(r#"{{"address": "{addr}", "labels": {labels}}}"#)
}

/// The key of C instance `id`.
fn key(id: &str) -> String {
    format!("/gray/svc-c/{id}")
}

/// The chain, running; everything stops when it is dropped.
struct Chain {
    a: Server,
    /// The C instances, by id (`c-gray-2` is not registered at first).
    c: BTreeMap<&'static str, Server>,
    /// A's balancer over B, and each B instance's balancer over C.
    to_b: Channels,
    to_c: Vec<Channels>,
    b: Vec<Server>,
    instances: std::path::PathBuf,
    etcd: Etcd,
    _dir: TempDir,
}

async fn chain() -> Chain {
    let etcd = Etcd::start().await;
    let mut c = BTreeMap::new();
    for id in ["c-base", "c-gray", "c-gray-2"] {
        c.insert(id, serve_hop(Node { id, next: None }).await);
    }
    // C, put by hand (`etcdctl put /gray/svc-c/c-gray '{…}'`).
    etcd.put(&key("c-base"), record(c["c-base"].addr(), false))
        .await;
    etcd.put(&key("c-gray"), record(c["c-gray"].addr(), true))
        .await;

    // B: each instance its own process, with its own registry on the etcd prefix.
    let mut b = Vec::new();
    let mut to_c = Vec::new();
    for id in ["b-base", "b-gray"] {
        let source = EtcdSource::prefix(EtcdConfig::new([etcd.endpoint()]), "/gray/");
        let registry = Registry::start(source).await.expect("B's registry starts");
        let (client, balance) = routed(&registry, "svc-c");
        b.push(
            serve_hop(Node {
                id,
                next: Some(client),
            })
            .await,
        );
        to_c.push(balance);
    }

    // A: the entry, whose registry polls the instance file of B.
    let dir = TempDir::new("routing-grpc");
    let instances = dir.path().join("instances.toml");
    write_b(&instances, &b, true);
    let source = FileSource::new(&instances).with_interval(Duration::from_millis(20));
    let registry = Registry::start(source).await.expect("A's registry starts");
    let (client, to_b) = routed(&registry, "svc-b");
    let a = serve_hop(Node {
        id: "a",
        next: Some(client),
    })
    .await;

    let chain = Chain {
        a,
        c,
        to_b,
        to_c,
        b,
        instances,
        etcd,
        _dir: dir,
    };
    chain
        .converge(
            "the first instances",
            &["b-base"],
            &["b-gray"],
            &["c-base"],
            &["c-gray"],
        )
        .await;
    chain
}

/// Lists the B instances in the file: b-base, and b-gray when `gray` is set.
fn write_b(path: &Path, b: &[Server], gray: bool) {
    let mut listed = vec![("b-base", b[0].addr(), false)];
    if gray {
        listed.push(("b-gray", b[1].addr(), true));
    }
    write_instances(path, "svc-b", &listed);
}

/// The ids `balance` would route a request with `stain` to, sorted; empty when none.
fn candidates(balance: &Channels, stain: Option<&Stain>) -> Vec<String> {
    let decision = balance.explain(stain);
    let mut ids: Vec<String> = decision
        .candidates()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect();
    ids.sort();
    ids
}

fn gray() -> Stain {
    Stain::in_lane(Lane::new("gray").expect("a lane"))
}

impl Chain {
    /// Waits until A's balancer sends baseline calls to `b_base` and gray ones to
    /// `b_gray`, and every B instance's balancer does the same with `c_base` and `c_gray`.
    async fn converge(
        &self,
        what: &str,
        b_base: &[&str],
        b_gray: &[&str],
        c_base: &[&str],
        c_gray: &[&str],
    ) {
        let gray = gray();
        let fits = |balance: &Channels, base: &[&str], lane: &[&str]| {
            candidates(balance, None) == base && candidates(balance, Some(&gray)) == lane
        };
        until(WAIT, what, || {
            fits(&self.to_b, b_base, b_gray)
                && self.to_c.iter().all(|to_c| fits(to_c, c_base, c_gray))
        })
        .await;
    }

    async fn client(&self) -> HopClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.a.addr()))
            .expect("a URI")
            .connect()
            .await
            .expect("connect to A");
        HopClient::new(channel)
    }
}

/// Calls A by a client without any gray layer, stained `gray` when `stained`.
async fn send(mut client: HopClient<Channel>, stained: bool) -> Result<HopReply, Status> {
    let mut req = Request::new(HopRequest {
        path: "/hop".into(),
    });
    if stained {
        let lane = MetadataValue::from_static("gray");
        req.metadata_mut().insert("x-gray-lane", lane);
    }
    client.call(req).await.map(Response::into_inner)
}

/// How one call ended: its trail (`a:gray b-gray:gray c-gray:gray`), or the status code
/// and message of its failure.
fn outcome(result: &Result<HopReply, Status>) -> String {
    match result {
        Ok(reply) => reply.trail.join(" "),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// `calls` calls, `IN_FLIGHT` at a time, alternately stained and not; each one's
/// `(stained, outcome)`.
async fn burst(client: &HopClient<Channel>, calls: usize) -> Vec<(bool, String)> {
    const IN_FLIGHT: usize = 32;
    let mut running = JoinSet::new();
    let mut done = Vec::with_capacity(calls);
    for i in 0..calls {
        if running.len() == IN_FLIGHT {
            done.push(running.join_next().await.expect("a call").expect("joined"));
        }
        let (client, stained) = (client.clone(), i % 2 == 0);
        running.spawn(async move { (stained, outcome(&send(client, stained).await)) });
    }
    while let Some(joined) = running.join_next().await {
        done.push(joined.expect("joined"));
    }
    done
}

/// Checks every call against what its stain allows; returns how many ended each way.
fn check(
    what: &str,
    calls: &[(bool, String)],
    stained: &[&str],
    unstained: &[&str],
) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let mut misroutes = Vec::new();
    for (is_stained, outcome) in calls {
        let allowed = if *is_stained { stained } else { unstained };
        if !allowed.contains(&outcome.as_str()) {
            misroutes.push((is_stained, outcome));
        }
        *seen.entry(outcome.clone()).or_default() += 1;
    }
    assert!(
        misroutes.is_empty(),
        "{what}: {} of {} calls went astray, the first ones: {:?}; all: {seen:?}",
        misroutes.len(),
        calls.len(),
        &misroutes[..misroutes.len().min(5)]
    );
    seen
}

const BASE: &str = "a: b-base: c-base:";
const BASE_TO_C_GRAY: &str = "a: b-base: c-gray:";
const GRAY: &str = "a:gray b-gray:gray c-gray:gray";
const GRAY_2: &str = "a:gray b-gray:gray c-gray-2:gray";
const NO_GRAY_B: &str =
    "Unavailable: no instance of `svc-b` fits lane `gray` (policy `default`, fallback `none`)";

/// How many calls a steady state is checked with.
const CALLS: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_follow_instances_added_relabelled_and_removed_with_zero_misroutes() {
    let chain = chain().await;
    let client = chain.client().await;
    check("at start", &burst(&client, CALLS).await, &[GRAY], &[BASE]);

    // A gray C instance is registered while calls flow: they reach one gray C instance or
    // the other, never a baseline one; once every B instance has it, it takes calls.
    let during = tokio::spawn({
        let client = client.clone();
        async move { burst(&client, CALLS).await }
    });
    let c_gray_2 = chain.c["c-gray-2"].addr();
    chain
        .etcd
        .put(&key("c-gray-2"), record(c_gray_2, true))
        .await;
    chain
        .converge(
            "c-gray-2 added",
            &["b-base"],
            &["b-gray"],
            &["c-base"],
            &["c-gray", "c-gray-2"],
        )
        .await;
    check("adding", &during.await.unwrap(), &[GRAY, GRAY_2], &[BASE]);
    let seen = check(
        "added",
        &burst(&client, CALLS).await,
        &[GRAY, GRAY_2],
        &[BASE],
    );
    assert!(
        seen.get(GRAY_2) > Some(&0),
        "the new instance took no call: {seen:?}"
    );
    assert!(
        seen.get(GRAY) > Some(&0),
        "the first one took no call: {seen:?}"
    );

    // c-gray is relabelled baseline: gray calls go to c-gray-2 alone, baseline calls to
    // c-base and c-gray.
    let during = tokio::spawn({
        let client = client.clone();
        async move { burst(&client, CALLS).await }
    });
    let c_gray = chain.c["c-gray"].addr();
    chain.etcd.put(&key("c-gray"), record(c_gray, false)).await;
    chain
        .converge(
            "c-gray relabelled",
            &["b-base"],
            &["b-gray"],
            &["c-base", "c-gray"],
            &["c-gray-2"],
        )
        .await;
    check(
        "relabelling",
        &during.await.unwrap(),
        &[GRAY, GRAY_2],
        &[BASE, BASE_TO_C_GRAY],
    );
    let seen = check(
        "relabelled",
        &burst(&client, CALLS).await,
        &[GRAY_2],
        &[BASE, BASE_TO_C_GRAY],
    );
    assert!(
        seen.get(BASE_TO_C_GRAY) > Some(&0),
        "c-gray took no baseline call: {seen:?}"
    );

    // b-gray leaves the instance file: A has no gray B instance any more, and gray calls
    // fail at A, saying why; baseline calls go on.
    let during = tokio::spawn({
        let client = client.clone();
        async move { burst(&client, CALLS).await }
    });
    write_b(&chain.instances, &chain.b, false);
    chain
        .converge(
            "b-gray removed",
            &["b-base"],
            &[],
            &["c-base", "c-gray"],
            &["c-gray-2"],
        )
        .await;
    check(
        "removing",
        &during.await.unwrap(),
        &[GRAY_2, NO_GRAY_B],
        &[BASE, BASE_TO_C_GRAY],
    );
    let status = send(client.clone(), true).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    check(
        "removed",
        &burst(&client, CALLS).await,
        &[NO_GRAY_B],
        &[BASE, BASE_TO_C_GRAY],
    );
}
