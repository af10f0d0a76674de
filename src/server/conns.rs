//! The connections of `zkguard serve`: how many stay open, and for how long a connection may say
//! nothing.
//!
//! - **Header and idle timeout** (`server.header.timeout`): a connection must send the complete
//!   headers of a request within this time of its opening (the TLS handshake included) or of its
//!   previous answer. Idle keep-alive connections, half-sent headers and slowloris senders are
//!   closed then. The body has its own limit (`server.body.timeout`, in the API's routes and in
//!   the gate's handler).
//! - **Connection limit** (`server.max.connections` on each address, lowered at start to fit
//!   the open-files limit, so that the service never runs out of descriptors; a gate connection
//!   counts twice, for the connection to the cluster a passed-through request holds beside
//!   it): a connection that arrives at the
//!   limit makes room by closing the longest-idle connection (one that is not handling a
//!   request: idle, or still sending headers). When every connection is busy, the newcomer gets a
//!   503 `too_many_connections` with `Retry-After` and is closed. Either way a log line says so
//!   (at most one a second) and a counter counts it, and `/healthz` keeps answering as long as
//!   one connection is not busy.
//!
//! ```text
//! accept ──▶ at the limit? ── no ──────────────────────────────▶ serve (HTTP/1.1, keep-alive)
//!                 │ yes                                              │ no headers within
//!                 ├─ an idle connection? ── close it, then ─────▶    │ server.header.timeout
//!                 └─ all busy: 503 too_many_connections, close       ▼ closed
//! ```

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use futures::StreamExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::Service;

use super::metrics::Metrics;

/// Descriptors kept free beside the connections: journal, ZooKeeper and Elasticsearch
/// connections (the store's, the gate's and the start-up checks' pools), log and dead-letter
/// files. 64 proved too few with the gate on: a flood of connections at start met the
/// service's own descriptors beyond it about once in three runs.
const RESERVED_FDS: u64 = 96;

/// Sockets of an address beyond its limit that may be open at once: connections evicted or
/// refused whose tasks have not ended yet (counted in [`RESERVED_FDS`]).
const CLOSING_SLACK: usize = 4;

/// One open connection, as the limit sees it.
#[derive(Debug, Default)]
struct Conn {
    /// Requests being handled (0: idle, or still sending headers).
    busy: AtomicUsize,
    /// Asks the connection to close at once.
    evict: Notify,
}

/// Marks an answer whose body is a stream that lasts (server-sent events): its connection stays
/// busy until the body ends, so that it is never closed to make room for a newcomer.
#[derive(Debug, Clone, Copy)]
pub struct Streaming;

/// Counts a request in its connection's `busy` while it lives.
struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The open connections, oldest first.
#[derive(Debug, Default)]
struct Open {
    next: u64,
    conns: BTreeMap<u64, Arc<Conn>>,
}

/// The connection loop's settings and counters.
#[derive(Debug)]
pub struct Connections {
    max: usize,
    header_timeout: Duration,
    open: Mutex<Open>,
    metrics: Arc<Metrics>,
    last_warning: Mutex<Option<Instant>>,
}

impl Connections {
    /// At most `max` connections (lowered to fit the open-files limit), each closed when it sends
    /// no request's headers within `header_timeout`.
    pub fn new(max: usize, header_timeout: Duration, metrics: Arc<Metrics>) -> Self {
        let fits = open_files_for(max as u64);
        if fits < max as u64 {
            warn_open_files(max, fits, fits as usize, "");
        }
        Self::fitted(max.min(fits as usize).max(1), header_timeout, metrics)
    }

    /// The API's and the gate's connections, at most `max` each, fitted together to the
    /// open-files limit. A gate connection counts twice: a request it passes through holds a
    /// connection to the cluster beside it. When they do not fit, both get the same share.
    pub fn pair(max: usize, header_timeout: Duration, metrics: Arc<Metrics>) -> (Self, Self) {
        let wanted = (max as u64).saturating_mul(3);
        let fits = open_files_for(wanted);
        let each = if fits >= wanted {
            max
        } else {
            let each = (fits / 3).max(1) as usize;
            warn_open_files(
                max,
                fits,
                each,
                " on each address, the gate's counting twice",
            );
            each
        };
        (
            Self::fitted(each, header_timeout, metrics.clone()),
            Self::fitted(each, header_timeout, metrics),
        )
    }

    fn fitted(max: usize, header_timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            max,
            header_timeout,
            open: Mutex::default(),
            metrics,
            last_warning: Mutex::new(None),
        }
    }

    /// The connection limit in force.
    pub fn max(&self) -> usize {
        self.max
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection if there is room, closing the longest-idle one at the limit;
    /// `None` when every connection is busy.
    fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.table();
        if open.conns.len() >= self.max {
            let idle = open
                .conns
                .iter()
                .find(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
                .map(|(id, _)| *id)?;
            if let Some(victim) = open.conns.remove(&idle) {
                victim.evict.notify_one();
            }
            self.metrics.connections_evicted.inc();
            self.warn("closed the longest-idle connection to make room for a new one");
        }
        let id = open.next;
        open.next += 1;
        let conn = Arc::new(Conn::default());
        open.conns.insert(id, conn.clone());
        self.metrics.connections.set(open.conns.len() as i64);
        Some((id, conn))
    }

    fn remove(&self, id: u64) {
        let mut open = self.table();
        open.conns.remove(&id);
        self.metrics.connections.set(open.conns.len() as i64);
    }

    /// A warning about the limit, at most one a second.
    fn warn(&self, what: &str) {
        let mut last = self.last_warning.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            *last = Some(Instant::now());
            tracing::warn!(
                max = self.max,
                evicted = self.metrics.connections_evicted.get(),
                refused = self.metrics.connections_refused.get(),
                "connection limit (server.max.connections) reached: {what}"
            );
        }
    }
}

/// Raises the soft open-files limit towards `wanted` descriptors beside the service's own (up
/// to the hard limit), and returns how many it leaves beside them; `wanted` when the limit
/// cannot be read.
fn open_files_for(wanted: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    let needed = wanted.saturating_add(RESERVED_FDS);
    let soft = if soft < needed && soft < hard {
        let raised = needed.min(hard);
        match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
            Ok(()) => raised,
            Err(_) => soft,
        }
    } else {
        soft
    };
    soft.saturating_sub(RESERVED_FDS).max(1)
}

/// Says that `max` connections do not fit the `fits` descriptors left, and that `kept` are kept
/// open (`per`: how they are counted).
fn warn_open_files(max: usize, fits: u64, kept: usize, per: &str) {
    tracing::warn!(
        max_connections = max,
        descriptors = fits,
        used = kept,
        "server.max.connections does not fit the open-files limit (ulimit -n) beside the service's own files: at most {kept} connections are kept open{per}; raise the limit (LimitNOFILE= in systemd) to keep more"
    );
}

/// The answer to a connection beyond the limit, every open one being busy.
const REFUSAL: &str = "{\"error\":\"too_many_connections\",\"message\":\"the service keeps its limit of connections open (server.max.connections) and every one is handling a request; retry after the Retry-After delay\"}";

/// Serves `app` on `listener` (through `tls` when given) until `stop` turns true, then lets the
/// open connections finish their requests (the caller bounds that with its drain timeout).
///
/// # Errors
/// None in practice: accept errors (such as running out of descriptors) are logged and retried.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    conns: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut tasks = JoinSet::new();
    // An evicted or refused connection keeps its descriptor until its task ends: accept no more
    // sockets at once than the limit and a few in their last moments, so that a flood of
    // connections never takes more descriptors than the limit was fitted to.
    let cap = conns.max + CLOSING_SLACK;
    loop {
        if tasks.len() >= cap {
            tokio::select! {
                _ = tasks.join_next() => continue,
                _ = stop.changed() => break,
            }
        }
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was accepted:
                    // back off a little rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        while tasks.try_join_next().is_some() {}
        let Some((id, conn)) = conns.admit() else {
            conns.metrics.connections_refused.inc();
            conns.warn("a new connection was refused with 503, every open one being busy");
            tasks.spawn(refuse(tcp, tls.is_some()));
            continue;
        };
        let (app, conns, tls, stop) = (app.clone(), conns.clone(), tls.clone(), stop.clone());
        tasks.spawn(async move {
            let timeout = conns.header_timeout;
            match tls {
                None => run(tcp, peer, app, &conns, &conn, stop, timeout).await,
                Some(acceptor) => {
                    let handshake = tokio::select! {
                        h = tokio::time::timeout(timeout, acceptor.accept(tcp)) => h,
                        _ = conn.evict.notified() => Ok(Err(io::Error::other("evicted"))),
                    };
                    match handshake {
                        Ok(Ok(stream)) => {
                            run(stream, peer, app, &conns, &conn, stop, timeout).await
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => {
                            conns.metrics.connections_timed_out.inc();
                            tracing::debug!(%peer, "TLS handshake timed out")
                        }
                    }
                }
            }
            conns.remove(id);
        });
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// The address of the client that sent a request (a request extension), for the log of
/// operators' actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// Serves one connection from `peer` until it closes, is evicted, or (on `stop`) has finished
/// its request.
async fn run<S>(
    stream: S,
    peer: std::net::SocketAddr,
    app: Router,
    conns: &Connections,
    conn: &Arc<Conn>,
    mut stop: watch::Receiver<bool>,
    header_timeout: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let counted = conn.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ClientAddr(peer));
        let mut app = app.clone();
        counted.busy.fetch_add(1, Ordering::AcqRel);
        let busy = Busy(counted.clone());
        async move {
            let mut response = app.call(request).await;
            if let Ok(r) = &mut response {
                if r.extensions().get::<Streaming>().is_some() {
                    // Busy until the stream ends, not only until its head is sent.
                    let body = std::mem::take(r.body_mut()).into_data_stream();
                    *r.body_mut() = axum::body::Body::from_stream(body.map(move |chunk| {
                        let _ = &busy;
                        chunk
                    }));
                }
            }
            response
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let ended = tokio::select! {
        r = connection.as_mut() => r,
        _ = conn.evict.notified() => return,
        _ = stop.changed() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        if e.is_timeout() {
            conns.metrics.connections_timed_out.inc();
            tracing::debug!(
                "closed a connection that sent no request's headers within server.header.timeout"
            );
        } else {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    }
}

/// Answers a connection beyond the limit with a 503 and closes it (plain HTTP; over TLS the
/// connection is closed without an answer, since a handshake would cost what the limit saves).
async fn refuse(mut tcp: TcpStream, tls: bool) {
    if !tls {
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{REFUSAL}",
            REFUSAL.len()
        );
        let _ =
            tokio::time::timeout(Duration::from_secs(1), tcp.write_all(answer.as_bytes())).await;
        let _ = tcp.shutdown().await;
    }
}
