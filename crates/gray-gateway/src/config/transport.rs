//! A service's `protocol` key and `tls` table: how the gateway talks to its instances
//! (HTTP/1.1 or HTTP/2, cleartext or TLS), read into gray-discovery's `Protocol` and
//! `Tls` (a rustls client configuration on `ring`).

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use gray_config::Document;
use gray_discovery::http::{
    Protocol, Tls,
    rustls::{
        self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
        client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        crypto::CryptoProvider,
        pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
    },
};
use serde::Deserialize;

use super::ConfigError;

/// What `protocol` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum ProtocolKey {
    Http1,
    H2,
    H2c,
    Auto,
}

/// `[services.<name>.tls]`; see the crate docs, "Upstream TLS and HTTP/2".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsKeys {
    ca_file: Option<PathBuf>,
    server_name: Option<String>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// How the gateway reaches the instances of one service: the HTTP version, and TLS.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct UpstreamTransport {
    /// The HTTP version spoken to the instances (`protocol`).
    pub protocol: Protocol,
    /// TLS to every instance (`[services.<name>.tls]`); without it, the `https://`
    /// instances are checked against the system's trust store.
    pub tls: Option<Tls>,
    /// Whether `insecure_skip_verify = true`: certificates are not checked.
    pub insecure: bool,
}

/// The transport of the service `name`'s table; `base` resolves relative paths.
pub(super) fn transport(
    doc: &Document<'_>,
    name: &str,
    protocol: Option<ProtocolKey>,
    keys: Option<&TlsKeys>,
    base: &Path,
) -> Result<UpstreamTransport, ConfigError> {
    let field = |f: &str| format!("services.{name}.{f}");
    let protocol_key = protocol.unwrap_or(ProtocolKey::Http1);
    let protocol = match protocol_key {
        ProtocolKey::Http1 => Protocol::Http1,
        ProtocolKey::H2 | ProtocolKey::H2c => Protocol::Http2,
        ProtocolKey::Auto => Protocol::Auto,
    };
    let Some(keys) = keys else {
        return Ok(UpstreamTransport {
            protocol,
            tls: None,
            insecure: false,
        });
    };
    if protocol_key == ProtocolKey::H2c {
        return Err(doc.error(
            &field("protocol"),
            "`h2c` is HTTP/2 in cleartext, and this service has a `tls` table: use `h2` (or `auto`)",
        ));
    }
    let field = |f: &str| format!("services.{name}.tls.{f}");
    let resolve = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            base.join(p)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| doc.error(&format!("services.{name}.tls"), e))?;
    let builder = if keys.insecure_skip_verify {
        if keys.ca_file.is_some() {
            return Err(doc.error(
                &field("ca_file"),
                "`insecure_skip_verify = true` checks no certificate: a CA file would not be used",
            ));
        }
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
    } else {
        let roots = match &keys.ca_file {
            Some(path) => {
                let path = resolve(path);
                let mut roots = RootCertStore::empty();
                for cert in read_certs(&path).map_err(|e| doc.error(&field("ca_file"), e))? {
                    roots.add(cert).map_err(|e| {
                        doc.error(&field("ca_file"), format_args!("{}: {e}", path.display()))
                    })?;
                }
                roots
            }
            None => system_roots().as_ref().clone(),
        };
        builder.with_root_certificates(roots)
    };
    let config = match (&keys.cert_file, &keys.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let cert = resolve(cert);
            let key = resolve(key);
            let chain = read_certs(&cert).map_err(|e| doc.error(&field("cert_file"), e))?;
            let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| {
                doc.error(
                    &field("key_file"),
                    format_args!("{}: no private key read: {e}", key.display()),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                doc.error(
                    &field("key_file"),
                    format_args!("not the key of `cert_file`: {e}"),
                )
            })?
        }
        (Some(_), None) => {
            return Err(doc.error(
                &field("cert_file"),
                "a client certificate needs `key_file` too",
            ));
        }
        (None, Some(_)) => {
            return Err(doc.error(&field("key_file"), "a client key needs `cert_file` too"));
        }
    };
    let mut tls = Tls::new(config).with_every_instance(true);
    if let Some(server_name) = &keys.server_name {
        let parsed = ServerName::try_from(server_name.clone()).map_err(|_| {
            doc.error(
                &field("server_name"),
                format_args!("expected a DNS name or an IP address, found {server_name:?}"),
            )
        })?;
        tls = tls.with_server_name(parsed);
    }
    Ok(UpstreamTransport {
        protocol,
        tls: Some(tls),
        insecure: keys.insecure_skip_verify,
    })
}

/// The certificates of the PEM file at `path` (at least one).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// The system's trust store (what curl and `update-ca-certificates` use), read once.
/// Certificates it cannot parse are skipped; an empty store fails every handshake, which
/// says so.
pub(crate) fn system_roots() -> &'static Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::warn!(error = %e, "reading the system's trusted certificates");
        }
        let mut roots = RootCertStore::empty();
        let (_, ignored) = roots.add_parsable_certificates(found.certs);
        if ignored > 0 {
            tracing::debug!(ignored, "system certificates rustls cannot use");
        }
        Arc::new(roots)
    })
}

/// TLS for the `https://` instances of a service without a `tls` table: the system's
/// trust store, the address's host as the server name.
pub(crate) fn system_tls() -> Tls {
    static TLS: OnceLock<Tls> = OnceLock::new();
    TLS.get_or_init(|| {
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.with_root_certificates(system_roots().as_ref().clone())
                        .with_no_client_auth()
                })
                .unwrap_or_else(|_| unreachable!("ring supports TLS 1.2 and 1.3"));
        Tls::new(config)
    })
    .clone()
}

/// `insecure_skip_verify = true`: any certificate, for any name, is accepted. The
/// handshake's signatures are still checked (the peer holds the key of the certificate it
/// sent), so only the identity is not.
struct NoVerification(Arc<CryptoProvider>);

impl fmt::Debug for NoVerification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NoVerification")
    }
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
