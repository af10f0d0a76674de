//! TLS to ZooKeeper (`zookeeper.tls.*`): the client's TLS options, and a diagnosis of a failed
//! connection that names the TLS problem (the client only reports that no server answered).

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use zookeeper_client::TlsOptions;

use crate::config::ZkTls;
use crate::lock::LockError;

/// How long the diagnosis waits for a server's answers.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

fn read(path: &std::path::Path, key: &str) -> Result<String, LockError> {
    std::fs::read_to_string(path).map_err(|e| LockError::Backend {
        context: format!("reading {key}"),
        detail: format!("cannot read {}: {e}; check {key}", path.display()),
    })
}

fn bad_file(key: &str, e: impl std::fmt::Display) -> LockError {
    LockError::Backend {
        context: format!("reading {key}"),
        detail: format!("{e}; give a PEM file in {key}"),
    }
}

/// The client's TLS options for `tls`: the CA certificates, and the client certificate when one
/// is configured. Host names are verified (the client's default).
pub(super) fn options(tls: &ZkTls) -> Result<TlsOptions, LockError> {
    // The client builds its rustls configuration with the process's default provider, and the
    // rustls build holds two providers, so that none is the default until one is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = read(&tls.ca, "zookeeper.tls.ca")?;
    let mut options = TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| bad_file("zookeeper.tls.ca", e))?;
    if let Some((cert, key)) = &tls.client_cert {
        let (cert, key) = (
            read(cert, "zookeeper.tls.cert")?,
            read(key, "zookeeper.tls.key")?,
        );
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| bad_file("zookeeper.tls.cert and zookeeper.tls.key", e))?;
    }
    Ok(options)
}

/// The first server of a connect string, as `host` and `port` (2181 when not given).
fn first_server(servers: &str) -> Option<(String, u16)> {
    let (hosts, _) = crate::config::split_zk_chroot(servers);
    let first = hosts.split(',').next()?.trim();
    let first = first
        .strip_prefix("tcp+tls://")
        .or_else(|| first.strip_prefix("tcp://"))
        .unwrap_or(first);
    let (host, port) = match first.strip_prefix('[') {
        Some(rest) => {
            let (host, port) = rest.split_once(']')?;
            let port = match port.strip_prefix(':') {
                Some(p) => p.parse().ok()?,
                None => 2181,
            };
            (host, port)
        }
        None => match first.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (first, 2181),
        },
    };
    Some((host.to_string(), port))
}

/// A TLS handshake with the first server, as the client makes it: `Some(what failed)` when the
/// TLS layer fails (an unknown CA, a certificate that does not name the host, a client
/// certificate the server requires or refuses), `None` when it succeeds or the server cannot be
/// reached at all. Never shows key material.
pub(super) async fn diagnose(servers: &str, tls: &ZkTls) -> Option<String> {
    let (host, port) = first_server(servers)?;
    let tls = tls.clone();
    tokio::task::spawn_blocking(move || handshake(&host, port, &tls))
        .await
        .ok()
        .flatten()
}

fn handshake(host: &str, port: u16, tls: &ZkTls) -> Option<String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&tls.ca).ok()? {
        roots.add(cert.ok()?).ok()?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let config = match &tls.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .ok()?
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            let key = PrivateKeyDer::from_pem_file(key).ok()?;
            builder.with_client_auth_cert(chain, key).ok()?
        }
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(host.to_string()).ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .ok()?
        .next()?;
    let mut sock = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    sock.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    sock.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    let failed = |e: std::io::Error| {
        Some(format!(
            "the TLS handshake with {host}:{port} failed: {}",
            e.get_ref()
                .map_or_else(|| e.to_string(), |inner| inner.to_string())
        ))
    };
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut sock) {
            return if e.kind() == ErrorKind::InvalidData || e.get_ref().is_some() {
                failed(e)
            } else {
                None
            };
        }
    }
    // With TLS 1.3 a server that refuses the client's certificate (or its absence) says so after
    // the client has finished its part of the handshake: read its first answer.
    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
    let mut byte = [0u8; 1];
    stream.read(&mut byte).err().and_then(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::UnexpectedEof => None,
        _ if e.get_ref().is_some() => failed(e),
        _ => None,
    })
}
