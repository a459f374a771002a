//! TLS to etcd: [`EtcdTls`].

use std::{fmt, path::PathBuf};

use etcd_client::ConnectOptions;

use crate::SourceError;

/// PEM bytes, given or read from a file at each connection (so a renewed certificate is
/// picked up when the watch reconnects).
#[derive(Clone)]
enum Pem {
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::File(path) => write!(f, "{}", path.display()),
            Pem::Bytes(bytes) => write!(f, "<{} bytes of PEM>", bytes.len()),
        }
    }
}

/// TLS to etcd: the CA that signs the members' certificates, and optionally a client
/// certificate (for members started with `--client-cert-auth`). Needs the feature
/// `etcd-tls` to connect.
///
/// Files are read at each connection, so a renewed certificate is used from the next
/// reconnection on.
#[derive(Debug, Clone)]
#[non_exhaustive]
// Without `etcd-tls`, the settings are kept (and shown) but connecting refuses them.
#[cfg_attr(not(feature = "etcd-tls"), allow(dead_code))]
pub struct EtcdTls {
    ca: Pem,
    identity: Option<(Pem, Pem)>,
    server_name: Option<String>,
}

impl EtcdTls {
    /// Trusts the CA certificate(s) in the PEM file at `path`.
    pub fn ca_file(path: impl Into<PathBuf>) -> Self {
        EtcdTls {
            ca: Pem::File(path.into()),
            identity: None,
            server_name: None,
        }
    }

    /// Trusts the CA certificate(s) in `pem`.
    pub fn ca_pem(pem: impl Into<Vec<u8>>) -> Self {
        EtcdTls {
            ca: Pem::Bytes(pem.into()),
            identity: None,
            server_name: None,
        }
    }

    /// Presents the client certificate in the PEM file `cert`, with its key in `key`.
    #[must_use]
    pub fn with_identity_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.identity = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Presents the client certificate `cert` (PEM), with its key `key` (PEM).
    #[must_use]
    pub fn with_identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// Checks the members' certificates for `name` rather than the endpoint's host.
    #[must_use]
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    #[cfg(feature = "etcd-tls")]
    pub(super) async fn apply(
        &self,
        options: ConnectOptions,
    ) -> Result<ConnectOptions, SourceError> {
        use etcd_client::{Certificate, Identity, TlsOptions};

        async fn read(pem: &Pem, field: &'static str) -> Result<Vec<u8>, SourceError> {
            match pem {
                Pem::Bytes(bytes) => Ok(bytes.clone()),
                Pem::File(path) => {
                    tokio::fs::read(path)
                        .await
                        .map_err(|source| SourceError::Config {
                            field,
                            message: format!("cannot read {}: {source}", path.display()),
                        })
                }
            }
        }
        let mut tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(&self.ca, "tls.ca_file").await?));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(
                read(cert, "tls.cert_file").await?,
                read(key, "tls.key_file").await?,
            ));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        Ok(options.with_tls(tls))
    }

    #[cfg(not(feature = "etcd-tls"))]
    pub(super) async fn apply(
        &self,
        _options: ConnectOptions,
    ) -> Result<ConnectOptions, SourceError> {
        Err(SourceError::Config {
            field: "tls",
            message: "TLS to etcd needs gray-source's feature `etcd-tls`".into(),
        })
    }
}
