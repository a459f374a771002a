//! Run with: cargo run -p example-tonic-chain
//!
//! Routing by the stain with tonic: a gRPC chain A → B → C on loopback ports, where C runs
//! a baseline instance `c-base` and a gray instance `c-gray` (seed 003's nested calls, now
//! routed rather than only propagated).
//!
//! - Every server reads the stain with `Server::builder().layer(ExtractStainLayer::new())`.
//! - A calls B, and B calls C, with the generated `GreeterClient` over one shared `Balance`
//!   of per-instance HTTP/2 channels (`GrpcChannels`: a lazily connected `Channel` for each
//!   instance in the registry), wrapped in `PropagateStainLayer`: each call goes to an
//!   instance whose labels fit the stain, and carries the stain on. No adapter is needed:
//!   the balancer is a `tonic::client::GrpcService` as it is.
//!
//! The handlers never touch the stain. The program calls A unstained, with
//! `x-gray-lane: gray`, and with a lane no instance of C serves, prints the path of each
//! call, checks it and exits.

use gray_balance::{Balance, BalanceLayer, error::Unroutable};
use gray_core::Labels;
use gray_discovery::{Endpoint, Instance, InstanceId, Registry, grpc::GrpcChannels};
use gray_policy::{Fallback, Policy};
use gray_tower::{ExtractStainLayer, PropagateStain, PropagateStainLayer};
use tokio::net::TcpListener;
use tonic::{
    Code, Request, Response, Status,
    transport::{Channel, Server, server::TcpIncoming},
};
use tower::ServiceBuilder;

/// The generated protocol.
mod proto {
    #![allow(missing_docs, unreachable_pub, clippy::all)]
    tonic::include_proto!("greeter");
}

use proto::{
    GreetReply, GreetRequest,
    greeter_client::GreeterClient,
    greeter_server::{Greeter, GreeterServer},
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client of the next service: the generated client over the balancer of its channels;
/// the stain is written outside the balancer, in the caller's task.
type Client = GreeterClient<PropagateStain<Balance<InstanceId, Endpoint<Channel>>>>;

/// A client of `service` that routes by the stain over the registry's instances of it.
fn client(registry: &Registry, service: &str, policy: Policy) -> Result<Client, BoxError> {
    let channels = registry.service(service)?.endpoints(GrpcChannels::new());
    let balance = BalanceLayer::new(service, policy).build(channels);
    let stained = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(balance);
    Ok(GreeterClient::new(stained))
}

/// One hop: records its name and the lane it saw, then calls the next hop if any.
struct Hop {
    name: &'static str,
    next: Option<Client>,
}

fn seen_lane() -> String {
    gray_tower::current()
        .and_then(|stain| stain.lane().map(ToString::to_string))
        .unwrap_or_else(|| "baseline".into())
}

/// tonic reports any client error as `Unknown`; a call the balancer could not route (an
/// `Unroutable`, which names the service, the lane and the policy) is `Unavailable`.
fn unavailable(status: Status) -> Status {
    let source = std::error::Error::source(&status);
    match source.and_then(|e| e.downcast_ref::<Unroutable>()) {
        Some(unroutable) => Status::unavailable(unroutable.to_string()),
        None => status,
    }
}

#[tonic::async_trait]
impl Greeter for Hop {
    async fn greet(&self, request: Request<GreetRequest>) -> Result<Response<GreetReply>, Status> {
        let mut hops = vec![format!("{}:{}", self.name, seen_lane())];
        if let Some(next) = &self.next {
            // A fresh request: no metadata copied by hand, the layer writes the stain.
            let name = request.into_inner().name;
            let reply = next.clone().greet(GreetRequest { name }).await;
            hops.extend(reply.map_err(unavailable)?.into_inner().hops);
        }
        Ok(Response::new(GreetReply { hops }))
    }
}

/// Serves the hop `name`, which calls `next`, on a loopback port; returns it as an
/// instance labelled `labels`.
async fn start(
    name: &'static str,
    next: Option<Client>,
    labels: Labels,
) -> Result<Instance, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        Server::builder()
            .layer(ExtractStainLayer::new())
            .add_service(GreeterServer::new(Hop { name, next }))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    Ok(Instance::new(
        name.parse()?,
        addr.to_string().parse()?,
        labels,
    ))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let gray = || Labels::from_iter([("gray", "true")]);
    // The registries: fixed lists here; a file or etcd in a deployment.
    let c = Registry::from_static([(
        "svc-c",
        [
            start("c-base", None, Labels::new()).await?,
            start("c-gray", None, gray()).await?,
        ],
    )])?;
    // Policy::new(): the `gray` label puts an instance in lane `gray`, unlabelled
    // instances are baseline, no fallback.
    let to_c = client(&c, "svc-c", Policy::new())?;
    let b = Registry::from_static([("svc-b", [start("B", Some(to_c), Labels::new()).await?])])?;
    // B has no gray instance: a gray call falls back to a baseline one, and stays gray.
    let to_b = client(&b, "svc-b", Policy::new().with_fallback(Fallback::Baseline))?;
    let a = start("A", Some(to_b), Labels::new()).await?;

    // A client without any gray layer calls A.
    let mut entry = GreeterClient::new(Channel::builder(a.address().uri()).connect().await?);
    let mut call = async |lane: Option<&str>| {
        let mut request = Request::new(GreetRequest { name: "hi".into() });
        if let Some(lane) = lane {
            request
                .metadata_mut()
                .insert("x-gray-lane", lane.parse().expect("ASCII"));
        }
        entry
            .greet(request)
            .await
            .map(|reply| reply.into_inner().hops)
    };
    let unstained = call(None).await?;
    let stained = call(Some("gray")).await?;
    let blue = call(Some("blue")).await.unwrap_err();

    println!("unstained          -> {}", unstained.join(" -> "));
    println!("x-gray-lane: gray  -> {}", stained.join(" -> "));
    println!(
        "x-gray-lane: blue  -> {:?}: {}",
        blue.code(),
        blue.message()
    );
    assert_eq!(unstained, ["A:baseline", "B:baseline", "c-base:baseline"]);
    assert_eq!(stained, ["A:gray", "B:gray", "c-gray:gray"]);
    assert_eq!(
        (blue.code(), blue.message()),
        (
            Code::Unavailable,
            "no instance of `svc-c` fits lane `blue` (policy `default`, fallback `none`)"
        )
    );
    Ok(())
}
