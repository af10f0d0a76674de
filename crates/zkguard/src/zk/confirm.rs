//! Confirming a session with the ZooKeeper quorum while it holds locks.
//!
//! A follower that lost its leader keeps answering its clients (pings, reads) for up to
//! `syncLimit x tickTime`, while the leader expires their sessions after the session timeout and
//! hands their locks on. Only a request that goes through the leader proves that the session is
//! still known to the quorum: a `sync` is forwarded by a follower to the leader and answered only
//! once the leader answered it. While a session holds at least one lock, its confirmer sends one
//! `sync` every half grace (one request per session, whatever the number of locks; none while it
//! holds none) and records, as the session's *confirmed* instant, when each answered one was
//! sent. A held lock counts as lost `grace` after the confirmed instant
//! (`guard::watch_for_loss`), whether the client is disconnected or "connected" to a server that
//! cannot reach the leader. See `docs/zookeeper-lock.md`, "How long a holder may believe in its
//! lock", and `config::grace::max_loss_grace` for the bound of the grace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn, Instrument};
use zookeeper_client::{Client, Error as ZkError, SessionState};

/// The shortest interval between two confirmations, whatever the grace.
const MIN_CADENCE: Duration = Duration::from_millis(10);
/// How long the confirmer waits after a confirmation lost with the connection before the next
/// (sent once the client is connected again).
const RETRY_AFTER_LOSS: Duration = Duration::from_millis(20);

/// The session's confirmation: when the quorum last answered for it, and how many locks it holds.
#[derive(Debug)]
pub(super) struct Confirmation {
    /// The send instant of the newest request the quorum is known to have answered for this
    /// session (a confirmation, the session's creation, an acquisition).
    confirmed: Arc<watch::Sender<Instant>>,
    /// How many guards of this session are holding (their loss watchers running). The confirmer
    /// ends once this sender is gone, that is with the session's `Slot`.
    holding: watch::Sender<usize>,
}

impl Confirmation {
    /// Starts the confirmer of the session behind `client`, confirmed as of `connected` (an
    /// instant taken before the connection attempt that created the session: creating a session
    /// goes through the leader). It confirms every `grace / 2` while a lock is held.
    pub(super) fn start(client: &Client, connected: Instant, grace: Duration) -> Self {
        let confirmed = Arc::new(watch::Sender::new(connected));
        let (holding, holding_rx) = watch::channel(0);
        let cadence = (grace / 2).max(MIN_CADENCE);
        tokio::spawn(run(
            client.clone(),
            confirmed.clone(),
            holding_rx,
            cadence,
            grace,
        ));
        Self { confirmed, holding }
    }

    /// The send instant of the newest request the quorum answered for this session.
    pub(super) fn confirmed(&self) -> Instant {
        *self.confirmed.borrow()
    }

    /// Records that the quorum answered, for this session, a request sent at `at`.
    pub(super) fn credit(&self, at: Instant) {
        credit(&self.confirmed, at);
    }

    /// One more lock held: the confirmer runs while there is one.
    pub(super) fn hold(&self) {
        self.holding.send_modify(|n| *n += 1);
    }

    /// One lock less held.
    pub(super) fn unhold(&self) {
        self.holding.send_modify(|n| *n = n.saturating_sub(1));
    }
}

fn credit(confirmed: &watch::Sender<Instant>, at: Instant) {
    confirmed.send_if_modified(|c| {
        let newer = at > *c;
        if newer {
            *c = at;
        }
        newer
    });
}

/// Waits until the client is connected again; false once the session has ended.
async fn connected(client: &Client) -> bool {
    let mut states = client.state_watcher();
    loop {
        match states.peek_state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return true,
            s if s.is_terminated() => return false,
            _ => {}
        }
        states.changed().await;
    }
}

/// The confirmer: one `sync` every `cadence` while `holding` is above zero; ends with the session
/// (its `Slot` dropped, or the session ended).
async fn run(
    client: Client,
    confirmed: Arc<watch::Sender<Instant>>,
    holding: watch::Receiver<usize>,
    cadence: Duration,
    grace: Duration,
) {
    let session = format!("{:#x}", client.session_id().0);
    let span = tracing::debug_span!("zk_confirm", session = %session);
    confirm_while_held(client, confirmed, holding, cadence, grace)
        .instrument(span)
        .await;
}

/// The warning of a confirmation that has not come back within the grace.
const OVERDUE: &str = "the ZooKeeper quorum has not confirmed this session within the grace \
     (disconnected, or its server is cut off from the leader): its locks count as lost";

async fn confirm_while_held(
    client: Client,
    confirmed: Arc<watch::Sender<Instant>>,
    mut holding: watch::Receiver<usize>,
    cadence: Duration,
    grace: Duration,
) {
    // Whether the current overdue confirmation was reported.
    let mut warned = false;
    loop {
        // Idle while no lock is held.
        while *holding.borrow_and_update() == 0 {
            if holding.changed().await.is_err() {
                return;
            }
        }
        let due = *confirmed.borrow() + cadence;
        tokio::select! {
            r = holding.changed() => {
                if r.is_err() { return; }
                continue;
            }
            _ = tokio::time::sleep_until(due.into()) => {}
        }
        if *confirmed.borrow() + cadence > Instant::now() {
            // Credited meanwhile (an acquisition).
            continue;
        }
        let overdue_at = *confirmed.borrow() + grace;
        let sent = Instant::now();
        let sync = async {
            if !connected(&client).await {
                return Err(ZkError::SessionExpired);
            }
            client.sync("/").await
        };
        tokio::pin!(sync);
        let mut overdue = false;
        let answer = loop {
            tokio::select! {
                r = &mut sync => break r,
                r = holding.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(overdue_at.into()), if !overdue && !warned => {
                    overdue = true;
                    if *holding.borrow() == 0 {
                        continue;
                    }
                    warned = true;
                    warn!(
                        grace_ms = grace.as_millis() as u64,
                        "{OVERDUE}"
                    );
                }
            }
        };
        match answer {
            Ok(()) => {
                credit(&confirmed, sent);
                if warned {
                    info!("the ZooKeeper quorum confirms this session again");
                    warned = false;
                }
            }
            Err(ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed) => return,
            // Connection trouble: the next one goes as soon as the client is connected.
            Err(e @ (ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_))) => {
                debug!(error = %e, "confirmation lost with the connection");
                // Not in a loop while the client still reports the broken connection.
                tokio::select! {
                    r = holding.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(RETRY_AFTER_LOSS) => {}
                }
            }
            Err(e) => {
                debug!(error = %e, "confirmation failed");
                // Not a connection matter: try again after the cadence.
                tokio::select! {
                    r = holding.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(cadence) => {}
                }
            }
        }
    }
}
