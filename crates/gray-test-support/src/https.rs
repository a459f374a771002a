//! HTTP upstreams on loopback (feature `https`): each answers `NAME VERSION PATH lane=LANE`
//! (its name, the HTTP version the request arrived in, the path and query, the
//! `x-gray-lane` header), speaks HTTP/1.1 and HTTP/2 (h2c by prior knowledge in cleartext,
//! ALPN over TLS), and counts the connections it accepted.
//!
//! ```
//! use gray_test_support::{https::{server_config, Upstream}, tls::{Ca, Leaf}};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let ca = Ca::new("test CA");
//! let cert = ca.issue(&Leaf::server(&["localhost", "127.0.0.1"]));
//! let upstream = Upstream::start("a", Some(server_config(&cert, None))).await;
//! assert_eq!(upstream.accepted(), 0);
//! assert!(upstream.addr().ip().is_loopback());
//! # });
//! ```

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};

use crate::tls::{Ca, Issued};

/// A rustls client configuration on `ring` trusting `ca` only, presenting `identity` when a
/// server asks for a certificate (no ALPN: set `alpn_protocols` for that).
///
/// # Panics
///
/// On a certificate or key that rcgen made and rustls refuses (never seen).
#[must_use]
pub fn client_config(ca: &Ca, identity: Option<&Issued>) -> rustls::ClientConfig {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert_der().to_vec()))
        .expect("the CA's certificate");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports TLS 1.2 and 1.3")
    .with_root_certificates(roots);
    match identity {
        None => builder.with_no_client_auth(),
        Some(issued) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(issued.cert_der().to_vec())],
                PrivateKeyDer::from_pem_slice(issued.key_pem().as_bytes()).expect("the key"),
            )
            .expect("a certificate and its key"),
    }
}

/// A rustls server configuration on `ring` serving `cert` (ALPN `h2`, then `http/1.1`);
/// with `client_ca`, clients must present a certificate that CA issued.
pub fn server_config(cert: &Issued, client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports TLS 1.2 and 1.3");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots
                .add(CertificateDer::from(ca.cert_der().to_vec()))
                .expect("a CA certificate");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let key = private_key(cert);
    let mut config = builder
        .with_single_cert(vec![CertificateDer::from(cert.cert_der().to_vec())], key)
        .expect("a certificate and its key");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The key of `cert`, DER.
fn private_key(cert: &Issued) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(cert.key_pem().as_bytes()).expect("rcgen's PEM key")
}

/// A running upstream; see the [module docs](self).
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
}

impl Upstream {
    /// Starts the upstream `name` on a free loopback port: TLS with `tls`, else cleartext.
    pub async fn start(name: &'static str, tls: Option<Arc<ServerConfig>>) -> Upstream {
        let handshakes = Arc::new(AtomicUsize::new(0));
        let done = handshakes.clone();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let (addr, accepted) = crate::net::serve(move |stream| {
            let acceptor = acceptor.clone();
            let done = done.clone();
            async move {
                let service = service_fn(move |req: Request<Incoming>| async move {
                    let lane = req
                        .headers()
                        .get("x-gray-lane")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    let body = format!(
                        "{name} {:?} {} lane={lane}",
                        req.version(),
                        req.uri().path()
                    );
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                    Some(acceptor) => {
                        // A handshake the client gives up on is the test's point, not an
                        // error here.
                        let Ok(tls) = acceptor.accept(stream).await else {
                            return;
                        };
                        done.fetch_add(1, Ordering::SeqCst);
                        let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                    }
                }
            }
        })
        .await;
        Upstream {
            addr,
            accepted,
            handshakes,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections it accepted so far (TCP, whether or not TLS followed).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The TLS handshakes that succeeded so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}
