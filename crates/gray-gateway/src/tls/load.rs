//! Reading and checking the files of the `[tls]` table into a rustls `ServerConfig`: the
//! same checks at start-up, for `--check`, and for every new version of the files.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use rustls::{
    RootCertStore, ServerConfig, SupportedProtocolVersion,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
    sign::{CertifiedKey, SingleCertAndKey},
};

use super::validity::Validity;
use crate::config::{TlsSettings, TlsVersion};

/// What the application protocols are called in ALPN, in the order the gateway prefers.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A file of the `[tls]` table that cannot be used, and why.
#[derive(Debug)]
pub(crate) struct TlsError {
    /// The key naming the file (`cert_file`).
    field: &'static str,
    path: PathBuf,
    reason: String,
}

impl TlsError {
    fn new(field: &'static str, path: &Path, reason: impl fmt::Display) -> Self {
        TlsError {
            field,
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tls.{} {}: {}",
            self.field,
            self.path.display(),
            self.reason
        )
    }
}

impl std::error::Error for TlsError {}

/// The bytes of the files of a `[tls]` table: what a version of them is.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Files {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) client_ca: Option<Vec<u8>>,
}

impl fmt::Debug for Files {
    // Never the key's bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files").finish_non_exhaustive()
    }
}

impl Files {
    /// Reads the files `settings` names.
    pub(crate) fn read(settings: &TlsSettings) -> Result<Files, TlsError> {
        let read = |field, path: &Path| {
            std::fs::read(path)
                .map_err(|e| TlsError::new(field, path, format_args!("cannot read it: {e}")))
        };
        Ok(Files {
            cert: read("cert_file", &settings.cert_file)?,
            key: read("key_file", &settings.key_file)?,
            client_ca: match &settings.client_certs {
                Some(client) => Some(read("client_ca_file", &client.ca_file)?),
                None => None,
            },
        })
    }
}

/// A checked version of the files, ready to serve.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) config: Arc<ServerConfig>,
    /// The validity of the server's certificate.
    pub(crate) validity: Validity,
    /// The number of certificates in the chain (the server's included).
    pub(crate) chain: usize,
    /// The number of client CA certificates, when client certificates are verified.
    pub(crate) client_cas: Option<usize>,
}

/// Checks `files` (read from the paths in `settings`) at `now` and builds the server's
/// TLS configuration from them: the chain is PEM, its first certificate is valid at
/// `now`, the key is PEM, usable, and the first certificate's; the client CA file, if
/// any, holds certificates usable as trust anchors.
pub(crate) fn load(
    settings: &TlsSettings,
    files: &Files,
    now: SystemTime,
) -> Result<Loaded, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert_path = settings.cert_file.as_path();
    let key_path = settings.key_file.as_path();

    let chain = pem_certs("cert_file", cert_path, &files.cert)?;
    let validity = Validity::of(&chain[0]).map_err(|e| TlsError::new("cert_file", cert_path, e))?;
    validity
        .check(now)
        .map_err(|e| TlsError::new("cert_file", cert_path, e))?;
    let key = PrivateKeyDer::from_pem_slice(&files.key)
        .map_err(|e| TlsError::new("key_file", key_path, not_pem(&e, KEY_BLOCK)))?;
    let key = provider.key_provider.load_private_key(key).map_err(|e| {
        TlsError::new(
            "key_file",
            key_path,
            format_args!("not a usable private key: {e}"),
        )
    })?;
    let chain_len = chain.len();
    let certified = CertifiedKey::new(chain, key);
    match certified.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            return Err(TlsError::new(
                "key_file",
                key_path,
                format_args!(
                    "the private key does not match the certificate (the first of {})",
                    cert_path.display()
                ),
            ));
        }
        Err(e) => {
            return Err(TlsError::new(
                "key_file",
                key_path,
                format_args!("cannot check the key against the certificate: {e}"),
            ));
        }
    }

    let (verifier, client_cas) = match (&settings.client_certs, &files.client_ca) {
        (Some(client), Some(bytes)) => {
            let path = client.ca_file.as_path();
            let mut roots = RootCertStore::empty();
            let cas = pem_certs("client_ca_file", path, bytes)?;
            for (i, ca) in cas.into_iter().enumerate() {
                roots.add(ca).map_err(|e| {
                    TlsError::new(
                        "client_ca_file",
                        path,
                        format_args!("certificate {}: not usable as a CA: {e}", i + 1),
                    )
                })?;
            }
            let n = roots.len();
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            if !client.required {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::new("client_ca_file", path, e))?;
            (Some(verifier), Some(n))
        }
        _ => (None, None),
    };

    let versions: &[&SupportedProtocolVersion] = match settings.min_version {
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
        _ => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let config = build(provider, versions, verifier, certified)
        .map_err(|e| TlsError::new("cert_file", cert_path, e))?;
    Ok(Loaded {
        config: Arc::new(config),
        validity,
        chain: chain_len,
        client_cas,
    })
}

/// The server's configuration. A new one has a new session cache and new ticket keys: a
/// session of an earlier version of the files is never resumed, so every client after a
/// reload gets a full handshake with the new certificate.
fn build(
    provider: Arc<CryptoProvider>,
    versions: &[&'static SupportedProtocolVersion],
    verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    certified: CertifiedKey,
) -> Result<ServerConfig, rustls::Error> {
    let builder = ServerConfig::builder_with_provider(provider).with_protocol_versions(versions)?;
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // Stateless resumption tickets (as nginx's default): nothing stored per client.
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    Ok(config)
}

/// The certificates of the PEM file `path`: at least one.
fn pem_certs(
    field: &'static str,
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(field, path, not_pem(&e, CERT_BLOCK)))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            field,
            path,
            not_pem(&rustls::pki_types::pem::Error::NoItemsFound, CERT_BLOCK),
        ));
    }
    Ok(certs)
}

/// What a certificate file must hold.
const CERT_BLOCK: &str = "a `-----BEGIN CERTIFICATE-----` block";
/// What a key file must hold.
const KEY_BLOCK: &str =
    "a `-----BEGIN PRIVATE KEY-----` block (or `RSA PRIVATE KEY`, `EC PRIVATE KEY`)";

/// Why a PEM file did not give what it should (`expected`).
fn not_pem(e: &rustls::pki_types::pem::Error, expected: &str) -> String {
    match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("not PEM, or nothing usable in it: expected {expected}")
        }
        e => format!("not valid PEM: {e}"),
    }
}
