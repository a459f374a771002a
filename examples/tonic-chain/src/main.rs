//! Run with: cargo run -p example-tonic-chain
//!
//! Three tonic services A → B → C on loopback ports (seed 003's nested RPC propagation).
//! Each server reads the stain with `Server::builder().layer(ExtractStainLayer::new())`;
//! each client is a tonic `Channel` wrapped in `PropagateStainLayer`. The handlers never
//! touch the stain. The program calls A once unstained and once with `x-gray-lane: gray`
//! metadata, prints the lane every hop saw, and exits.

use std::net::SocketAddr;

use gray_tower::{ExtractStainLayer, PropagateStain, PropagateStainLayer};
use tokio::net::TcpListener;
use tonic::{
    Request, Response, Status,
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

/// One hop: records the lane it saw, then calls the next hop if there is one.
struct Hop {
    name: &'static str,
    next: Option<GreeterClient<PropagateStain<Channel>>>,
}

fn seen_lane() -> String {
    gray_tower::current()
        .and_then(|ctx| ctx.lane().map(ToString::to_string))
        .unwrap_or_else(|| "baseline".into())
}

#[tonic::async_trait]
impl Greeter for Hop {
    async fn greet(&self, request: Request<GreetRequest>) -> Result<Response<GreetReply>, Status> {
        let mut hops = vec![format!("{}:{}", self.name, seen_lane())];
        if let Some(next) = &self.next {
            // A fresh request: no metadata copied by hand, the layer writes the stain.
            let reply = next
                .clone()
                .greet(GreetRequest {
                    name: request.into_inner().name,
                })
                .await?;
            hops.extend(reply.into_inner().hops);
        }
        Ok(Response::new(GreetReply { hops }))
    }
}

async fn start(hop: Hop) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener);
    tokio::spawn(
        Server::builder()
            .layer(ExtractStainLayer::new())
            .add_service(GreeterServer::new(hop))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

async fn client(addr: SocketAddr) -> Result<GreeterClient<PropagateStain<Channel>>, BoxError> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    // The layer sits outside the Channel (a Buffer), in the caller's task.
    let svc = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(channel);
    Ok(GreeterClient::new(svc))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let c = start(Hop {
        name: "C",
        next: None,
    })
    .await?;
    let b = start(Hop {
        name: "B",
        next: Some(client(c).await?),
    })
    .await?;
    let a = start(Hop {
        name: "A",
        next: Some(client(b).await?),
    })
    .await?;

    let mut entry = GreeterClient::new(
        Channel::from_shared(format!("http://{a}"))?
            .connect()
            .await?,
    );
    let unstained = entry
        .greet(GreetRequest {
            name: "plain".into(),
        })
        .await?
        .into_inner()
        .hops;
    let mut stained = Request::new(GreetRequest {
        name: "gray".into(),
    });
    stained
        .metadata_mut()
        .insert("x-gray-lane", "gray".parse()?);
    let stained = entry.greet(stained).await?.into_inner().hops;

    println!("unstained          -> {}", unstained.join(" -> "));
    println!("x-gray-lane: gray  -> {}", stained.join(" -> "));
    assert_eq!(unstained, ["A:baseline", "B:baseline", "C:baseline"]);
    assert_eq!(stained, ["A:gray", "B:gray", "C:gray"]);
    Ok(())
}
