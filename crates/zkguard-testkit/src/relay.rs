//! A TCP relay on a free loopback port: forwards every connection to an upstream address, and
//! on demand refuses new connections, drops what it reads (a link gone silent: the connections
//! stay open but no byte arrives, as on a network whose packets are lost), or closes every
//! connection. [`Partition`](super::Partition) and the cuttable peer links of an ensemble are
//! built of them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How long a relay waits for its upstream to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One relay; dropping it closes its connections and stops it.
#[derive(Debug)]
pub(super) struct Relay {
    port: u16,
    state: Arc<RelayState>,
}

#[derive(Debug, Default)]
struct RelayState {
    /// New connections are closed at once.
    refusing: AtomicBool,
    /// Open connections drop what they read.
    silent: AtomicBool,
    stopped: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

impl Relay {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`), in threads
    /// named after `name`.
    pub(super) fn start(upstream: String, name: &str) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(RelayState::default());
        let accepting = state.clone();
        let name = name.to_string();
        thread::Builder::new()
            .name(format!("{name}-{port}"))
            .spawn(move || accept(&listener, &upstream, &name, &accepting))?;
        Ok(Self { port, state })
    }

    /// The port it listens on.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// Closes every open connection.
    pub(super) fn close_all(&self) {
        self.state.close_all();
    }

    /// Closes new connections at once (`true`), or forwards them again.
    pub(super) fn set_refusing(&self, refusing: bool) {
        self.state.refusing.store(refusing, Ordering::Release);
    }

    /// Whether new connections are closed at once.
    pub(super) fn is_refusing(&self) -> bool {
        self.state.refusing.load(Ordering::Acquire)
    }

    /// Whether open connections drop what they read (and pass on no end of connection).
    pub(super) fn set_silent(&self, silent: bool) {
        self.state.silent.store(silent, Ordering::Release);
    }

    /// Whether open connections drop what they read.
    pub(super) fn is_silent(&self) -> bool {
        self.state.silent.load(Ordering::Acquire)
    }
}

impl RelayState {
    fn close_all(&self) {
        for s in self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Release);
        self.state.close_all();
        // Wakes the accept loop so that it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Connects to the first address of `upstream` that accepts.
fn connect(upstream: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{upstream}: no address"));
    for addr in upstream.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn accept(listener: &TcpListener, upstream: &str, name: &str, state: &Arc<RelayState>) {
    for conn in listener.incoming() {
        if state.stopped.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = conn else { continue };
        if state.refusing.load(Ordering::Acquire) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = connect(upstream) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut open = state.open.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|s| s.peer_addr().is_ok());
            for s in [&client, &server] {
                if let Ok(c) = s.try_clone() {
                    open.push(c);
                }
            }
        }
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            let state = state.clone();
            let _ = thread::Builder::new()
                .name(format!("{name}-pump"))
                .spawn(move || pump(from, to, &state));
        }
    }
}

/// Copies `from` to `to` until either ends; while the relay is silent, drops what it reads.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &RelayState) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if state.silent.load(Ordering::Acquire) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    // A silent relay passes on nothing, not even the end of a connection.
    if !state.silent.load(Ordering::Acquire) {
        let _ = to.shutdown(Shutdown::Both);
    }
    let _ = from.shutdown(Shutdown::Both);
}
