//! Certificates for TLS tests, made with `rcgen` (feature `tls`): a [`Ca`], and the
//! server and client certificates it [`issue`](Ca::issue)s, in PEM and DER, written to
//! files when a test needs paths.
//!
//! Keys are ECDSA P-256 (rcgen's default, on `ring`). Every call makes a new key, so two
//! CAs are unrelated: a certificate of one is refused by a peer that trusts the other, and
//! two certificates issued for the same names are told apart by their DER bytes.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use gray_test_support::{TempDir, tls::{Ca, Leaf}};
//!
//! let ca = Ca::new("test CA");
//! let server = ca.issue(&Leaf::server(&["localhost", "127.0.0.1"]));
//! let client = ca.issue(&Leaf::client("a client"));
//! assert!(server.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
//! assert!(client.key_pem().contains("PRIVATE KEY"));
//! assert_ne!(server.cert_der(), client.cert_der());
//!
//! // An expired certificate, for the checks that must refuse it.
//! let day = Duration::from_secs(86_400);
//! let now = SystemTime::now();
//! let expired = ca.issue(&Leaf::server(&["localhost"]).with_validity(now - 30 * day, now - day));
//!
//! let dir = TempDir::new("tls-doc");
//! let (cert, key) = expired.write(dir.path(), "expired");
//! assert!(cert.ends_with("expired.pem") && key.ends_with("expired-key.pem"));
//! assert_eq!(std::fs::read_to_string(&cert).unwrap(), expired.cert_pem());
//! ```

use std::{
    path::{Path, PathBuf},
    time::SystemTime,
};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority: a self-signed CA certificate and its key.
#[derive(Debug)]
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A new CA named `name` (its common name), with a new key.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().expect("generate the CA's key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign the CA");
        Ca { issuer }
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        self.issuer.der()
    }

    /// Writes the CA certificate to `dir/{stem}.pem` and returns the path.
    pub fn write(&self, dir: &Path, stem: &str) -> PathBuf {
        let path = dir.join(format!("{stem}.pem"));
        write(&path, &self.cert_pem());
        path
    }

    /// A new key and a certificate for it, signed by this CA, as `leaf` describes.
    pub fn issue(&self, leaf: &Leaf) -> Issued {
        let mut params = CertificateParams::new(leaf.names.clone()).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name.clone());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = leaf.usages.clone();
        if let Some((not_before, not_after)) = leaf.validity {
            params.not_before = not_before.into();
            params.not_after = not_after.into();
        }
        let key = KeyPair::generate().expect("generate a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign a certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            ca_pem: self.cert_pem(),
        }
    }
}

/// What a certificate is for: the names it is valid for, its use, its validity.
#[derive(Debug, Clone)]
pub struct Leaf {
    names: Vec<String>,
    common_name: String,
    usages: Vec<ExtendedKeyUsagePurpose>,
    validity: Option<(SystemTime, SystemTime)>,
}

impl Leaf {
    /// A server certificate for `names` (DNS names or IP addresses: `localhost`,
    /// `127.0.0.1`), the first being its common name; valid from 1975 to 4096 unless
    /// [`with_validity`](Leaf::with_validity) says otherwise.
    pub fn server(names: &[&str]) -> Leaf {
        Leaf {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            common_name: names.first().copied().unwrap_or("server").to_owned(),
            usages: vec![ExtendedKeyUsagePurpose::ServerAuth],
            validity: None,
        }
    }

    /// A client certificate with the common name `name`.
    pub fn client(name: &str) -> Leaf {
        Leaf {
            names: Vec::new(),
            common_name: name.to_owned(),
            usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
            validity: None,
        }
    }

    /// Valid from `not_before` to `not_after` (whole seconds).
    #[must_use]
    pub fn with_validity(mut self, not_before: SystemTime, not_after: SystemTime) -> Leaf {
        self.validity = Some((not_before, not_after));
        self
    }

    /// Usable as a client certificate too (etcd's members dial each other with theirs).
    #[must_use]
    pub fn with_client_auth(mut self) -> Leaf {
        if !self.usages.contains(&ExtendedKeyUsagePurpose::ClientAuth) {
            self.usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        self
    }
}

/// A certificate and its private key, issued by a [`Ca`].
#[derive(Debug, Clone)]
pub struct Issued {
    cert_pem: String,
    key_pem: String,
    cert_der: Vec<u8>,
    ca_pem: String,
}

impl Issued {
    /// The certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The certificate followed by its CA's: a chain, PEM.
    pub fn chain_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.ca_pem)
    }

    /// The private key, PEM (PKCS#8).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The certificate, DER: what a peer receives, to compare with what it was served.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Writes the certificate to `dir/{stem}.pem` and the key to `dir/{stem}-key.pem`;
    /// returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}-key.pem"));
        write(&cert, &self.cert_pem);
        write(&key, &self.key_pem);
        (cert, key)
    }
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
