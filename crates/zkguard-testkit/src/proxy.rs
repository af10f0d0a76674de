//! A ZooKeeper-aware TCP proxy that can cut a connection right after the server answered a
//! chosen request, so the client sees `ConnectionLoss` for a request that did happen, or right
//! before the server got it (the request never happens, the client sees the same error), or hold
//! the server's answers from a chosen request on (the server applies the requests that follow,
//! the client hears nothing) until the test lets them through.
//!
//! It reads ZooKeeper's framing only (a 4-byte length, then the request's `xid` and opcode), so
//! it needs nothing but `std`: one listener thread, and two threads per connection.
//!
//! ```no_run
//! use zkguard_testkit::proxy::{ZkProxy, OP_MULTI};
//! use zkguard_testkit::ZkServer;
//!
//! # fn demo() -> Result<(), zkguard_testkit::ServerError> {
//! let zk = ZkServer::builder().start()?;
//! let proxy = ZkProxy::start(&zk.connect_string());
//! // A client connected to `proxy.connect_string()` loses its connection right after the
//! // server applied its next multi, without hearing the answer.
//! proxy.cut_after(OP_MULTI);
//! # Ok(()) }
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// ZooKeeper's opcode of `create`.
pub const OP_CREATE: i32 = 1;
/// ZooKeeper's opcode of `delete`.
pub const OP_DELETE: i32 = 2;
/// ZooKeeper's opcode of `getData`.
pub const OP_GET_DATA: i32 = 4;
/// ZooKeeper's opcode of `multi` (a transaction of writes).
pub const OP_MULTI: i32 = 14;
/// ZooKeeper's opcode of `create2` (a create that answers with the node's stat).
pub const OP_CREATE2: i32 = 15;
/// ZooKeeper's opcode of `getChildren`.
pub const OP_GET_CHILDREN: i32 = 8;
/// ZooKeeper's opcode of `sync`.
pub const OP_SYNC: i32 = 9;
/// ZooKeeper's opcode of a ping (a session keeping itself alive).
pub const OP_PING: i32 = 11;
/// ZooKeeper's opcode of `getChildren2` (children and the parent's stat).
pub const OP_GET_CHILDREN2: i32 = 12;
/// ZooKeeper's opcode of `removeWatches`.
pub const OP_REMOVE_WATCHES: i32 = 18;
/// ZooKeeper's opcode of `multiRead` (a batch of reads).
pub const OP_MULTI_READ: i32 = 22;
/// In [`ZkProxy::requests`]: a new connection starts here.
pub const CONNECTED: i32 = i32::MIN;

/// The proxy: listens on a free loopback port and relays every connection to one ZooKeeper
/// server. Dropping it stops accepting connections.
#[derive(Debug)]
pub struct ZkProxy {
    port: u16,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    upstream: String,
    /// Opcode to cut after (0 = none).
    armed_op: AtomicI32,
    /// Opcode to cut before (0 = none).
    before_op: AtomicI32,
    /// How many cuts happened.
    cuts: AtomicUsize,
    stopped: AtomicBool,
    /// After a cut, refuse reconnections until `unblock`.
    block_after_cut: AtomicBool,
    blocked: AtomicBool,
    /// Opcode whose answer starts holding the answers (0 = none).
    hold_op: AtomicI32,
    /// How many requests with `hold_op` to let through before holding.
    hold_skip: AtomicUsize,
    /// While holding: the client's end of the held connection and the answers held, in order.
    held: Mutex<Option<(TcpStream, Vec<Vec<u8>>)>>,
    /// How many times holding started.
    holds: AtomicUsize,
    /// How many connections were relayed.
    connections: AtomicUsize,
    /// The opcode of every request relayed, in order, and [`CONNECTED`] where a connection
    /// starts.
    requests: Mutex<Vec<i32>>,
}

impl ZkProxy {
    /// Starts relaying to `upstream` (`host:port` of one ZooKeeper server).
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            upstream: upstream.to_string(),
            armed_op: AtomicI32::new(0),
            before_op: AtomicI32::new(0),
            cuts: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            block_after_cut: AtomicBool::new(false),
            blocked: AtomicBool::new(false),
            hold_op: AtomicI32::new(0),
            hold_skip: AtomicUsize::new(0),
            held: Mutex::new(None),
            holds: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
        });
        let st = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stopped.load(Ordering::Acquire) {
                    break;
                }
                let Ok(client) = conn else { continue };
                if st.blocked.load(Ordering::Acquire) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let st = st.clone();
                thread::spawn(move || relay(client, st));
            }
        });
        Self { port, state }
    }

    /// The proxy's address, as a ZooKeeper connect string (`127.0.0.1:PORT`).
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cut the next connection that sends a request with `op` once the server has answered it.
    pub fn cut_after(&self, op: i32) {
        self.state.armed_op.store(op, Ordering::Release);
    }

    /// Cut the next connection that sends a request with `op` instead of passing that request
    /// on: the server never sees it (nor anything sent behind it on that connection).
    pub fn cut_before(&self, op: i32) {
        self.state.before_op.store(op, Ordering::Release);
    }

    /// Like `cut_before`, and refuses reconnections after the cut until `unblock`.
    pub fn cut_before_and_block(&self, op: i32) {
        self.state.block_after_cut.store(true, Ordering::Release);
        self.cut_before(op);
    }

    /// Like `cut_after`, and refuses reconnections after the cut until `unblock`.
    pub fn cut_after_and_block(&self, op: i32) {
        self.state.block_after_cut.store(true, Ordering::Release);
        self.cut_after(op);
    }

    /// Accepts reconnections again after a `*_and_block` cut (and disarms the blocking).
    pub fn unblock(&self) {
        self.state.block_after_cut.store(false, Ordering::Release);
        self.state.blocked.store(false, Ordering::Release);
    }

    /// How many connections were cut so far.
    pub fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::Acquire)
    }

    /// From the answer to the next request with `op` on (that answer included), hold every
    /// answer of that connection; requests still reach the server, which applies them.
    pub fn hold_after(&self, op: i32) {
        self.state.hold_op.store(op, Ordering::Release);
    }

    /// As [`ZkProxy::hold_after`], from the answer to the request with `op` that comes after
    /// `skip` others with `op` (which pass).
    pub fn hold_after_skipping(&self, op: i32, skip: usize) {
        self.state.hold_skip.store(skip, Ordering::Release);
        self.state.hold_op.store(op, Ordering::Release);
    }

    /// The opcode of every request relayed so far, in order, with [`CONNECTED`] where a
    /// connection starts.
    pub fn requests(&self) -> Vec<i32> {
        self.state.requests.lock().unwrap().clone()
    }

    /// The opcodes of the requests relayed from position `from` of [`ZkProxy::requests`] on,
    /// without pings and session requests (authentication, watches set again: opcodes from 100
    /// on); [`CONNECTED`] marks stay.
    pub fn sent_since(&self, from: usize) -> Vec<i32> {
        self.state.requests.lock().unwrap()[from..]
            .iter()
            .copied()
            .filter(|&op| op != OP_PING && op < 100)
            .collect()
    }

    /// How many connections were relayed so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::Acquire)
    }

    /// How many times holding started.
    pub fn holds(&self) -> usize {
        self.state.holds.load(Ordering::Acquire)
    }

    /// Delivers the answers held, in order, and stops holding (or disarms `hold_after`, if
    /// holding had not started).
    pub fn release_held(&self) {
        self.state.hold_op.store(0, Ordering::Release);
        let mut held = self.state.held.lock().unwrap();
        if let Some((mut client, frames)) = held.take() {
            for f in frames {
                if client.write_all(&f).is_err() {
                    break;
                }
            }
        }
    }
}

impl Drop for ZkProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Release);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let n = i32::from_be_bytes(len).max(0) as usize;
    let mut buf = vec![0u8; 4 + n];
    buf[..4].copy_from_slice(&len);
    s.read_exact(&mut buf[4..]).ok()?;
    Some(buf)
}

fn relay(mut client: TcpStream, st: Arc<State>) {
    let Ok(mut server) = TcpStream::connect(&st.upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let drop_xid = Arc::new(AtomicI32::new(i32::MIN));
    let hold_xid = Arc::new(AtomicI32::new(i32::MIN));
    // server -> client
    {
        let mut c = client.try_clone().unwrap();
        let mut s = server.try_clone().unwrap();
        let drop_xid = drop_xid.clone();
        let hold_xid = hold_xid.clone();
        let st = st.clone();
        thread::spawn(move || {
            let mut first = true;
            let mut holding = false;
            while let Some(frame) = read_frame(&mut s) {
                if !first && frame.len() >= 8 {
                    let xid = i32::from_be_bytes(frame[4..8].try_into().unwrap());
                    if !holding && xid == hold_xid.load(Ordering::Acquire) {
                        holding = true;
                        st.holds.fetch_add(1, Ordering::AcqRel);
                        *st.held.lock().unwrap() = Some((c.try_clone().unwrap(), Vec::new()));
                    }
                    if holding {
                        let mut held = st.held.lock().unwrap();
                        if let Some((_, frames)) = held.as_mut() {
                            frames.push(frame);
                            continue;
                        }
                        // Released (or cut): from here on the answers flow again.
                        holding = false;
                        drop(held);
                    }
                    if xid == drop_xid.load(Ordering::Acquire) {
                        if st.block_after_cut.load(Ordering::Acquire) {
                            st.blocked.store(true, Ordering::Release);
                        }
                        st.cuts.fetch_add(1, Ordering::AcqRel);
                        let _ = c.shutdown(Shutdown::Both);
                        let _ = s.shutdown(Shutdown::Both);
                        return;
                    }
                }
                first = false;
                if c.write_all(&frame).is_err() {
                    break;
                }
            }
            let _ = c.shutdown(Shutdown::Both);
        });
    }
    // client -> server
    st.requests.lock().unwrap().push(CONNECTED);
    st.connections.fetch_add(1, Ordering::AcqRel);
    let mut first = true;
    while let Some(frame) = read_frame(&mut client) {
        if !first && frame.len() >= 12 {
            let xid = i32::from_be_bytes(frame[4..8].try_into().unwrap());
            let op = i32::from_be_bytes(frame[8..12].try_into().unwrap());
            st.requests.lock().unwrap().push(op);
            let before = st.before_op.load(Ordering::Acquire);
            if before != 0
                && op == before
                && st
                    .before_op
                    .compare_exchange(before, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                if st.block_after_cut.load(Ordering::Acquire) {
                    st.blocked.store(true, Ordering::Release);
                }
                st.cuts.fetch_add(1, Ordering::AcqRel);
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                return;
            }
            let armed = st.armed_op.load(Ordering::Acquire);
            if armed != 0
                && op == armed
                && st
                    .armed_op
                    .compare_exchange(armed, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                drop_xid.store(xid, Ordering::Release);
            }
            let hold = st.hold_op.load(Ordering::Acquire);
            let skipped = hold != 0
                && op == hold
                && st
                    .hold_skip
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_ok();
            if hold != 0
                && op == hold
                && !skipped
                && st
                    .hold_op
                    .compare_exchange(hold, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                hold_xid.store(xid, Ordering::Release);
            }
        }
        first = false;
        if server.write_all(&frame).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}
