//! Shared pieces of the real-network test suite: servers on 127.0.0.1 ports (axum, and
//! the gRPC test protocol's with [`serve_hop`]) and the registry instances they are, the
//! echo handler that reports the stain a service saw, instance files, and [`until`], the
//! bounded poll that replaces fixed sleeps.

use std::net::SocketAddr;

use axum::{Router, http::HeaderMap};
use tokio::{net::TcpListener, task::JoinHandle};

pub mod load;
pub mod process;
pub mod route;

/// The gRPC test protocol (`proto/chain.proto`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("chain");

    /// The unary and streaming calls of the gRPC gateway tests (`proto/greeter.proto`).
    #[allow(missing_docs, unreachable_pub, clippy::all, clippy::must_use_candidate)]
    pub mod greeter {
        tonic::include_proto!("greeter");
    }

    /// gRPC's health checking protocol (`proto/health.proto`).
    #[allow(missing_docs, unreachable_pub, clippy::all, clippy::must_use_candidate)]
    pub mod health {
        tonic::include_proto!("grpc.health.v1");
    }
}

/// A server running on a loopback port; stopped when dropped.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    handle: JoinHandle<()>,
}

impl Server {
    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:port` followed by `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// A reqwest client for the loopback servers of the tests: no proxy, whatever the
/// environment says (an `HTTP_PROXY` or `ALL_PROXY` variable would otherwise send the tests'
/// loopback traffic to that proxy).
#[must_use]
pub fn reqwest_client() -> reqwest::Client {
    reqwest_builder().build().expect("a reqwest client")
}

/// The builder of [`reqwest_client`] (no proxy), for a timeout or a local address.
pub fn reqwest_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

/// Binds a free port on 127.0.0.1.
pub async fn loopback_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port")
}

/// Serves `router` on a free loopback port.
pub async fn serve(router: Router) -> Server {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().expect("local address");
    let handle = tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    Server { addr, handle }
}

/// What the last service of a chain saw, as reported by [`echo`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The lane of the task-local context (`None` when baseline).
    pub lane: Option<String>,
    /// The lane in the request extensions; must equal `lane`.
    pub extension_lane: Option<String>,
    /// The raw `x-gray-info` header.
    pub route: Option<String>,
    /// The raw `baggage` header.
    pub baggage: Option<String>,
}

impl Seen {
    /// Parses an [`echo`] body.
    #[must_use]
    pub fn parse(body: &str) -> Seen {
        let mut seen = Seen::default();
        for line in body.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = (!value.is_empty()).then(|| value.to_owned());
            match key {
                "lane" => seen.lane = value,
                "ext" => seen.extension_lane = value,
                "route" => seen.route = value,
                "baggage" => seen.baggage = value,
                _ => {}
            }
        }
        seen
    }
}

/// The handler of the last service: reports the stain it saw, one `key=value` a line.
pub async fn echo(stain: Option<axum::Extension<gray_core::Stain>>, headers: HeaderMap) -> String {
    let lane = gray_tower::task::current()
        .and_then(|c| c.lane().map(ToString::to_string))
        .unwrap_or_default();
    let ext = stain
        .and_then(|axum::Extension(c)| c.lane().map(ToString::to_string))
        .unwrap_or_default();
    let header = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "lane={lane}\next={ext}\nroute={}\nbaggage={}\n",
        header("x-gray-info"),
        header("baggage")
    )
}

impl Server {
    /// A server already running in `handle`, listening on `addr` (for servers other than
    /// axum's, such as a tonic gRPC server); aborted when dropped.
    #[must_use]
    pub fn running(addr: SocketAddr, handle: JoinHandle<()>) -> Server {
        Server { addr, handle }
    }

    /// This server as the instance `id` of a registry, labelled `labels`.
    #[must_use]
    pub fn instance(&self, id: &str, labels: &[(&str, &str)]) -> gray_discovery::Instance {
        gray_discovery::Instance::new(
            id.parse().expect("an instance id"),
            self.addr.to_string().parse().expect("an address"),
            gray_core::Labels::from_iter(labels.iter().copied()),
        )
    }
}

/// Serves `hop` (the gRPC test protocol) on a free loopback port, behind
/// `ExtractStainLayer`.
pub async fn serve_hop(hop: impl proto::hop_server::Hop) -> Server {
    let listener = loopback_listener().await;
    let addr = listener.local_addr().expect("local address");
    let handle = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(gray_tower::ExtractStainLayer::new())
            .add_service(proto::hop_server::HopServer::new(hop))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("serve gRPC");
    });
    Server::running(addr, handle)
}

/// Polls `check` every 10 ms, without sending anything, until it holds; fails the test,
/// naming `what`, when it does not within `within`. Returns how long it took.
pub async fn until(
    within: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> bool,
) -> std::time::Duration {
    let start = tokio::time::Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Writes `instances` of `service`, each `(id, address, gray)`, as gray-discovery's TOML
/// instance file at `path`, atomically (a temporary file renamed over it). No instance
/// writes `services = {}`: the file's explicit "none".
pub fn write_instances(
    path: &std::path::Path,
    service: &str,
    instances: &[(&str, SocketAddr, bool)],
) {
    let mut toml = String::new();
    for (id, address, gray) in instances {
        let labels = if *gray {
            "labels = { gray = true }\n"
        } else {
            ""
        };
        toml +=
            &format!("[[services.{service}]]\nid = \"{id}\"\naddress = \"{address}\"\n{labels}\n");
    }
    if instances.is_empty() {
        toml = "services = {}\n".to_owned();
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, toml).expect("write the instance file");
    std::fs::rename(&tmp, path).expect("rename the instance file");
}

pub use gray_test_support::logs::{Logs, capture as capture_logs};

/// A gateway (with an admin address when `admin`) routing one service, `svc`, whose one
/// instance, `svc-1`, is `upstream`; its configuration files live in the returned directory.
pub async fn one_instance_gateway(
    tag: &str,
    upstream: SocketAddr,
    admin: bool,
) -> (gray_gateway::Gateway, gray_test_support::TempDir) {
    let dir = gray_test_support::TempDir::new(tag);
    std::fs::write(
        dir.path().join("instances.toml"),
        format!("[[services.svc]]\nid = \"svc-1\"\naddress = \"{upstream}\"\n"),
    )
    .unwrap();
    let admin = if admin {
        "admin = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    std::fs::write(
        dir.path().join("gateway.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\n{admin}instances = \"instances.toml\"\n[services.svc]\n"
        ),
    )
    .unwrap();
    (start_gateway(dir.path()).await, dir)
}

/// The rules file of the gateway tests: a request with an `x-tester` header is put in the
/// lane `gray`.
pub const TESTERS_RULES: &str = "[[rules]]\nname = \"testers\"\nwhen = { header = { name = \"x-tester\", present = true } }\nlane = \"gray\"\n";

/// The text an admin API at `admin` answers to `GET path` (`/metrics`, `/explain?…`).
///
/// # Panics
///
/// When the admin API does not answer.
pub async fn admin_text(admin: SocketAddr, path: &str) -> String {
    reqwest_builder()
        .build()
        .expect("a client")
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .expect("the admin API answers")
        .text()
        .await
        .expect("a text body")
}

/// Starts a gateway from `dir`'s `gateway.toml` (its other files beside it).
///
/// # Panics
///
/// When the configuration is not valid or the gateway does not start.
pub async fn start_gateway(dir: &std::path::Path) -> gray_gateway::Gateway {
    let config =
        gray_gateway::config::Config::load(&dir.join("gateway.toml")).expect("a valid config");
    gray_gateway::Gateway::start(config)
        .await
        .expect("the gateway starts")
}
