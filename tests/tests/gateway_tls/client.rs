//! The Rust client of the TLS tests: rustls on `ring` (the workspace's one provider, passed
//! explicitly: no process-wide default), trusting one CA only, offering the given ALPN
//! protocols, with a client certificate if given; then hyper's HTTP/1.1 or HTTP/2 client
//! over the connection, as ALPN chose.
//!
//! Not reqwest: reqwest's `rustls-no-provider` feature, once on for one test crate, is on
//! for every reqwest client of the workspace (features are unified), and each of them would
//! then panic at construction unless a provider were installed first.

use std::{net::SocketAddr, sync::Arc};

use bytes::Bytes;
use gray_test_support::tls::{Ca, Issued};
use http::{Request, Version};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Connects to a TLS listener as `localhost`.
#[derive(Clone)]
pub(crate) struct TlsClient {
    connector: TlsConnector,
}

impl TlsClient {
    /// Trusts `ca` only; offers `alpn`; presents `identity` when asked for a certificate.
    pub(crate) fn new(ca: &Ca, alpn: &[&[u8]], identity: Option<&Issued>) -> TlsClient {
        let mut config = gray_test_support::https::client_config(ca, identity);
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
        }
    }

    /// A new connection to `addr`: what it sends requests with, and the certificate the
    /// server presented (DER).
    pub(crate) async fn connect(&self, addr: SocketAddr) -> Result<(Sender, Vec<u8>), BoxError> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let tls = self
            .connector
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (_, session) = tls.get_ref();
        let served = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| cert.to_vec())
            .unwrap_or_default();
        let h2 = session.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        let sender = if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Sender::H2(sender)
        } else {
            let (sender, conn) = http1::handshake(io).await?;
            tokio::spawn(conn);
            Sender::H1(sender)
        };
        Ok((sender, served))
    }
}

/// Sends requests over one connection.
pub(crate) enum Sender {
    H1(http1::SendRequest<Empty<Bytes>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

/// A response: its version, status and body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) version: Version,
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Answer {
    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

impl Sender {
    /// `GET path` with `headers`.
    pub(crate) async fn get(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, BoxError> {
        let mut request = Request::get(format!("https://localhost{path}"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = match self {
            Sender::H1(sender) => {
                sender.ready().await?;
                let request = request
                    .version(Version::HTTP_11)
                    .uri(path)
                    .header("host", "localhost")
                    .body(Empty::new())?;
                sender.send_request(request).await?
            }
            Sender::H2(sender) => {
                sender.ready().await?;
                let request = request.version(Version::HTTP_2).body(Empty::new())?;
                sender.send_request(request).await?
            }
        };
        let (version, status) = (response.version(), response.status().as_u16());
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Answer {
            version,
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}
