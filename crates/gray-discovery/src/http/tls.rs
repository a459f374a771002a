//! TLS to instances (feature `tls`): [`Tls`], rustls over whatever the connector yields.

use std::{fmt, sync::Arc};

use http::uri::Authority;
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig,
    pki_types::{IpAddr, ServerName},
};

use super::{Protocol, transport::Secure};

/// TLS to the instances of [`HttpEndpoints`](super::HttpEndpoints) (feature `tls`), from a
/// rustls [`ClientConfig`]: which certificates to trust, a client certificate for mutual
/// TLS, the protocol versions. The endpoints set its ALPN protocols by their
/// [`Protocol`]: `http/1.1` for [`Protocol::Http1`], `h2` for [`Protocol::Http2`], both
/// (`h2` first) for [`Protocol::Auto`]; the ALPN protocols of the configuration you give
/// are replaced.
///
/// Which instances it applies to: those whose address is `https://host:port`, or every
/// instance with [`with_every_instance`](Tls::with_every_instance) (a registry that
/// records `host:port` only, for a service whose instances all serve TLS). The server
/// name checked against the certificate is the address's host (a DNS name or an IP
/// address), unless [`with_server_name`](Tls::with_server_name) overrides it.
///
/// Verification is rustls's: there is no switch here to turn it off. A configuration
/// built with rustls's `dangerous()` API is the only way, and it is yours to write.
///
/// ```
/// use std::sync::Arc;
/// use gray_discovery::http::{HttpEndpoints, Protocol, Tls, rustls};
///
/// let mut roots = rustls::RootCertStore::empty();
/// # let _ = &mut roots;
/// // roots.add(..) for each CA certificate the instances' certificates chain to
/// let config = rustls::ClientConfig::builder_with_provider(Arc::new(
///     rustls::crypto::ring::default_provider(),
/// ))
/// .with_safe_default_protocol_versions()?
/// .with_root_certificates(roots)
/// .with_no_client_auth();
/// let tls = Tls::new(config)
///     .with_server_name("orders.internal".try_into()?)
///     .with_every_instance(true);
/// assert!(tls.every_instance());
/// let endpoints = HttpEndpoints::<_, http_body_util::Empty<bytes::Bytes>>::new()
///     .with_tls(tls)
///     .with_protocol(Protocol::Auto);
/// # let _ = endpoints;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    every_instance: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .field("every_instance", &self.every_instance)
            .finish_non_exhaustive()
    }
}

// === impl Tls ===

impl Tls {
    /// TLS with `config`, for the `https://` instances.
    pub fn new(config: impl Into<Arc<ClientConfig>>) -> Self {
        Tls {
            config: config.into(),
            server_name: None,
            every_instance: false,
        }
    }

    /// Checks every instance's certificate against `name` rather than the host of its
    /// address (instances registered by IP address whose certificates name a service).
    #[must_use]
    pub fn with_server_name(mut self, name: ServerName<'static>) -> Self {
        self.server_name = Some(name);
        self
    }

    /// With `true`, every instance is reached over TLS, whatever the scheme of its
    /// address; with `false` (the default), only the `https://` ones.
    #[must_use]
    pub fn with_every_instance(mut self, every: bool) -> Self {
        self.every_instance = every;
        self
    }

    /// Whether every instance is reached over TLS.
    #[must_use]
    pub fn every_instance(&self) -> bool {
        self.every_instance
    }

    /// The configuration, as given (before the endpoints set its ALPN protocols).
    #[must_use]
    pub fn config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// This TLS with its ALPN protocols set for `protocol`.
    pub(crate) fn prepare(&self, protocol: Protocol) -> Prepared {
        let mut config = ClientConfig::clone(&self.config);
        config.alpn_protocols = match protocol {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::Http2 => vec![b"h2".to_vec()],
            Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        };
        Prepared {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name: self.server_name.clone(),
            every_instance: self.every_instance,
        }
    }
}

/// [`Tls`] ready for one protocol: what the endpoints share.
#[derive(Clone)]
pub(crate) struct Prepared {
    connector: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
    every_instance: bool,
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("server_name", &self.server_name)
            .field("every_instance", &self.every_instance)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// How the instance at `authority` is reached (`https`: its address says TLS).
    pub(crate) fn secure(&self, authority: &Authority, https: bool) -> Secure {
        if !https && !self.every_instance {
            return Secure::Plain;
        }
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => match server_name(authority) {
                Ok(name) => name,
                Err(reason) => return Secure::Refused(reason.into()),
            },
        };
        Secure::Tls(Target {
            connector: self.connector.clone(),
            name,
        })
    }
}

/// The server name of the host of `authority`: an IP address, or a DNS name.
fn server_name(authority: &Authority) -> Result<ServerName<'static>, String> {
    let host = authority.host();
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(ServerName::IpAddress(IpAddr::from(ip)));
    }
    ServerName::try_from(bare.to_owned()).map_err(|_| {
        format!("`{host}` is not a DNS name or an IP address a certificate can be checked against")
    })
}

/// A TLS session over the connector's IO, as hyper reads and writes it.
pub(crate) type Stream<IO> = TokioIo<tokio_rustls::client::TlsStream<TokioIo<IO>>>;

/// TLS to one instance.
#[derive(Clone)]
pub(crate) struct Target {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl Target {
    /// The handshake over `io`, and whether ALPN chose HTTP/2.
    pub(crate) async fn handshake<IO>(&self, io: IO) -> std::io::Result<(Stream<IO>, bool)>
    where
        IO: Read + Write + Unpin,
    {
        let stream = self
            .connector
            .connect(self.name.clone(), TokioIo::new(io))
            .await?;
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok((TokioIo::new(stream), h2))
    }
}
