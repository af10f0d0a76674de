//! Access to the service: optional bearer tokens (`server.auth.tokens.file`, reloaded on SIGHUP,
//! compared in constant time, never logged) and HTTPS (`server.tls.cert`, `server.tls.key`,
//! rustls).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use subtle::ConstantTimeEq;
use tokio_rustls::TlsAcceptor;

use super::errors::ApiError;

/// The accepted bearer tokens, if authentication is on.
#[derive(Debug)]
pub struct Tokens {
    path: Option<PathBuf>,
    tokens: RwLock<Vec<Vec<u8>>>,
}

/// Why the tokens file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file cannot be read.
    #[error("cannot read the bearer tokens file {path} (server.auth.tokens.file): {source}; create it with one token per line, or unset the key")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file holds no token.
    #[error("the bearer tokens file {path} (server.auth.tokens.file) holds no token; put one token per line in it, or unset the key")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

fn read_tokens(path: &Path) -> Result<Vec<Vec<u8>>, TokensError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let tokens: Vec<Vec<u8>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.as_bytes().to_vec())
        .collect();
    if tokens.is_empty() {
        return Err(TokensError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(tokens)
}

/// Tokens shorter than this draw a warning ([`Tokens::warnings`]).
pub const MIN_TOKEN_LEN: usize = 16;

impl Tokens {
    /// Reads the tokens file, if one is configured.
    ///
    /// # Errors
    /// The file cannot be read or holds no token.
    pub fn load(path: Option<&Path>) -> Result<Self, TokensError> {
        let tokens = match path {
            Some(p) => read_tokens(p)?,
            None => Vec::new(),
        };
        Ok(Self {
            path: path.map(Path::to_path_buf),
            tokens: RwLock::new(tokens),
        })
    }

    /// What an operator should hear about the tokens file: readable by every user (anyone on
    /// the host could take a token), or tokens shorter than [`MIN_TOKEN_LEN`] characters (short
    /// enough to guess). Never shows a token.
    pub fn warnings(&self) -> Vec<String> {
        use std::os::unix::fs::PermissionsExt;
        let Some(path) = &self.path else {
            return Vec::new();
        };
        let mut warnings = Vec::new();
        if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0) {
            warnings.push(format!(
                "the tokens file {} (server.auth.tokens.file) holds secrets and every user may read it; restrict it (chmod 600 {})",
                path.display(),
                path.display()
            ));
        }
        let short = self
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|t| t.len() < MIN_TOKEN_LEN)
            .count();
        if short > 0 {
            warnings.push(format!(
                "{short} token{} shorter than {MIN_TOKEN_LEN} characters in {}: short tokens can be guessed; use long random ones (openssl rand -hex 32)",
                if short == 1 { " is" } else { "s are" },
                path.display()
            ));
        }
        warnings
    }

    /// Whether `headers` carry an accepted bearer token, or no token is needed at all.
    pub fn admits(&self, headers: &axum::http::HeaderMap) -> bool {
        !self.enabled()
            || headers
                .get(header::AUTHORIZATION)
                .and_then(|v| bearer(v.to_str().ok()?))
                .is_some_and(|t| self.accepts(t.as_bytes()))
    }

    /// Whether `presented` (a token as sent, without any scheme) is accepted, or no token is
    /// needed at all.
    pub fn admits_token(&self, presented: Option<&str>) -> bool {
        !self.enabled() || presented.is_some_and(|t| self.accepts(t.trim().as_bytes()))
    }

    /// Whether requests must carry a token.
    pub fn enabled(&self) -> bool {
        self.path.is_some()
    }

    /// Reads the file again (SIGHUP). On failure the tokens in use stay. Returns how many
    /// tokens are accepted now.
    ///
    /// # Errors
    /// The file cannot be read or holds no token.
    pub fn reload(&self) -> Result<usize, TokensError> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let fresh = read_tokens(path)?;
        let n = fresh.len();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(n)
    }

    /// Whether `presented` is one of the tokens. Every token is compared, each in constant
    /// time, so the answer's timing does not tell which bytes matched.
    fn accepts(&self, presented: &[u8]) -> bool {
        self.position(presented).is_some()
    }

    /// The position (from 1) of `presented` among the tokens, if it is one. Every token is
    /// compared, each in constant time.
    fn position(&self, presented: &[u8]) -> Option<usize> {
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        for (i, t) in tokens.iter().enumerate() {
            let equal: bool = t.as_slice().ct_eq(presented).into();
            if equal && found.is_none() {
                found = Some(i + 1);
            }
        }
        found
    }
}

/// Which accepted token a request carried: its position, from 1, among the tokens of
/// `server.auth.tokens.file` (what the log says of who acted; never the token itself). Set by
/// [`authenticate`] on the requests it lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential(pub usize);

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(value: &str) -> Option<&str> {
    value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
}

fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"zkguard\""),
    );
    response
}

/// Refuses API requests without an accepted bearer token (401), when tokens are configured.
pub async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !tokens.enabled() {
        return next.run(request).await;
    }
    let Some(value) = request.headers().get(header::AUTHORIZATION) else {
        return unauthorized(
            "this service requires a bearer token: send the header `Authorization: Bearer <token>` with a token from server.auth.tokens.file",
        );
    };
    let presented = value.to_str().ok().and_then(bearer);
    match presented {
        None => unauthorized(
            "the Authorization header is not a bearer token: send `Authorization: Bearer <token>`",
        ),
        Some(t) => match tokens.position(t.as_bytes()) {
            Some(n) => {
                request.extensions_mut().insert(Credential(n));
                next.run(request).await
            }
            None => unauthorized(
                "the bearer token is not accepted: use a token listed in server.auth.tokens.file",
            ),
        },
    }
}

/// Why HTTPS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be used.
    #[error("cannot use the certificate {path} (server.tls.cert): {detail}; give a PEM file with the server certificate first, then its chain")]
    Cert {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The key file cannot be used.
    #[error("cannot use the private key {path} (server.tls.key): {detail}; give a PEM file with the certificate's private key (PKCS#8, PKCS#1 or SEC1)")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

/// The rustls acceptor for `server.tls.cert` and `server.tls.key`.
///
/// # Errors
/// A file cannot be read or parsed, or the key does not fit the certificate.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let cert_err = |detail: String| TlsError::Cert {
        path: cert.to_path_buf(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_err("it holds no certificate".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        detail: e.to_string(),
    })?;
    // The provider is named: the rustls build holds two (ring, and aws-lc-rs for ZooKeeper's
    // client), so none is picked by default.
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        detail: e.to_string(),
    })?
    .with_no_client_auth()
    .with_single_cert(chain, private)
    .map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A tokens file every user may read, or a token short enough to guess, draws a warning
    /// naming the file (never the tokens); a private file of long tokens draws none.
    #[test]
    fn a_readable_tokens_file_or_a_short_token_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "short\nlong-enough-token-0123456789\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warnings = Tokens::load(Some(&file)).unwrap().warnings();
        let all = warnings.join("\n");
        assert_eq!(warnings.len(), 2, "{all}");
        assert!(
            all.contains("every user may read it") && all.contains("chmod 600"),
            "{all}"
        );
        assert!(
            all.contains("1 token is shorter than 16 characters"),
            "{all}"
        );
        assert!(
            !all.contains("short\n") && !all.contains("long-enough"),
            "{all}"
        );

        std::fs::write(&file, "long-enough-token-0123456789\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Tokens::load(Some(&file)).unwrap().warnings().is_empty());
    }
}
