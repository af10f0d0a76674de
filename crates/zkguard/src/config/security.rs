//! Security settings: ZooKeeper authentication (digest or SASL), the ACL of the nodes zkguard
//! creates, and TLS to ZooKeeper and Elasticsearch.

use std::fmt;
use std::path::{Path, PathBuf};

/// ZooKeeper authentication (`zookeeper.auth.*`).
///
/// Its `Debug` output hides the credentials.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkAuth {
    /// The ZooKeeper authentication scheme: `digest`, or `sasl` (SASL DIGEST-MD5).
    pub scheme: String,
    /// The credentials of the scheme, `user:password` (for `sasl` the user name and password
    /// that the server's JAAS `Server` section lists as `user_<name>="<password>"`).
    pub credentials: String,
}

impl ZkAuth {
    /// Digest authentication with `user:password`.
    pub fn digest(credentials: impl Into<String>) -> Self {
        Self {
            scheme: "digest".into(),
            credentials: credentials.into(),
        }
    }

    /// SASL DIGEST-MD5 authentication as `user` with `password` (`user` holds no `:`).
    pub fn sasl_digest_md5(user: &str, password: &str) -> Self {
        Self {
            scheme: "sasl".into(),
            credentials: format!("{user}:{password}"),
        }
    }

    /// Whether this is SASL (rather than digest) authentication.
    pub fn is_sasl(&self) -> bool {
        self.scheme == "sasl"
    }

    /// The password of the credentials (after the first `:`).
    pub fn password(&self) -> &str {
        self.credentials
            .split_once(':')
            .map_or("", |(_, password)| password)
    }

    /// The user name of the credentials (before the first `:`).
    pub fn user(&self) -> &str {
        self.credentials
            .split_once(':')
            .map_or(self.credentials.as_str(), |(user, _)| user)
    }
}

impl fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuth")
            .field("scheme", &self.scheme)
            .field("user", &self.user())
            .field("credentials", &"(hidden)")
            .finish()
    }
}

/// The ACL zkguard gives the nodes it creates (`zookeeper.acl`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZkAcl {
    /// `world:anyone` with every permission: any client may delete or overwrite lock nodes.
    Open,
    /// Every permission for the identities the creating session authenticated with, none for
    /// anyone else.
    Creator,
    /// An explicit list (`digest:ops:<hash>:cdrwa,world:anyone:r`).
    Explicit(Vec<ZkAclEntry>),
}

/// One entry of an explicit [`ZkAcl`]: `scheme:id:perms`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct ZkAclEntry {
    /// The scheme (`world`, `digest`, `ip`, `x509`, `sasl`).
    pub scheme: String,
    /// The id within the scheme (`anyone`, `ops:<base64 sha1>`, `10.0.0.0/8`).
    pub id: String,
    /// Permissions, a set of the letters `c` (create children), `d` (delete children), `r`
    /// (read), `w` (write data), `a` (admin), in that order.
    pub perms: String,
}

impl ZkAclEntry {
    /// Parses `scheme:id:perms` (the id may itself hold colons, as digest ids do).
    ///
    /// # Errors
    /// What is wrong with the entry.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (scheme, rest) = text
            .split_once(':')
            .ok_or_else(|| format!("`{text}` is not scheme:id:perms"))?;
        let (id, perms) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("`{text}` is not scheme:id:perms"))?;
        if scheme == "auth" {
            return Err(format!(
                "`{text}`: use zookeeper.acl=creator for the creator's identities"
            ));
        }
        if scheme.is_empty() || id.is_empty() {
            return Err(format!("`{text}` is not scheme:id:perms"));
        }
        if perms.is_empty() || !perms.chars().all(|c| "cdrwa".contains(c)) {
            return Err(format!(
                "`{text}`: permissions are letters among c, d, r, w, a"
            ));
        }
        let perms = "cdrwa".chars().filter(|c| perms.contains(*c)).collect();
        Ok(Self {
            scheme: scheme.to_string(),
            id: id.to_string(),
            perms,
        })
    }
}

impl fmt::Display for ZkAclEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.scheme, self.id, self.perms)
    }
}

/// TLS to ZooKeeper (`zookeeper.tls.*`): every server of `zookeeper.servers` is reached on its
/// TLS client port (`secureClientPort`), its certificate checked against `ca`, host name
/// included.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkTls {
    /// PEM file of the CA certificates that sign the servers' certificates.
    pub ca: PathBuf,
    /// PEM files of the client certificate chain and its private key, for servers that require
    /// client certificates (`ssl.clientAuth=need`).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl ZkTls {
    /// TLS whose server certificates are signed by the CA certificates in the PEM file `ca`.
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        Self {
            ca: ca.into(),
            client_cert: None,
        }
    }

    /// With a client certificate chain and its private key (PEM files).
    pub fn with_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }
}

/// TLS to Elasticsearch (`elasticsearch.tls.*`), used for `https://` URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EsTls {
    /// PEM bundle of CA certificates trusted besides the built-in (Mozilla) roots.
    pub ca: Option<PathBuf>,
    /// PEM files of a client certificate chain and its private key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Whether the server's certificate is verified (on unless `elasticsearch.tls.verify=false`).
    pub verify: bool,
}

impl Default for EsTls {
    fn default() -> Self {
        Self {
            ca: None,
            client_cert: None,
            verify: true,
        }
    }
}

/// What is wrong with a PEM file, as configuration errors say it (never its content).
pub(crate) fn check_pem_certificates(path: &Path) -> Result<usize, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let bytes = std::fs::read(path).map_err(|e| format!("a readable PEM file ({e})"))?;
    let mut count = 0;
    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| format!("a PEM file of certificates ({e})"))?;
        store
            .add(cert)
            .map_err(|e| format!("a PEM file of valid X.509 certificates ({e})"))?;
        count += 1;
    }
    if count == 0 {
        return Err(
            "a PEM file holding at least one certificate (-----BEGIN CERTIFICATE-----); none found"
                .into(),
        );
    }
    Ok(count)
}

/// What is wrong with a PEM private key file (never its content).
pub(crate) fn check_pem_private_key(path: &Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let bytes = std::fs::read(path).map_err(|e| format!("a readable PEM file ({e})"))?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        format!("a PEM file holding a private key (-----BEGIN PRIVATE KEY-----, RSA or EC); {e}")
    })?;
    rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map(|_| ())
        .map_err(|e| format!("a PEM file holding a usable RSA, EC or Ed25519 private key ({e})"))
}
