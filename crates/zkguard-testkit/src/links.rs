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

use std::io;

use super::relay::Relay;

/// The proxies of one ordered pair of members: `from` names `to` through them.
#[derive(Debug)]
struct Link {
    from: usize,
    to: usize,
    peer: Relay,
    election: Relay,
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
                        peer: Relay::start(format!("127.0.0.1:{peer}"), "zk-peer-link")?,
                        election: Relay::start(format!("127.0.0.1:{election}"), "zk-peer-link")?,
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
                    Some(l) => (l.peer.port(), l.election.port()),
                    None => self.ports[j],
                };
                format!("server.{}=127.0.0.1:{peer}:{election}\n", j + 1)
            })
            .collect()
    }

    /// Makes every link from and to member `i` silent (`true`) or lets them through again.
    pub(super) fn set_isolated(&self, i: usize, isolated: bool) {
        for l in self.links.iter().filter(|l| l.from == i || l.to == i) {
            for relay in [&l.peer, &l.election] {
                if isolated {
                    relay.set_refusing(true);
                    relay.set_silent(true);
                } else {
                    // Connections that dropped bytes are broken: the members make new ones.
                    if relay.is_silent() {
                        relay.close_all();
                    }
                    relay.set_silent(false);
                    relay.set_refusing(false);
                }
            }
        }
    }
}
