//! [`Partition`]: a network partition on demand between clients and ZooKeeper.

use std::io;

use super::relay;

/// A network partition on demand: TCP proxies between clients and the servers of a connect
/// string (`host:port,host:port[/chroot]`). Clients that connect through
/// [`Partition::connect_string`] reach the servers until [`Partition::cut`], which drops every
/// connection and refuses new ones, until [`Partition::heal`].
///
/// This is how tests (and the demo) make ZooKeeper expire a session for real: a client cut off
/// for longer than its session timeout loses its session on the server, exactly as after a long
/// GC pause or a network failure, and finds it expired when it comes back.
#[derive(Debug)]
pub struct Partition {
    connect_string: String,
    relays: Vec<relay::Relay>,
}

impl Partition {
    /// Starts one proxy per server of `servers`.
    ///
    /// # Errors
    /// When a listener cannot be bound on `127.0.0.1`.
    pub fn start(servers: &str) -> io::Result<Self> {
        let (hosts, chroot) = match servers.find('/') {
            Some(i) => servers.split_at(i),
            None => (servers, ""),
        };
        let relays = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|upstream| relay::Relay::start(upstream.to_string(), "zk-partition"))
            .collect::<io::Result<Vec<_>>>()?;
        let local: Vec<String> = relays
            .iter()
            .map(|r| format!("127.0.0.1:{}", r.port()))
            .collect();
        Ok(Self {
            connect_string: format!("{}{chroot}", local.join(",")),
            relays,
        })
    }

    /// The connect string clients use to go through the proxies.
    pub fn connect_string(&self) -> &str {
        &self.connect_string
    }

    /// Cuts every client off: open connections are dropped, new ones closed at once.
    pub fn cut(&self) {
        for r in &self.relays {
            r.set_refusing(true);
            r.close_all();
        }
    }

    /// Lets clients through again.
    pub fn heal(&self) {
        for r in &self.relays {
            r.set_refusing(false);
        }
    }

    /// Whether the partition is cut.
    pub fn is_cut(&self) -> bool {
        self.relays.iter().any(relay::Relay::is_refusing)
    }
}
