//! The peer links of a [`ZkEnsemble`](super::ZkEnsemble) built with
//! [`cuttable_peer_links`](super::ZkEnsembleBuilder::cuttable_peer_links): every member names the
//! others (`server.N=host:peerPort:electionPort`) through TCP proxies of its own, one per other
//! member and port, so that one member can be cut off from its peers while its client port stays
//! up, the way a follower behind a broken network link goes on serving its clients.
//!
//! A cut link goes silent rather than closing: bytes stop flowing both ways but the connections
//! stay open (what is read is dropped), as on a network whose packets no longer arrive; new
//! connections are refused. A follower cut off from the leader thus notices nothing until its
//! `syncLimit x tickTime` read timeout, and keeps answering its clients meanwhile.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How long a proxy waits for the member behind it to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One proxy: a listener on a free loopback port forwarding to `127.0.0.1:upstream`.
#[derive(Debug)]
struct Proxy {
    port: u16,
    state: Arc<ProxyState>,
}

#[derive(Debug, Default)]
struct ProxyState {
    /// Cut: open connections drop what they read, new ones are refused.
    silent: AtomicBool,
    stopped: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

impl ProxyState {
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

impl Proxy {
    fn start(upstream: u16) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(ProxyState::default());
        let accepting = state.clone();
        thread::Builder::new()
            .name(format!("zk-peer-link-{port}"))
            .spawn(move || accept(&listener, upstream, &accepting))?;
        Ok(Self { port, state })
    }

    fn set_silent(&self, silent: bool) {
        if !silent && self.state.silent.load(Ordering::Acquire) {
            // Connections that dropped bytes are broken: the members make new ones.
            self.state.close_all();
        }
        self.state.silent.store(silent, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Release);
        self.state.close_all();
        // Wakes the accept loop so that it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept(listener: &TcpListener, upstream: u16, state: &Arc<ProxyState>) {
    for conn in listener.incoming() {
        if state.stopped.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = conn else { continue };
        if state.silent.load(Ordering::Acquire) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) =
            TcpStream::connect_timeout(&([127, 0, 0, 1], upstream).into(), CONNECT_TIMEOUT)
        else {
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
                .name("zk-peer-link-pump".into())
                .spawn(move || pump(from, to, &state));
        }
    }
}

/// Copies `from` to `to` until either ends; while the link is silent, drops what it reads.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &ProxyState) {
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
    // A silent link passes on nothing, not even the end of a connection.
    if !state.silent.load(Ordering::Acquire) {
        let _ = to.shutdown(Shutdown::Both);
    }
    let _ = from.shutdown(Shutdown::Both);
}

/// The proxies of one ordered pair of members: `from` names `to` through them.
#[derive(Debug)]
struct Link {
    from: usize,
    to: usize,
    peer: Proxy,
    election: Proxy,
}

/// Every member's proxies to every other member (see the module documentation).
#[derive(Debug)]
pub(super) struct PeerLinks {
    /// `(peer, election)` ports each member listens on.
    ports: Vec<(u16, u16)>,
    links: Vec<Link>,
}

impl PeerLinks {
    /// Proxies for members listening on `ports` (`(peer, election)` of each member, in order).
    pub(super) fn start(ports: &[(u16, u16)]) -> io::Result<Self> {
        let mut links = Vec::new();
        for from in 0..ports.len() {
            for (to, &(peer, election)) in ports.iter().enumerate() {
                if from != to {
                    links.push(Link {
                        from,
                        to,
                        peer: Proxy::start(peer)?,
                        election: Proxy::start(election)?,
                    });
                }
            }
        }
        Ok(Self {
            ports: ports.to_vec(),
            links,
        })
    }

    /// The `server.N` lines of member `i`'s configuration: its own ports, and its proxies to the
    /// others.
    pub(super) fn server_lines(&self, i: usize) -> String {
        (0..self.ports.len())
            .map(|j| {
                let (peer, election) = match self.links.iter().find(|l| l.from == i && l.to == j) {
                    Some(l) => (l.peer.port, l.election.port),
                    None => self.ports[j],
                };
                format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1)
            })
            .collect()
    }

    /// Makes every link from and to member `i` silent (`true`) or lets them through again.
    pub(super) fn set_isolated(&self, i: usize, isolated: bool) {
        for l in self.links.iter().filter(|l| l.from == i || l.to == i) {
            l.peer.set_silent(isolated);
            l.election.set_silent(isolated);
        }
    }
}
