//! A tonic chain A → B → C that routes by the stain over gRPC (HTTP/2).
//!
//! `svc-b` and `svc-c` each run a baseline and a gray instance (tonic servers on loopback
//! ports, behind `ExtractStainLayer`). A and each B instance call the next service through
//! the generated `HopClient` over a shared `gray_balance::Balance` of per-instance tonic
//! channels (`gray_discovery::grpc::GrpcChannels`), behind `PropagateStainLayer`. No
//! adapter sits between tonic's client and the balancer: `Balance<_, Endpoint<Channel>>`
//! is a `GrpcService` as it is (checked below at compile time). The one addition is in the
//! handler: tonic reports any client error as `Unknown`, so a call the balancer could not
//! route (its `Unroutable`, the status' source) is answered as `Unavailable`.

use std::time::Duration;

use gray_balance::{Balance, BalanceLayer, error::Unroutable};
use gray_discovery::{Endpoint, InstanceId, Registry, grpc::GrpcChannels};
use gray_policy::Policy;
use gray_tests::{
    Server,
    proto::{HopReply, HopRequest, hop_client::HopClient, hop_server::Hop},
    route::current_lane,
    serve_hop,
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

/// A client of `service` that routes by the stain over `registry`'s instances.
fn routed(registry: &Registry, service: &str) -> (Routed, Channels) {
    let channels = GrpcChannels::new().with_endpoint(|e| e.timeout(Duration::from_secs(30)));
    let endpoints = registry
        .service(service)
        .expect("a name")
        .endpoints(channels);
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

/// The chain, running; everything stops when it is dropped.
struct Chain {
    a: Server,
    _servers: Vec<Server>,
}

async fn chain() -> Chain {
    let gray: &[(&str, &str)] = &[("gray", "true")];
    let c_base = serve_hop(Node {
        id: "c-base",
        next: None,
    })
    .await;
    let c_gray = serve_hop(Node {
        id: "c-gray",
        next: None,
    })
    .await;
    let to_c = Registry::from_static([(
        "svc-c",
        [
            c_base.instance("c-base", &[]),
            c_gray.instance("c-gray", gray),
        ],
    )])
    .expect("a registry");
    let mut b = Vec::new();
    for id in ["b-base", "b-gray"] {
        // Each B instance has its own balancer over C.
        let (client, balance) = routed(&to_c, "svc-c");
        assert_eq!(balance.len(), 2, "a static list is applied at once");
        b.push(
            serve_hop(Node {
                id,
                next: Some(client),
            })
            .await,
        );
    }
    let to_b = Registry::from_static([(
        "svc-b",
        [b[0].instance("b-base", &[]), b[1].instance("b-gray", gray)],
    )])
    .expect("a registry");
    let a = serve_hop(Node {
        id: "a",
        next: Some(routed(&to_b, "svc-b").0),
    })
    .await;
    b.extend([c_base, c_gray]);
    Chain { a, _servers: b }
}

/// Calls A by a client without any gray layer, stained with `lane` when given.
async fn send(client: &mut HopClient<Channel>, lane: Option<&str>) -> Result<HopReply, Status> {
    let mut req = Request::new(HopRequest {
        path: "/hop".into(),
    });
    if let Some(lane) = lane {
        let lane = MetadataValue::try_from(lane).expect("metadata");
        req.metadata_mut().insert("x-gray-lane", lane);
    }
    client.call(req).await.map(Response::into_inner)
}

async fn entry(chain: &Chain) -> HopClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", chain.a.addr()))
        .expect("a URI")
        .connect()
        .await
        .expect("connect to A");
    HopClient::new(channel)
}

fn path(stained: bool) -> Vec<String> {
    let hops: [&str; 3] = if stained {
        ["a:gray", "b-gray:gray", "c-gray:gray"]
    } else {
        ["a:", "b-base:", "c-base:"]
    };
    hops.map(String::from).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stained_calls_reach_only_gray_instances_and_unstained_only_baseline() {
    const CALLS: usize = 1_000;
    const IN_FLIGHT: usize = 64;

    let chain = chain().await;
    let client = entry(&chain).await;
    let reply = send(&mut client.clone(), Some("gray")).await.expect("gray");
    assert_eq!(reply.trail, path(true));
    assert_eq!(reply.lane, "gray");
    let reply = send(&mut client.clone(), None).await.expect("baseline");
    assert_eq!(reply.trail, path(false));

    // 1,000 mixed calls, 64 at a time, over one HTTP/2 connection per hop and instance.
    let mut calls = JoinSet::new();
    let mut misroutes = Vec::new();
    let check = |(i, reply): (usize, Result<HopReply, Status>)| match reply {
        Ok(reply) if reply.trail == path(i % 2 == 0) => None,
        other => Some((i, other)),
    };
    for i in 0..CALLS {
        if calls.len() == IN_FLIGHT {
            misroutes.extend(check(
                calls.join_next().await.expect("a call").expect("joined"),
            ));
        }
        let mut client = client.clone();
        calls.spawn(async move { (i, send(&mut client, (i % 2 == 0).then_some("gray")).await) });
    }
    while let Some(joined) = calls.join_next().await {
        misroutes.extend(check(joined.expect("joined")));
    }
    assert!(
        misroutes.is_empty(),
        "{} of {CALLS} calls went astray, the first ones: {:?}",
        misroutes.len(),
        &misroutes[..misroutes.len().min(5)]
    );

    // A lane no instance of B serves: A's call fails before it is sent, with a status
    // that names the service, the lane and the policy.
    let status = send(&mut client.clone(), Some("blue")).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::Unavailable,
            "no instance of `svc-b` fits lane `blue` (policy `default`, fallback `none`)"
        )
    );
}
