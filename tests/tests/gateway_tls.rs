//! TLS at the gateway (the `[tls]` table), with real clients: curl over HTTP/2 and
//! HTTP/1.1, reqwest 0.12 (its rustls on `ring`) and a rustls client (hyper over
//! tokio-rustls, for the handshake details; see `client.rs` for why not reqwest 0.13), each
//! with the test CA as its only root. Requests are routed by the stain
//! and untrusted stains stripped as over plaintext; client certificates are verified when
//! asked for; certificates are rotated under load without a failed request.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Router, extract::State, http::HeaderMap, routing::any};
use gray_gateway::Gateway;
use gray_test_support::{
    TempDir, WAIT,
    tls::{Ca, Issued, Leaf},
};
use gray_tests::{Server, serve, until};

#[path = "gateway_tls/client.rs"]
mod client;

use client::TlsClient;

/// ALPN: HTTP/2 preferred, and HTTP/1.1 only.
const H2: &[&[u8]] = &[b"h2", b"http/1.1"];
const H1: &[&[u8]] = &[b"http/1.1"];

const TRUSTED: &str = "127.0.0.3";
const UNTRUSTED: &str = "127.0.0.4";

/// An instance that answers with its id and the headers it received.
async fn echo(id: &'static str) -> Server {
    async fn answer(State(id): State<&'static str>, headers: HeaderMap) -> String {
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect();
        serde_json::json!({ "id": id, "headers": headers }).to_string()
    }
    serve(Router::new().fallback(any(answer)).with_state(id)).await
}

struct Setup {
    gateway: Gateway,
    dir: TempDir,
    ca: Ca,
    _upstreams: Vec<Server>,
}

impl Setup {
    /// A gateway with a plaintext listener and a `[tls]` one (with `extra` keys), its
    /// certificate issued by `self.ca` for `localhost` and 127.0.0.1; `clients`' CA
    /// written to `clients.pem`.
    async fn start(tag: &str, extra: &str, clients: Option<&Ca>) -> Setup {
        Setup::start_with(tag, "", extra, clients).await
    }

    /// As [`Setup::start`], with `top` keys at the top of the configuration.
    async fn start_with(tag: &str, top: &str, extra: &str, clients: Option<&Ca>) -> Setup {
        let dir = TempDir::new(tag);
        let base = echo("svc-base").await;
        let gray = echo("svc-gray").await;
        gray_tests::write_instances(
            &dir.path().join("instances.toml"),
            "svc",
            &[
                ("svc-base", base.addr(), false),
                ("svc-gray", gray.addr(), true),
            ],
        );
        std::fs::write(
            dir.path().join("rules.toml"),
            "[[rules]]\nname = \"canary header\"\nwhen = { header = { name = \"x-canary\", exact = \"yes\" } }\nlane = \"gray\"\n",
        )
        .unwrap();
        let ca = Ca::new("gateway TLS test CA");
        ca.write(dir.path(), "ca");
        if let Some(clients) = clients {
            clients.write(dir.path(), "clients");
        }
        let (cert, key) = files(dir.path());
        write_pair(&cert, &key, &server_cert(&ca), Write::InPlace);
        std::fs::write(
            dir.path().join("gateway.toml"),
            format!(
                "{top}\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\ntrusted_clients = [\"{TRUSTED}/32\"]\nrules = \"rules.toml\"\ninstances = \"instances.toml\"\n\n[tls]\nlisten = \"127.0.0.1:0\"\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n{extra}\n[services.svc]\nfallback = \"baseline\"\n"
            ),
        )
        .unwrap();
        let gateway = gray_tests::start_gateway(dir.path()).await;
        Setup {
            gateway,
            dir,
            ca,
            _upstreams: vec![base, gray],
        }
    }

    fn https(&self, path: &str) -> String {
        let port = self.gateway.tls_addr().expect("a TLS listener").port();
        format!("https://localhost:{port}{path}")
    }

    fn tls_addr(&self) -> std::net::SocketAddr {
        self.gateway.tls_addr().expect("a TLS listener")
    }
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("cert.pem"), dir.join("key.pem"))
}

fn server_cert(ca: &Ca) -> Issued {
    ca.issue(&Leaf::server(&["localhost", "127.0.0.1"]))
}

/// How new certificate files are put in place.
#[derive(Debug, Clone, Copy)]
enum Write {
    /// Each written to a temporary file renamed over the old one.
    Atomically,
    /// Each truncated and written over.
    InPlace,
}

/// Writes a certificate chain and a key: the chain of `cert`, the key of `key`.
fn write_files(cert_path: &Path, key_path: &Path, cert: &Issued, key: &Issued, how: Write) {
    for (path, contents) in [
        (cert_path, cert.chain_pem()),
        (key_path, key.key_pem().to_owned()),
    ] {
        match how {
            Write::InPlace => std::fs::write(path, contents).unwrap(),
            Write::Atomically => {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, contents).unwrap();
                std::fs::rename(&tmp, path).unwrap();
            }
        }
    }
}

fn write_pair(cert: &Path, key: &Path, pair: &Issued, how: Write) {
    write_files(cert, key, pair, pair, how);
}

/// What curl got: the instance that answered, the headers it saw, the HTTP version.
struct Curled {
    id: String,
    headers: serde_json::Value,
    version: String,
}

/// `curl --cacert <the test CA> <version> --interface <from> <url>` with `headers`.
async fn curl(setup: &Setup, version: &str, from: &str, headers: &[&str]) -> Curled {
    let port = setup.gateway.tls_addr().unwrap().port();
    let mut command = tokio::process::Command::new("curl");
    command
        .args([
            "--silent",
            "--show-error",
            "--noproxy",
            "*",
            "--max-time",
            "20",
        ])
        .arg("--cacert")
        .arg(setup.dir.path().join("ca.pem"))
        .args([version, "--interface", from])
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(["--write-out", "\n%{http_version}"]);
    for header in headers {
        command.args(["--header", header]);
    }
    let out = command
        .arg(setup.https("/svc/a"))
        .output()
        .await
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "curl {version} {headers:?}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, version) = stdout.rsplit_once('\n').expect("the version line");
    let body: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    Curled {
        id: body["id"].as_str().unwrap().to_owned(),
        headers: body["headers"].clone(),
        version: version.to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reqwest_and_a_rustls_client_are_routed_by_the_stain_and_untrusted_stains_stripped() {
    let setup = Setup::start("gateway-tls-route", "", None).await;
    for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        // An untrusted client's stain: stripped, baseline.
        let forged = curl(&setup, flag, UNTRUSTED, &["x-gray-lane: gray"]).await;
        assert_eq!(
            (forged.id.as_str(), forged.version.as_str()),
            ("svc-base", version)
        );
        assert!(
            forged.headers.get("x-gray-lane").is_none(),
            "{}",
            forged.headers
        );
        // A rule stains it.
        let ruled = curl(&setup, flag, UNTRUSTED, &["x-canary: yes"]).await;
        assert_eq!(
            (ruled.id.as_str(), ruled.version.as_str()),
            ("svc-gray", version)
        );
        assert_eq!(ruled.headers["x-gray-lane"], "gray");
        // A trusted client's stain (the peer address is the client's, over TLS too).
        let trusted = curl(&setup, flag, TRUSTED, &["x-gray-lane: gray"]).await;
        assert_eq!(
            (trusted.id.as_str(), trusted.version.as_str()),
            ("svc-gray", version)
        );
    }

    // A Rust client with the test CA as its root: HTTP/2 by ALPN, and HTTP/1.1.
    for (alpn, version) in [(H2, http::Version::HTTP_2), (H1, http::Version::HTTP_11)] {
        let client = TlsClient::new(&setup.ca, alpn, None);
        let (mut conn, _) = client.connect(setup.tls_addr()).await.unwrap();
        for (header, value, id) in [
            ("x-gray-lane", "gray", "svc-base"),
            ("x-canary", "yes", "svc-gray"),
        ] {
            let answer = conn.get("/svc/a", &[(header, value)]).await.unwrap();
            assert_eq!(answer.version, version);
            let body = answer.json();
            assert_eq!(body["id"], id, "{header}: {body}");
            if id == "svc-base" {
                assert!(body["headers"].get("x-gray-lane").is_none(), "{body}");
            }
        }
    }

    // reqwest with the test CA as its only root (0.12, whose rustls runs on `ring`: 0.13's
    // needs aws-lc-rs or a provider installed before any client of the process is built).
    for (http1, version) in [
        (false, http::Version::HTTP_2),
        (true, http::Version::HTTP_11),
    ] {
        let ca = reqwest_ring::Certificate::from_pem(setup.ca.cert_pem().as_bytes()).unwrap();
        let mut builder = reqwest_ring::Client::builder()
            .no_proxy()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .resolve("localhost", setup.tls_addr())
            .timeout(WAIT);
        if http1 {
            builder = builder.http1_only();
        }
        let response = builder
            .build()
            .unwrap()
            .get(setup.https("/svc/a"))
            .header("x-canary", "yes")
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), version);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["id"], "svc-gray", "{body}");
    }

    // The plaintext listener serves beside it.
    let plain = gray_tests::reqwest_client()
        .get(format!("http://{}/svc/a", setup.gateway.addr()))
        .header("x-canary", "yes")
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = plain.json().await.unwrap();
    assert_eq!(body["id"], "svc-gray");

    // A client without a trusted root is refused by the handshake.
    let untrusting = TlsClient::new(&Ca::new("another CA"), H2, None);
    assert!(untrusting.connect(setup.tls_addr()).await.is_err());
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_keep_alive_connections_parked_between_requests_serve_the_next_ones() {
    // Every idle connection parked at once: its hyper connection and buffers dropped
    // after each response, the TLS stream kept.
    let setup = Setup::start_with("gateway-tls-park", "release_buffers_above = 0", "", None).await;
    let ca = reqwest_ring::Certificate::from_pem(setup.ca.cert_pem().as_bytes()).unwrap();
    let client = reqwest_ring::Client::builder()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .resolve("localhost", setup.tls_addr())
        .http1_only()
        .timeout(WAIT)
        .build()
        .unwrap();
    for i in 0..30 {
        let gray = i % 2 == 0;
        let request = client.get(setup.https("/svc/a"));
        let request = if gray {
            request.header("x-canary", "yes")
        } else {
            request
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_11);
        let body: serde_json::Value = response.json().await.unwrap();
        let want = if gray { "svc-gray" } else { "svc-base" };
        assert_eq!(body["id"], want, "request {i}: {body}");
    }
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_verified_when_required() {
    let clients = Ca::new("client CA");
    let setup = Setup::start(
        "gateway-tls-clients",
        "client_ca_file = \"clients.pem\"\nclient_auth = \"required\"\n",
        Some(&clients),
    )
    .await;
    let get = |client: TlsClient| {
        let addr = setup.tls_addr();
        // With TLS 1.3 the client's handshake ends before the server has checked its
        // certificate: a refusal may come at the first request.
        async move { client.connect(addr).await?.0.get("/svc/a", &[]).await }
    };
    for alpn in [H2, H1] {
        // No certificate, and one of another CA: refused.
        let none = get(TlsClient::new(&setup.ca, alpn, None)).await;
        assert!(none.is_err(), "served without a certificate: {none:?}");
        let stranger = Ca::new("another client CA").issue(&Leaf::client("stranger"));
        let other = get(TlsClient::new(&setup.ca, alpn, Some(&stranger))).await;
        assert!(
            other.is_err(),
            "served with another CA's certificate: {other:?}"
        );
        // The CA's own: served.
        let known = clients.issue(&Leaf::client("known"));
        let served = get(TlsClient::new(&setup.ca, alpn, Some(&known)))
            .await
            .expect("served with the CA's certificate");
        assert_eq!(served.status, 200);
        assert_eq!(served.json()["id"], "svc-base");
    }
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_certificates_serve_clients_without_one_but_verify_any_given() {
    let clients = Ca::new("client CA");
    let setup = Setup::start(
        "gateway-tls-optional",
        "client_ca_file = \"clients.pem\"\nclient_auth = \"optional\"\n",
        Some(&clients),
    )
    .await;
    let get = |client: TlsClient| {
        let addr = setup.tls_addr();
        async move { client.connect(addr).await?.0.get("/svc/a", &[]).await }
    };
    let none = get(TlsClient::new(&setup.ca, H2, None))
        .await
        .expect("served without a certificate");
    assert_eq!(none.status, 200);
    let stranger = Ca::new("another client CA").issue(&Leaf::client("stranger"));
    let other = get(TlsClient::new(&setup.ca, H2, Some(&stranger))).await;
    assert!(
        other.is_err(),
        "served with another CA's certificate: {other:?}"
    );
    let known = clients.issue(&Leaf::client("known"));
    let served = get(TlsClient::new(&setup.ca, H1, Some(&known)))
        .await
        .expect("served with the CA's certificate");
    assert_eq!(served.status, 200);
    setup.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_nothing_is_closed_after_the_handshake_timeout() {
    use tokio::io::AsyncReadExt;

    let setup = Setup::start("gateway-tls-silent", "handshake_timeout_ms = 300\n", None).await;
    let mut silent = tokio::net::TcpStream::connect(setup.gateway.tls_addr().unwrap())
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    // Well before `header_read_timeout` (10 s), which would close it too.
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed by handshake_timeout");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    setup.gateway.shutdown().await;
}

/// Clients sending requests in a loop until stopped: counts what they got, and the
/// certificate the last new connection was served.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    ok: AtomicUsize,
    failed: Mutex<Vec<String>>,
    /// The certificate (DER) of the last response on a new connection.
    served: Mutex<Vec<u8>>,
}

impl Load {
    /// A client that sends `GET /svc/a` to `addr` until stopped; `fresh`: on a new
    /// connection each time (else over one keep-alive connection).
    async fn run(self: Arc<Self>, client: TlsClient, addr: std::net::SocketAddr, fresh: bool) {
        let mut kept = None;
        while !self.stop.load(Ordering::Relaxed) {
            let result = async {
                let (conn, cert) = match kept.as_mut() {
                    Some(conn) => (conn, None),
                    None => {
                        let (conn, cert) = client.connect(addr).await?;
                        (kept.insert(conn), Some(cert))
                    }
                };
                let answer = conn.get("/svc/a", &[]).await?;
                if answer.status != 200 {
                    return Err(format!("status {}: {}", answer.status, answer.body).into());
                }
                Ok::<_, client::BoxError>(cert)
            }
            .await;
            if fresh {
                kept = None;
            }
            match result {
                Ok(cert) => {
                    self.ok.fetch_add(1, Ordering::Relaxed);
                    if let (true, Some(cert)) = (fresh, cert) {
                        *self.served.lock().unwrap() = cert;
                    }
                }
                Err(e) => self.failed.lock().unwrap().push(format!("{e:?}")),
            }
        }
    }

    /// Waits until a new connection is served `cert`, with requests still flowing.
    async fn until_served(&self, cert: &Issued, what: &str) {
        until(WAIT, what, || {
            *self.served.lock().unwrap() == cert.cert_der()
        })
        .await;
        let ok = self.ok.load(Ordering::Relaxed);
        until(WAIT, "requests flow", || {
            self.ok.load(Ordering::Relaxed) > ok + 20
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_under_load_without_a_failed_request() {
    let logs = gray_test_support::logs::capture_process();
    let setup = Setup::start("gateway-tls-rotate", "reload_interval_ms = 50\n", None).await;
    let (cert, key) = files(setup.dir.path());
    let load = Arc::new(Load::default());
    let clients = [
        // keep-alive: HTTP/2, HTTP/1.1
        (TlsClient::new(&setup.ca, H2, None), false),
        (TlsClient::new(&setup.ca, H1, None), false),
        // a new connection (a full handshake) per request
        (TlsClient::new(&setup.ca, H2, None), true),
        (TlsClient::new(&setup.ca, H1, None), true),
    ];
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(client, fresh)| tokio::spawn(load.clone().run(client, setup.tls_addr(), fresh)))
        .collect();

    // Renewed atomically, then in place: new handshakes get the new certificate.
    let second = server_cert(&setup.ca);
    write_pair(&cert, &key, &second, Write::Atomically);
    load.until_served(&second, "the certificate renamed into place is served")
        .await;
    let third = server_cert(&setup.ca);
    write_pair(&cert, &key, &third, Write::InPlace);
    load.until_served(&third, "the certificate written in place is served")
        .await;

    // A certificate with another's key: refused with an ERROR naming the key file; the
    // pair in force stays.
    let refused = |text: &str| {
        text.lines()
            .filter(|l| l.contains("ERROR") && l.contains(&*key.to_string_lossy()))
            .count()
    };
    let before = refused(&logs.text());
    write_files(
        &cert,
        &key,
        &server_cert(&setup.ca),
        &server_cert(&setup.ca),
        Write::InPlace,
    );
    until(WAIT, "the mismatched pair is refused", || {
        refused(&logs.text()) > before
    })
    .await;
    let line = logs
        .text()
        .lines()
        .rfind(|l| l.contains("ERROR") && l.contains(&*key.to_string_lossy()))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("the private key does not match the certificate"),
        "{line}"
    );
    assert!(line.contains("the previous ones stay in force"), "{line}");
    *load.served.lock().unwrap() = Vec::new();
    load.until_served(&third, "the pair in force is still served")
        .await;
    let metrics = gray_tests::reqwest_client()
        .get(format!(
            "http://{}/metrics",
            setup.gateway.admin_addr().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {metrics}"));
        line[name.len() + 1..].parse().unwrap()
    };
    // The first pair, the renamed one, the one written in place (and perhaps a half-written
    // version refused on the way).
    assert!(value("gray_gateway_tls_generation") >= 3, "{metrics}");
    assert!(value("gray_gateway_tls_rejected") >= 1, "{metrics}");

    load.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let failed = std::mem::take(&mut *load.failed.lock().unwrap());
    assert!(
        failed.is_empty(),
        "{} failed of {}: {failed:#?}",
        failed.len(),
        load.ok.load(Ordering::Relaxed)
    );
    setup.gateway.shutdown().await;
}
