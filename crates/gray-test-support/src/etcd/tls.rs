//! Certificates for a TLS etcd member, made by the test.

use std::path::PathBuf;

use etcd_client::{Certificate, Identity, TlsOptions};

use crate::{
    TempDir,
    tls::{Ca, Leaf},
};

/// A fresh CA, a server certificate for `127.0.0.1` and `localhost`, and a client
/// certificate, all PEM, also written to files (removed on drop). Two calls make two
/// unrelated CAs: the second's client certificate is one a member of the first refuses.
#[derive(Debug)]
pub struct Tls {
    dir: TempDir,
    ca: String,
    client_cert: String,
    client_key: String,
}

impl Tls {
    /// Generates a new CA and the certificates it signs.
    pub fn generate() -> Tls {
        let ca = Ca::new("gray test CA");
        // etcd's own gateway dials the server with the server certificate: it needs both
        // usages.
        let server = ca.issue(&Leaf::server(&["127.0.0.1", "localhost"]).with_client_auth());
        let client = ca.issue(&Leaf::client("gray-client"));
        let tls = Tls {
            dir: TempDir::new("tls"),
            ca: ca.cert_pem(),
            client_cert: client.cert_pem().to_owned(),
            client_key: client.key_pem().to_owned(),
        };
        for (file, pem) in [
            (tls.ca_file(), tls.ca.as_str()),
            (tls.server_cert_file(), server.cert_pem()),
            (tls.server_key_file(), server.key_pem()),
            (tls.client_cert_file(), tls.client_cert.as_str()),
            (tls.client_key_file(), tls.client_key.as_str()),
        ] {
            std::fs::write(&file, pem).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        }
        tls
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The client certificate (PEM).
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert
    }

    /// The client certificate's private key (PEM).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The client certificate's file.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client key's file.
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("client-key.pem")
    }

    pub(super) fn server_cert_file(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    pub(super) fn server_key_file(&self) -> PathBuf {
        self.dir.path().join("server-key.pem")
    }

    /// etcd-client's TLS options: trust this CA, present this client certificate.
    pub fn client_options(&self) -> TlsOptions {
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.client_cert, &self.client_key))
    }
}
