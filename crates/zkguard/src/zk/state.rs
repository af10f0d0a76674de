//! The connection state of a [`ZkSession`](crate::ZkSession), for applications that react to it: the equivalent
//! of Curator's `ConnectionStateListener` and kazoo's `add_listener`.

use tokio::sync::watch;
use zookeeper_client::SessionState;

/// The connection state of a [`ZkSession`](crate::ZkSession), as [`ZkSession::connection_state`](crate::ZkSession::connection_state) reports it.
///
/// | state | Curator | kazoo |
/// | --- | --- | --- |
/// | `Connected` | `CONNECTED`, `RECONNECTED` | `CONNECTED` |
/// | `Suspended` | `SUSPENDED` | `SUSPENDED` |
/// | `Lost` | `LOST` | `LOST` |
///
/// While `Suspended`, the session may still be alive on the servers (the client reconnects by
/// itself within the session timeout), but nothing done under a lock of this session should be
/// trusted to be exclusive: a held lock reports itself lost once `zookeeper.lock.loss.grace` has
/// passed since the last request the ZooKeeper quorum answered for the session (which also
/// happens while `Connected` to a follower cut off from the leader). Once `Lost`, every
/// ephemeral node of the session (queue places, held locks) is gone; the next lock request, or [`ZkSession::ensure_session`](crate::ZkSession::ensure_session),
/// connects a new session, and the state becomes `Connected` again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Connected to a server (the first time, after a reconnection, or with a new session).
    Connected,
    /// The connection to the servers is down; the session may still be alive.
    Suspended,
    /// The session expired (or its authentication failed): its ephemeral nodes are gone.
    Lost,
    /// The session was closed with [`ZkSession::close`](crate::ZkSession::close) or [`ZkSession::close_and_wait`](crate::ZkSession::close_and_wait).
    Closed,
}

impl std::fmt::Display for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Connected => "connected",
            Self::Suspended => "suspended",
            Self::Lost => "lost",
            Self::Closed => "closed",
        })
    }
}

impl From<SessionState> for ConnectionState {
    fn from(state: SessionState) -> Self {
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => Self::Connected,
            SessionState::Disconnected => Self::Suspended,
            SessionState::Expired | SessionState::AuthFailed => Self::Lost,
            SessionState::Closed => Self::Closed,
        }
    }
}

/// The sending side, one per [`ZkSession`](crate::ZkSession) (across the sessions it connects in turn).
pub(super) type StateSender = watch::Sender<ConnectionState>;

/// A new sender; the state becomes `Connected` when the first session is established.
pub(super) fn channel() -> StateSender {
    watch::Sender::new(ConnectionState::Suspended)
}

/// Records a state of the client (a no-op once the `ZkSession` was closed).
pub(super) fn publish(tx: &StateSender, state: ConnectionState) {
    tx.send_if_modified(|current| {
        if *current == ConnectionState::Closed || *current == state {
            return false;
        }
        *current = state;
        true
    });
}
