//! A tonic gRPC chain A → B → C on real loopback ports (seed 003's nested RPC propagation).
//!
//! Every service is a tonic server behind `ExtractStainLayer`. A and B answer `Hop::call`
//! by calling the next service through a generated `HopClient` on a tonic `Channel` wrapped
//! in `PropagateStainLayer`; their handlers never pass a context by hand. C answers with
//! the lane it saw and the raw `x-gray-info` metadata. Every hop checks that the request
//! extensions and the task-local context agree.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use gray_core::Stain;
use gray_tests::{
    Server,
    proto::{HopReply, HopRequest, hop_client::HopClient, hop_server::Hop},
    serve_hop,
};
use gray_tower::{CaptureStainLayer, PropagateStain, PropagateStainLayer, task};
use tokio::{sync::Semaphore, task::JoinSet};
use tonic::{
    Request, Response, Status,
    metadata::MetadataValue,
    transport::{Channel, Endpoint},
};
use tower::{ServiceBuilder, buffer::Buffer};

type HopFuture = Pin<Box<dyn Future<Output = Result<Response<HopReply>, Status>> + Send>>;

/// How a hop calls the next service.
type Forward = Arc<dyn Fn(Request<HopRequest>) -> HopFuture + Send + Sync>;

/// One service of the chain: forwards to `next`, or answers when it is the last one.
struct Node {
    name: &'static str,
    next: Option<Forward>,
}

fn lane_of(stain: Option<&Stain>) -> String {
    stain
        .and_then(Stain::lane)
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[tonic::async_trait]
impl Hop for Node {
    async fn call(&self, request: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        let from_task = task::current();
        let from_extensions = request.extensions().get::<Stain>().cloned();
        if from_task != from_extensions {
            return Err(Status::internal(format!(
                "{}: task-local context {from_task:?} differs from the extensions' {from_extensions:?}",
                self.name
            )));
        }
        let Some(next) = &self.next else {
            let route = request
                .metadata()
                .get("x-gray-info")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return Ok(Response::new(HopReply {
                lane: lane_of(from_task.as_ref()),
                route,
                trail: vec![self.name.to_owned()],
            }));
        };
        // A fresh outbound request: the stain comes only from the layers.
        let path = request.into_inner().path;
        let mut reply = next(Request::new(HopRequest { path })).await?.into_inner();
        reply.trail.insert(0, self.name.to_owned());
        Ok(Response::new(reply))
    }
}

/// A channel to `server`. The request timeout turns a hang into a failed request.
async fn channel(server: &Server) -> Channel {
    Endpoint::from_shared(format!("http://{}", server.addr()))
        .expect("endpoint")
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect")
}

/// The recommended client: `PropagateStain` outside the `Channel` (itself a `Buffer`), so
/// it runs in the caller's task, where the task-local context is set.
fn propagate_outside(channel: Channel) -> Forward {
    let svc = ServiceBuilder::new()
        .layer(PropagateStainLayer::new())
        .service(channel);
    let client = HopClient::new(svc);
    Arc::new(move |req| {
        let mut client = client.clone();
        Box::pin(async move { client.call(req).await })
    })
}

/// `PropagateStain` *inside* one more `Buffer`: its `call()` runs in the buffer's worker
/// task. With `capture`, `CaptureStainLayer` outside the buffer copies the caller's
/// context into the request extensions first.
fn propagate_inside_buffer(channel: Channel, capture: bool) -> Forward {
    let buffered = Buffer::new(PropagateStain::new(channel), 64);
    if capture {
        let client = HopClient::new(
            ServiceBuilder::new()
                .layer(CaptureStainLayer::new())
                .service(buffered),
        );
        Arc::new(move |req| {
            let mut client = client.clone();
            Box::pin(async move { client.call(req).await })
        })
    } else {
        let client = HopClient::new(buffered);
        Arc::new(move |req| {
            let mut client = client.clone();
            Box::pin(async move { client.call(req).await })
        })
    }
}

/// The three servers, kept alive together.
struct Chain {
    _c: Server,
    _b: Server,
    a: Server,
}

/// A → B → C, where B reaches C through `b_to_c` (A always uses the recommended client).
async fn chain(b_to_c: impl FnOnce(Channel) -> Forward) -> Chain {
    let c = serve_hop(Node {
        name: "c",
        next: None,
    })
    .await;
    let b = serve_hop(Node {
        name: "b",
        next: Some(b_to_c(channel(&c).await)),
    })
    .await;
    let a = serve_hop(Node {
        name: "a",
        next: Some(propagate_outside(channel(&b).await)),
    })
    .await;
    Chain { _c: c, _b: b, a }
}

/// What a request carries when it reaches A.
#[derive(Debug, Clone, Default)]
struct Sent {
    lane: Option<String>,
    route: Option<String>,
}

/// Sends one request to A (by a client without any gray layer) and returns C's reply.
async fn send(client: &mut HopClient<Channel>, stain: &Sent) -> Result<HopReply, Status> {
    let mut req = Request::new(HopRequest {
        path: "/hop".into(),
    });
    if let Some(lane) = &stain.lane {
        let value = MetadataValue::try_from(lane.as_str()).expect("lane metadata");
        req.metadata_mut().insert("x-gray-lane", value);
    }
    if let Some(route) = &stain.route {
        let value = MetadataValue::try_from(route.as_str()).expect("route metadata");
        req.metadata_mut().insert("x-gray-info", value);
    }
    client.call(req).await.map(Response::into_inner)
}

async fn client_of(chain: &Chain) -> HopClient<Channel> {
    HopClient::new(channel(&chain.a).await)
}

fn trail() -> Vec<String> {
    ["a", "b", "c"].map(String::from).to_vec()
}

#[tokio::test]
async fn a_lane_arrives_at_c_exactly() {
    let chain = chain(propagate_outside).await;
    let mut client = client_of(&chain).await;
    let stain = Sent {
        lane: Some("canary".into()),
        route: None,
    };
    let reply = send(&mut client, &stain).await.expect("chain answers");
    assert_eq!(reply.lane, "canary");
    assert_eq!(reply.route, "");
    assert_eq!(reply.trail, trail());
}

#[tokio::test]
async fn version_pins_arrive_at_c_byte_for_byte() {
    let chain = chain(propagate_outside).await;
    let mut client = client_of(&chain).await;
    // Not the canonical JSON form: the route header must be re-emitted as it came.
    let route = r#"{ "custom": {"svc-b": "v3"}, "all": "v2" }"#;
    let pins_only = Sent {
        lane: None,
        route: Some(route.into()),
    };
    let reply = send(&mut client, &pins_only).await.expect("chain answers");
    assert_eq!(reply.lane, "");
    assert_eq!(reply.route, route);
    assert_eq!(reply.trail, trail());

    let both = Sent {
        lane: Some("gray".into()),
        route: Some(route.into()),
    };
    let reply = send(&mut client, &both).await.expect("chain answers");
    assert_eq!(reply.lane, "gray");
    assert_eq!(reply.route, route);
}

#[tokio::test]
async fn an_unstained_request_stays_unstained() {
    let chain = chain(propagate_outside).await;
    let mut client = client_of(&chain).await;
    let reply = send(&mut client, &Sent::default())
        .await
        .expect("chain answers");
    assert_eq!(reply.lane, "");
    assert_eq!(reply.route, "");
    assert_eq!(reply.trail, trail());
}

#[tokio::test]
async fn a_malformed_stain_is_answered_as_unstained() {
    let chain = chain(propagate_outside).await;
    let mut client = client_of(&chain).await;
    for stain in [
        Sent {
            lane: Some("not a token".into()),
            route: None,
        },
        Sent {
            lane: None,
            route: Some("{broken json".into()),
        },
    ] {
        let reply = send(&mut client, &stain).await.expect("chain answers");
        assert_eq!(reply.lane, "", "{stain:?}");
        assert_eq!(reply.route, "", "{stain:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_each_keep_their_own_stain() {
    const REQUESTS: usize = 2_000;
    const IN_FLIGHT: usize = 64;

    let chain = chain(propagate_outside).await;
    let client = client_of(&chain).await;
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut requests = JoinSet::new();
    for i in 0..REQUESTS {
        // Half stained with their own lane, every third pinned to its own version.
        let stain = Sent {
            lane: (i % 2 == 1).then(|| format!("lane-{i}")),
            route: (i % 3 == 0).then(|| format!(r#"{{"all":"v{i}"}}"#)),
        };
        let permit = permits.clone().acquire_owned().await.expect("semaphore");
        let mut client = client.clone();
        requests.spawn(async move {
            let reply = send(&mut client, &stain).await;
            drop(permit);
            (i, stain, reply)
        });
    }

    let mut answered = 0;
    let mut mismatches = Vec::new();
    while let Some(joined) = requests.join_next().await {
        let (i, stain, reply) = joined.expect("request task");
        answered += 1;
        let ok = match &reply {
            Ok(reply) => {
                reply.lane == stain.lane.clone().unwrap_or_default()
                    && reply.route == stain.route.clone().unwrap_or_default()
                    && reply.trail == trail()
            }
            Err(_) => false,
        };
        if !ok {
            mismatches.push((i, stain, reply));
        }
    }
    assert_eq!(answered, REQUESTS);
    assert!(
        mismatches.is_empty(),
        "{} of {REQUESTS} requests saw another stain, first ones: {:?}",
        mismatches.len(),
        &mismatches[..mismatches.len().min(5)]
    );
}

#[tokio::test]
async fn the_stain_crosses_a_buffer_only_from_outside_it() {
    let stain = Sent {
        lane: Some("canary".into()),
        route: Some(r#"{"all":"v2"}"#.into()),
    };

    // PropagateStain inside a Buffer runs in the worker task: no task-local there, and
    // nothing in the extensions, so the stain is lost at B. This keeps the docs true.
    let lost = chain(|channel| propagate_inside_buffer(channel, false)).await;
    let reply = send(&mut client_of(&lost).await, &stain)
        .await
        .expect("chain answers");
    assert_eq!((reply.lane.as_str(), reply.route.as_str()), ("", ""));

    // CaptureStain outside the Buffer carries it in the extensions.
    let captured = chain(|channel| propagate_inside_buffer(channel, true)).await;
    let reply = send(&mut client_of(&captured).await, &stain)
        .await
        .expect("chain answers");
    assert_eq!(reply.lane, "canary");
    assert_eq!(reply.route, r#"{"all":"v2"}"#);
    assert_eq!(reply.trail, trail());

    // PropagateStain outside the Channel (a Buffer itself) is all the other chains use;
    // here every hop goes through it.
    let outside = chain(propagate_outside).await;
    let reply = send(&mut client_of(&outside).await, &stain)
        .await
        .expect("chain answers");
    assert_eq!(reply.lane, "canary");
    assert_eq!(reply.route, r#"{"all":"v2"}"#);
}
