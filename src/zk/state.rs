//! The connection state of a [`ZkSession`], for applications that react to it: the equivalent
//! of Curator's `ConnectionStateListener` and kazoo's `add_listener`.

use tokio::sync::watch;
use zookeeper_client::SessionState;

use super::ZkSession;
use crate::config::ZkSettings;
use crate::lock::LockError;

/// The connection state of a [`ZkSession`], as [`ZkSession::connection_state`] reports it.
///
/// | state | Curator | kazoo |
/// | --- | --- | --- |
/// | `Connected` | `CONNECTED`, `RECONNECTED` | `CONNECTED` |
/// | `Suspended` | `SUSPENDED` | `SUSPENDED` |
/// | `Lost` | `LOST` | `LOST` |
///
/// While `Suspended`, the session may still be alive on the servers (the client reconnects by
/// itself within the session timeout), but nothing done under a lock of this session should be
/// trusted to be exclusive: a held lock reports itself lost once the connection has been down
/// for `zookeeper.lock.loss.grace`. Once `Lost`, every ephemeral node of the session (queue
/// places, held locks) is gone; the next lock request, or [`ZkSession::ensure_session`],
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
    /// The session was closed with [`ZkSession::close`] or [`ZkSession::close_and_wait`].
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

/// The sending side, one per [`ZkSession`] (across the sessions it connects in turn).
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

impl ZkSession {
    /// A receiver of this session's connection state: [`watch::Receiver::borrow`] gives the
    /// current one, [`watch::Receiver::changed`] waits for the next change. Changes that follow
    /// each other quickly may be seen as their last one only (a `Suspended` then `Connected`
    /// within a moment may read as `Connected`); [`ConnectionState::Lost`] stays until a new
    /// session is connected, and [`ConnectionState::Closed`] is final.
    ///
    /// ```no_run
    /// # async fn example(session: zkguard::ZkSession) {
    /// use zkguard::zk::ConnectionState;
    /// let mut states = session.connection_state();
    /// tokio::spawn(async move {
    ///     while states.changed().await.is_ok() {
    ///         let state = *states.borrow_and_update();
    ///         match state {
    ///             ConnectionState::Suspended => eprintln!("pausing writes"),
    ///             ConnectionState::Lost => eprintln!("locks lost; re-acquire"),
    ///             ConnectionState::Connected => eprintln!("connected"),
    ///             _ => break,
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn connection_state(&self) -> watch::Receiver<ConnectionState> {
        self.state_sender().subscribe()
    }

    /// Like [`ZkSession::connect`], connecting with `connector` (authentication, TLS, SASL,
    /// read-only mode, connection timeout: whatever the application set on it) instead of one
    /// built from `settings`. `settings` still gives the servers, the connection attempts and
    /// their delay, the lock root, prefixes and timeouts; `zookeeper.session.timeout` and
    /// `zookeeper.auth.*` are not applied (set them on the connector with
    /// `with_session_timeout` and `with_auth`). zkguard adds
    /// `with_fail_eagerly` so that each attempt ends when no server answers. The connector is
    /// used again for each new session after an expiry, so it must not carry a session
    /// (`with_session`).
    ///
    /// # Errors
    /// As [`ZkSession::connect`].
    pub async fn from_connector(
        connector: zookeeper_client::Connector,
        settings: &ZkSettings,
    ) -> Result<Self, LockError> {
        Self::connect_with(settings, Some(connector)).await
    }
}
