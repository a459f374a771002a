//! Certificates for a TLS etcd member, made by the test.

use std::path::PathBuf;

use etcd_client::{Certificate, Identity, TlsOptions};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::TempDir;

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

fn issue(
    name: &str,
    sans: &[&str],
    usages: &[ExtendedKeyUsagePurpose],
    ca: &CertifiedIssuer<'_, KeyPair>,
) -> (String, String) {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("valid subject alternative names");
    params.distinguished_name.push(DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages.push(KeyUsagePurpose::DigitalSignature);
    params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
    params.extended_key_usages = usages.to_vec();
    let key = KeyPair::generate().expect("generate a key pair");
    let cert = params.signed_by(&key, ca).expect("sign a certificate");
    (cert.pem(), key.serialize_pem())
}

impl Tls {
    /// Generates a new CA and the certificates it signs.
    pub fn generate() -> Tls {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "gray test CA");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("self-sign the CA");
        // etcd's own gateway dials the server with the server certificate: it needs both
        // usages.
        let (server_cert, server_key) = issue(
            "127.0.0.1",
            &["127.0.0.1", "localhost"],
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &ca,
        );
        let (client_cert, client_key) = issue(
            "gray-client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
            &ca,
        );
        let tls = Tls {
            dir: TempDir::new("tls"),
            ca: ca.as_ref().pem(),
            client_cert,
            client_key,
        };
        for (file, pem) in [
            (tls.ca_file(), tls.ca.as_str()),
            (tls.server_cert_file(), server_cert.as_str()),
            (tls.server_key_file(), server_key.as_str()),
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
