//! The ZooKeeper priority lock.
//!
//! Layout under the lock root (`zookeeper.lock.root`, default `/zkguard/locks`):
//!
//! ```text
//! /zkguard/locks                    persistent
//! └── <monitor>                     container (reaped by ZooKeeper when empty)
//!     ├── A-0000000012              ephemeral sequential: a foreground contender
//!     ├── B-0000000011              ephemeral sequential: a background contender
//!     └── privateLock               ephemeral: the mutex, created by the holder
//! ```
//!
//! Order is (prefix, sequence): `A-0000000012` goes before `B-0000000011`. The first in order
//! takes the mutex by creating `privateLock`; a holder is never preempted. See
//! `docs/zookeeper-lock.md` for the state machines and the failure model.

mod acl;
mod acquire;
mod batch;
mod carried;
mod confirm;
mod contender;
mod driver;
mod guard;
mod handover;
mod inspect;
mod members;
pub(crate) mod names;
mod node;
#[cfg(feature = "testkit")]
pub mod protocol;
#[cfg(not(feature = "testkit"))]
pub(crate) mod protocol;
mod reaper;
mod release;
mod release_batch;
mod request_size;
mod session;
mod state;
mod successor;
mod tls;

pub use acquire::{ZkBlockingWriteLock, ZkLockService, DEADLINE_OVERRUN};
pub use guard::{LockGuard, MUTEX_WATCH_AFTER};
pub use inspect::{
    clear_stray, list_locks, list_locks_page, watch_monitor, Contender, LocksPage, MonitorState,
    MonitorWatch, StrayOutcome,
};
pub use names::QueueNode;
pub use node::NodeData;
pub use protocol::TOKEN_BASE;
pub use session::{wait_for_sessions_to_end, ZkSession};
pub use state::ConnectionState;

use crate::lock::LockError;
use zookeeper_client::Error as ZkError;

/// Maps a client error to the lock layer's error. The client reports a connection that broke
/// under a request as `Custom` (an I/O error such as "connection reset by peer"): that is a
/// connection loss too, with the same doubt about whether the request was applied.
pub(crate) fn map_zk(e: ZkError, context: &str) -> LockError {
    match e {
        ZkError::SessionExpired => LockError::SessionExpired {
            context: context.to_string(),
        },
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) | ZkError::NoHosts => {
            LockError::ConnectionLoss {
                context: context.to_string(),
                detail: format!("{e}; check that ZooKeeper is running and reachable"),
            }
        }
        ZkError::NoNode => LockError::NoNode {
            monitor: String::new(),
            detail: context.to_string(),
        },
        ZkError::NoAuth => LockError::Backend {
            context: context.to_string(),
            detail: "ZooKeeper refused it: not authorized by the node's ACL (NoAuth); check zookeeper.auth.scheme and its credentials (zookeeper.auth.credentials or zookeeper.sasl.*), and the ACL of zookeeper.lock.root".into(),
        },
        ZkError::InvalidAcl => LockError::Backend {
            context: context.to_string(),
            detail: "ZooKeeper refused the ACL in zookeeper.acl (InvalidACL); check its entries".into(),
        },
        other => LockError::Backend {
            context: context.to_string(),
            detail: other.to_string(),
        },
    }
}
