//! ZooKeeper's four-letter words (`ruok`, `srvr`, `mntr`, `conf`, ...) over a plain TCP
//! connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::FOUR_LETTER_TIMEOUT;

/// Sends a ZooKeeper four-letter word (`ruok`, `srvr`, `mntr`, `conf`, ...) to `addr` and returns
/// the whole answer. The servers started here allow every word (`4lw.commands.whitelist=*`).
///
/// # Errors
///
/// When `cmd` is not four ASCII letters, when the server cannot be reached, or when it does not
/// answer within `timeout` (a paused server, for instance).
pub fn four_letter_word(
    addr: impl ToSocketAddrs,
    cmd: &str,
    timeout: Duration,
) -> io::Result<String> {
    if cmd.len() != 4 || !cmd.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{cmd}` is not a four-letter word: use one like ruok, srvr, mntr, conf, stat"),
        ));
    }
    let addr = addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(cmd.as_bytes())?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// Parses the answer of `mntr` (`key<TAB>value` lines).
pub fn parse_mntr(answer: &str) -> HashMap<String, String> {
    answer
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('\t')?;
            Some((key.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// The `Mode:` of a `srvr` answer (`standalone`, `leader`, `follower`), if the server is serving.
pub(super) fn srvr_mode(answer: &str) -> Option<String> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(|m| m.trim().to_owned())
}

/// `zk_packets_received` of the ZooKeeper at `addr` (see
/// [`ZkServer::packets_received`](super::ZkServer::packets_received)).
///
/// # Errors
///
/// When the server is unreachable or its `mntr` lacks the figure.
pub fn packets_received_at(addr: impl ToSocketAddrs) -> io::Result<u64> {
    let mntr = parse_mntr(&four_letter_word(addr, "mntr", FOUR_LETTER_TIMEOUT)?);
    mntr.get("zk_packets_received")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "mntr has no zk_packets_received",
            )
        })
}
