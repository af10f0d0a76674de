//! Request sizes: every multi zkguard sends stays within `zookeeper.max.request.bytes`.
//!
//! ZooKeeper refuses a request larger than its `jute.maxbuffer` (1 MiB by default, a server
//! system property) by logging `Len error` and closing the connection: every request in flight
//! on it is lost, and after the loss grace every lock held on the session. A session's
//! concurrent acquisitions and releases go to ZooKeeper together, many in one multi
//! (`zk::batch`, `zk::release_batch`, `LockGuard::release_together`): those multis are cut by the
//! bytes of their operations, estimated here from above (each path, data and ACL as the client
//! writes them, plus more than the fixed fields of jute's encoding take). One acquisition's own
//! requests (its fast path, with the release it may carry) are checked before anything is sent
//! ([`Limit::check_acquisition`]), so that a part that goes alone always fits.

use zookeeper_client::{Acl, Client};

use super::driver::{create_path, path_of};
use super::node::Paths;
use super::protocol::Op;
use crate::lock::{LockError, MAX_MONITOR_LEN};

/// Bytes of a multi besides its operations, rounded up: the frame's length, the request header
/// (xid, type), the closing header (type, done, error): 21 in jute.
pub(super) const MULTI_FRAME: usize = 64;

/// Bytes of one operation besides its path, data and ACL, rounded up: its header in the multi
/// (type, done, error), the lengths of the path, the data and the ACL list, the version, the
/// create flags and a TTL: 41 at most in jute.
const PER_OP: usize = 64;

/// Bytes of one ACL entry besides its scheme and id, rounded up: the permissions and the two
/// lengths (12 in jute).
const PER_ACL: usize = 16;

/// The most operations of one acquisition's multi: its fast path (six, the lock root's `setData`
/// included) after the release of a lock it carries (four), with room to spare.
const ACQUISITION_OPS: usize = 12;

/// Bytes a holder's mutex data may take beyond its queue node's: the name of its queue node
/// (`"node":"<prefix>-0000000012"`, the prefix at most 32 bytes) and the promotion flag.
const MUTEX_EXTRA: usize = 128;

/// Bytes a queue node's data may take beyond its first: the promotion flag (`"promoted":true`).
const PROMOTED: usize = 32;

/// The size limit of one session's requests, with what every path of it carries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    /// `zookeeper.max.request.bytes`.
    max: usize,
    /// The chroot the client puts before every path.
    chroot: usize,
}

impl Limit {
    /// The limit `max` for the requests of `client` (whose chroot prefixes every path).
    pub(super) fn of(client: &Client, max: usize) -> Self {
        Self {
            max,
            chroot: client.path().len(),
        }
    }

    /// The bytes operations may take in one multi.
    pub(super) fn budget(&self) -> usize {
        self.max.saturating_sub(MULTI_FRAME)
    }

    /// Whether operations of `bytes` fit a multi of their own.
    pub(super) fn fits(&self, bytes: usize) -> bool {
        bytes <= self.budget()
    }

    /// Bytes of one operation on a path of `path` bytes carrying `data` bytes, creating with an
    /// ACL of `acl` bytes.
    fn op(&self, path: usize, data: usize, acl: usize) -> usize {
        PER_OP + self.chroot + path + data + acl
    }

    /// Bytes of the core operations `ops` on the monitor of `paths`, with their data `bytes`
    /// (one per operation).
    pub(super) fn ops(&self, paths: &Paths, ops: &[Op], bytes: &[Vec<u8>]) -> usize {
        ops.iter()
            .enumerate()
            .map(|(i, op)| {
                let data = bytes.get(i).map_or(0, Vec::len);
                let (path, acl) = match op {
                    Op::Create { target, mode, .. } => (
                        create_path(&paths.monitor, target, *mode).len(),
                        acl_bytes(paths.acl()),
                    ),
                    Op::Delete { target, .. }
                    | Op::SetData { target }
                    | Op::Check { target, .. } => (path_of(&paths.monitor, target).len(), 0),
                };
                self.op(path, data, acl)
            })
            .sum()
    }

    /// How many reads of paths up to `path` bytes long fit one multi of reads (at least one).
    pub(super) fn reads(&self, path: usize) -> usize {
        (self.budget() / self.op(path, 0, 0)).max(1)
    }

    /// Bytes of the release multi's operations (`release::add_release`: at most four, none
    /// with data) of the queue node `node` (a full path).
    pub(super) fn release(&self, node: &str) -> usize {
        // The mutex's path (`<monitor>/privateLock`) is at most one byte longer than a queue
        // node's (`<monitor>/<prefix>-0000000012`); the monitor's is shorter.
        4 * self.op(node.len() + 16, 0, 0)
    }

    /// Refuses an acquisition whose own multi could not fit: its fast path (the monitor
    /// recreated, the queue node and the mutex created with `data_len` bytes of node data each,
    /// `acl` the ACL of both) after the release of a lock of the same session it may carry, on
    /// paths under `lock_root`.
    pub(super) fn check_acquisition(
        &self,
        lock_root: &str,
        acl: &[Acl],
        data_len: usize,
    ) -> Result<(), LockError> {
        // The longest path of such a multi: a queue node or mutex of any monitor of the root.
        let path = lock_root.len() + 1 + MAX_MONITOR_LEN + 1 + 32 + 11;
        let bytes = ACQUISITION_OPS * self.op(path, 0, acl_bytes(acl))
            + (data_len + PROMOTED)
            + (data_len + MUTEX_EXTRA);
        if self.fits(bytes) {
            return Ok(());
        }
        Err(LockError::Backend {
            context: "queueing for the lock".into(),
            detail: format!(
                "its requests to ZooKeeper may take {} bytes, more than zookeeper.max.request.bytes ({}) allows (the lock info and the other node data take {data_len} bytes per node); shorten the lock info or the lock root, or raise zookeeper.max.request.bytes, keeping it under the servers' jute.maxbuffer",
                bytes + MULTI_FRAME,
                self.max
            ),
        })
    }

    /// The error of operations of `bytes` that do not fit a multi of their own (`what` they are).
    pub(super) fn too_large(&self, what: &str, bytes: usize) -> String {
        format!(
            "{what} would make a request of {} bytes to ZooKeeper, more than zookeeper.max.request.bytes ({}) allows; it was not sent, since ZooKeeper closes the connection of a request over its jute.maxbuffer",
            bytes + MULTI_FRAME,
            self.max
        )
    }
}

/// Bytes of an ACL list's entries.
pub(super) fn acl_bytes(acl: &[Acl]) -> usize {
    acl.iter()
        .map(|a| PER_ACL + a.auth_id().scheme().len() + a.auth_id().id().len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zk::protocol::{Content, Mode, Target};

    /// jute's encoding of a string or a buffer: its length, then its bytes.
    fn jute(bytes: usize) -> usize {
        4 + bytes
    }

    #[test]
    fn a_fast_path_is_estimated_above_its_jute_encoding() {
        let limit = Limit {
            max: 1 << 20,
            chroot: "/app".len(),
        };
        let acl = vec![Acl::new(
            zookeeper_client::Permission::ALL,
            zookeeper_client::AuthId::new("digest", "user:0123456789abcdef0123456789a="),
        )];
        let paths = Paths::new("/zkguard/locks", "article-42", acl.clone());
        let monitor = Target::Monitor;
        let ops = vec![
            Op::Delete {
                target: monitor.clone(),
                version: None,
            },
            Op::Create {
                target: monitor.clone(),
                content: Content::Empty,
                mode: Mode::Container,
            },
            Op::Create {
                target: Target::Node("A".into()),
                content: Content::Contender,
                mode: Mode::EphemeralSequential,
            },
            Op::Create {
                target: Target::Mutex,
                content: Content::Contender,
                mode: Mode::Ephemeral,
            },
            Op::SetData { target: monitor },
            Op::SetData {
                target: Target::Root(1),
            },
        ];
        let data = vec![
            Vec::new(),
            Vec::new(),
            vec![b'x'; 700],
            vec![b'y'; 750],
            Vec::new(),
            Vec::new(),
        ];
        // By hand: each operation's multi header (4 + 1 + 4), then its request.
        let header = 9;
        let (m, node, mutex) = (
            "/app/zkguard/locks/article-42".len(),
            "/app/zkguard/locks/article-42/A-".len(),
            "/app/zkguard/locks/article-42/privateLock".len(),
        );
        let acl_len = 4 + (4 + jute(6) + jute(32));
        let exact = (header + jute(m) + 4)
            + (header + jute(m) + jute(0) + acl_len + 4)
            + (header + jute(node) + jute(700) + acl_len + 4)
            + (header + jute(mutex) + jute(750) + acl_len + 4)
            + (header + jute(m) + jute(0) + 4)
            + (header + jute("/app/zkguard/locks".len()) + jute(0) + 4);
        let estimated = limit.ops(&paths, &ops, &data);
        assert!(estimated >= exact, "{estimated} < {exact}");
        assert!(
            estimated < exact + 6 * 64,
            "{estimated} is far above {exact}"
        );
        // The frame: length, xid, type, closing header.
        assert!(MULTI_FRAME >= 4 + 4 + 4 + header);
        // The acquisition's bound holds its fast path after a release.
        let node = "/zkguard/locks/article-42/A-0000000012";
        let whole = limit.release(node) + estimated;
        let bound = ACQUISITION_OPS * limit.op(14 + 1 + 200 + 1 + 32 + 11, 0, acl_bytes(&acl))
            + (700 + PROMOTED)
            + (700 + MUTEX_EXTRA);
        assert!(whole <= bound, "{whole} > {bound}");
    }

    #[test]
    fn an_acquisition_that_cannot_fit_is_refused_naming_the_key() {
        let limit = Limit {
            max: 16 * 1024,
            chroot: 1,
        };
        limit
            .check_acquisition("/zkguard/locks", &[], 1200)
            .unwrap();
        let e = limit
            .check_acquisition("/zkguard/locks", &[], 6 * 1024)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("zookeeper.max.request.bytes (16384)") && e.contains("jute.maxbuffer"),
            "{e}"
        );
    }
}
