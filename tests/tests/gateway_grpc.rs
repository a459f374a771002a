//! gRPC through the gateway: a tonic client → the gateway → tonic baseline and gray
//! servers, over HTTP/2 both ways (`protocol = "h2c"`), the path forwarded as it came
//! (`strip_prefix = false`).
//!
//! Unary and bidirectional streaming calls are routed by stain (a rule on the `x-tester`
//! metadata), and the servers read the lane from the `x-gray-lane` metadata the gateway
//! wrote; status codes, messages and custom trailing metadata arrive intact; the
//! gateway's own answers are gRPC statuses (`UNAVAILABLE` with the reason when nothing
//! fits, `UNIMPLEMENTED` for a service it does not route); an instance shut down
//! gracefully under load fails no call.

use std::{net::SocketAddr, pin::Pin};

use futures_util::{Stream, StreamExt, stream};
use gray_gateway::Gateway;
use gray_test_support::TempDir;
use gray_tests::{
    loopback_listener,
    proto::{
        greeter::{
            HelloReply, HelloRequest,
            greeter_client::GreeterClient,
            greeter_server::{Greeter, GreeterServer},
        },
        health::{HealthCheckRequest, health_client::HealthClient},
    },
};
use tonic::{
    Code, Request, Response, Status, Streaming, metadata::MetadataMap, transport::Channel,
};

/// A greeter that names itself in every reply, with the lane it read from the metadata.
#[derive(Clone)]
struct Named(&'static str);

impl Named {
    fn reply(&self, name: &str, lane: &str) -> Result<HelloReply, Status> {
        if name == "missing" || name == "stop" {
            // A status with a message and custom metadata: in the trailers.
            let mut trailers = MetadataMap::new();
            trailers.insert("x-served-by", self.0.parse().unwrap());
            return Err(Status::with_metadata(
                Code::NotFound,
                format!("no such name: {name}"),
                trailers,
            ));
        }
        Ok(HelloReply {
            message: format!("{}: {name} lane={lane}", self.0),
        })
    }
}

fn lane<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get("x-gray-lane")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned()
}

type ChatStream = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;

#[tonic::async_trait]
impl Greeter for Named {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let lane = lane(&request);
        self.reply(&request.into_inner().name, &lane)
            .map(Response::new)
    }

    type ChatStream = ChatStream;

    /// One reply per message, as each arrives; the stream ends after a failed one.
    async fn chat(
        &self,
        request: Request<Streaming<HelloRequest>>,
    ) -> Result<Response<ChatStream>, Status> {
        let lane = lane(&request);
        let me = self.clone();
        let inbound = request.into_inner();
        let replies = stream::unfold(Some(inbound), move |inbound| {
            let (me, lane) = (me.clone(), lane.clone());
            async move {
                let mut inbound = inbound?;
                let message = inbound.next().await?;
                let reply = message.and_then(|m| me.reply(&m.name, &lane));
                let go_on = reply.is_ok().then_some(inbound);
                Some((reply, go_on))
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

async fn serve(name: &'static str) -> SocketAddr {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(Named(name)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}

/// The gateway in front of `instances` (`(id, address, gray)`) of `greeter.Greeter`.
async fn gateway(dir: &TempDir, instances: &[(&str, SocketAddr, bool)]) -> Gateway {
    let mut list = String::new();
    for (id, addr, gray) in instances {
        list.push_str(&format!(
            "[[services.\"greeter.Greeter\"]]\nid = \"{id}\"\naddress = \"{addr}\"\nlabels = {{ gray = {gray} }}\n\n"
        ));
    }
    std::fs::write(dir.path().join("instances.toml"), list).unwrap();
    std::fs::write(dir.path().join("rules.toml"), gray_tests::TESTERS_RULES).unwrap();
    std::fs::write(
        dir.path().join("gateway.toml"),
        "listen = \"127.0.0.1:0\"\nrules = \"rules.toml\"\ninstances = \"instances.toml\"\n\n\
         [services.\"greeter.Greeter\"]\npreset = \"seed-000\"\nstrip_prefix = false\nprotocol = \"h2c\"\n",
    )
    .unwrap();
    gray_tests::start_gateway(dir.path()).await
}

async fn client(gw: SocketAddr) -> GreeterClient<Channel> {
    GreeterClient::connect(format!("http://{gw}"))
        .await
        .unwrap()
}

fn hello(name: &str, gray: bool) -> Request<HelloRequest> {
    let mut request = Request::new(HelloRequest { name: name.into() });
    if gray {
        request
            .metadata_mut()
            .insert("x-tester", "1".parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_are_routed_by_stain_and_statuses_arrive_intact() {
    let dir = TempDir::new("grpc-unary");
    let (gray, base) = (serve("gray-1").await, serve("base-1").await);
    let gw = gateway(&dir, &[("gray-1", gray, true), ("base-1", base, false)]).await;
    let mut greeter = client(gw.addr()).await;

    for _ in 0..3 {
        let reply = greeter.say_hello(hello("ann", true)).await.unwrap();
        assert_eq!(reply.metadata().get("x-gray-instance").unwrap(), "gray-1");
        assert_eq!(reply.into_inner().message, "gray-1: ann lane=gray");
        let reply = greeter.say_hello(hello("bob", false)).await.unwrap();
        assert_eq!(reply.into_inner().message, "base-1: bob lane=-");
    }

    // The server's status, message and metadata, as it sent them.
    let status = greeter.say_hello(hello("missing", true)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(status.message(), "no such name: missing");
    assert_eq!(status.metadata().get("x-served-by").unwrap(), "gray-1");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidirectional_streams_go_both_ways_and_end_with_their_trailers() {
    let dir = TempDir::new("grpc-bidi");
    let (gray, base) = (serve("gray-1").await, serve("base-1").await);
    let gw = gateway(&dir, &[("gray-1", gray, true), ("base-1", base, false)]).await;
    let mut greeter = client(gw.addr()).await;

    for (gray, want) in [(true, "gray-1: {} lane=gray"), (false, "base-1: {} lane=-")] {
        // Each message is answered before the next is sent: nothing waits for the end of
        // the request stream.
        let (tx, rx) = tokio::sync::mpsc::channel::<HelloRequest>(1);
        let outbound = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut request = Request::new(outbound);
        if gray {
            request
                .metadata_mut()
                .insert("x-tester", "1".parse().unwrap());
        }
        tx.send(HelloRequest { name: "one".into() }).await.unwrap();
        let mut replies = greeter.chat(request).await.unwrap().into_inner();
        for name in ["one", "two", "three"] {
            if name != "one" {
                tx.send(HelloRequest { name: name.into() }).await.unwrap();
            }
            let reply = tokio::time::timeout(gray_test_support::WAIT, replies.message())
                .await
                .expect("a reply within the bound")
                .unwrap()
                .expect("a reply");
            assert_eq!(reply.message, want.replace("{}", name));
        }
        // The stream ends with the server's status in its trailers.
        tx.send(HelloRequest {
            name: "stop".into(),
        })
        .await
        .unwrap();
        let status = replies.message().await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_eq!(status.message(), "no such name: stop");
        let server = if gray { "gray-1" } else { "base-1" };
        assert_eq!(status.metadata().get("x-served-by").unwrap(), server);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_answers_are_grpc_statuses() {
    let dir = TempDir::new("grpc-errors");
    // Only a gray instance: seed 000 never sends a baseline request to gray.
    let gray = serve("gray-1").await;
    let gw = gateway(&dir, &[("gray-1", gray, true)]).await;
    let mut greeter = client(gw.addr()).await;
    assert_eq!(
        greeter
            .say_hello(hello("ann", true))
            .await
            .unwrap()
            .into_inner()
            .message,
        "gray-1: ann lane=gray"
    );
    let status = greeter.say_hello(hello("bob", false)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("greeter.Greeter"), "{status:?}");
    assert!(status.message().contains("baseline"), "{status:?}");

    // A service the gateway does not route.
    let mut health = HealthClient::connect(format!("http://{}", gw.addr()))
        .await
        .unwrap();
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    assert_eq!(status.message(), "unknown service");

    // A path the edge refuses before routing (an encoded slash): INTERNAL, with the reason,
    // not an HTTP 400 with a JSON body.
    let channel = Channel::from_shared(format!("http://{}", gw.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<HelloRequest, HelloReply, _>(
            hello("eve", false),
            "/greeter.Greeter%2FSayHello".parse().unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.message().contains("encoded_slash"), "{status:?}");
    gw.shutdown().await;
}

/// `name`'s greeter until `shutdown` fires: then tonic's graceful shutdown (GOAWAY, the
/// calls in flight finished, the connection closed).
async fn serve_until(
    name: &'static str,
    shutdown: tokio::sync::oneshot::Receiver<()>,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(Named(name)))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async move {
                    let _ = shutdown.await;
                },
            )
            .await
            .unwrap();
    });
    (addr, task)
}

/// An instance shut down gracefully under load (tonic's graceful shutdown, as a rolling
/// restart does): no call fails; those it had not taken go to the other instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_shut_down_gracefully_under_load_fails_no_call() {
    let dir = TempDir::new("grpc-graceful");
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let (first, task) = serve_until("base-1", stopped).await;
    let second = serve("base-2").await;
    let gw = gateway(&dir, &[("base-1", first, false), ("base-2", second, false)]).await;
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (mut greeter, calls) = (client(gw.addr()).await, calls.clone());
        load.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for _ in 0..400 {
                if let Err(status) = greeter.say_hello(hello("ann", false)).await {
                    failed.push(format!("{status:?}"));
                }
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            failed
        }));
    }
    let deadline = std::time::Instant::now() + gray_test_support::WAIT;
    while calls.load(std::sync::atomic::Ordering::Relaxed) < 400 {
        assert!(
            std::time::Instant::now() < deadline,
            "the load made too few calls"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    stop.send(()).unwrap();
    let mut failed = Vec::new();
    for task in load {
        failed.extend(task.await.unwrap());
    }
    task.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of 1600 calls failed: {failed:#?}",
        failed.len()
    );
    gw.shutdown().await;
}
