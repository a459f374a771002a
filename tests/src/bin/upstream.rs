//! `gray-test-upstream`: an instance for the fault tests, run as a child process so that a
//! test can SIGKILL it and start it again on the same address (`gray_tests::process`).
//!
//! ```text
//! gray-test-upstream --port PORT --name NAME [--grpc] [--log FILE]
//! ```
//!
//! It binds `127.0.0.1:PORT` with `SO_REUSEPORT` (the test holds the port, bound and not
//! listening, while the instance is down, so that connections to it are refused and no
//! other process takes it), then prints `listening` on its standard output.
//!
//! - HTTP (the default): every request gets `200` with `NAME` as its body; the body of a
//!   `POST` (a request id) is appended to `FILE`, one line per request and one `write` per
//!   line, before the answer, so that the lines of a killed instance survive it.
//! - gRPC (`--grpc`): `chain.Hop/Call` answers `trail = [NAME]` and the lane it saw;
//!   `grpc.health.v1.Health/Check` answers `SERVING`.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    net::SocketAddr,
    sync::Arc,
};

use axum::{Router, body::Bytes, extract::State, http::Method, routing::any};
use gray_tests::{
    proto::{
        HopReply, HopRequest,
        health::{
            HealthCheckRequest, HealthCheckResponse,
            health_check_response::ServingStatus,
            health_server::{Health, HealthServer},
        },
        hop_server::{Hop, HopServer},
    },
    route::current_lane,
};
use tokio::net::TcpSocket;
use tonic::{Request, Response, Status};

/// What the instance is told on its command line.
struct Args {
    port: u16,
    name: String,
    grpc: bool,
    log: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut port, mut name, mut grpc, mut log) = (None, None, false, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = args.next().and_then(|p| p.parse().ok()),
            "--name" => name = args.next(),
            "--grpc" => grpc = true,
            "--log" => log = args.next(),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Args {
        port: port.ok_or("--port PORT is required")?,
        name: name.ok_or("--name NAME is required")?,
        grpc,
        log,
    })
}

#[derive(Clone)]
struct Instance {
    name: Arc<str>,
    log: Option<Arc<File>>,
}

async fn answer(State(me): State<Instance>, method: Method, body: Bytes) -> String {
    if method == Method::POST
        && let Some(log) = &me.log
    {
        let mut line = body.to_vec();
        line.push(b'\n');
        // One `write` of a short line: in the kernel before the answer leaves.
        (&**log).write_all(&line).expect("write the log");
    }
    me.name.to_string()
}

#[tonic::async_trait]
impl Hop for Instance {
    async fn call(&self, _: Request<HopRequest>) -> Result<Response<HopReply>, Status> {
        Ok(Response::new(HopReply {
            lane: current_lane(),
            route: String::new(),
            trail: vec![self.name.to_string()],
        }))
    }
}

#[tonic::async_trait]
impl Health for Instance {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        Ok(Response::new(HealthCheckResponse {
            status: ServingStatus::Serving as i32,
        }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let log = match &args.log {
        Some(path) => Some(Arc::new(
            OpenOptions::new().create(true).append(true).open(path)?,
        )),
        None => None,
    };
    let me = Instance {
        name: args.name.into(),
        log,
    };
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseport(true)?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], args.port)))?;
    let listener = socket.listen(1024)?;
    println!("listening");
    if args.grpc {
        tonic::transport::Server::builder()
            .layer(gray_tower::ExtractStainLayer::new())
            .add_service(HopServer::new(me.clone()))
            .add_service(HealthServer::new(me))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await?;
    } else {
        let app = Router::new().fallback(any(answer)).with_state(me);
        axum::serve(listener, app).await?;
    }
    Ok(())
}
