//! The session's reaper: one task per ZooKeeper session that removes the nodes of acquisitions
//! that went away (a waiter dropped or timed out mid-request, a held guard dropped), including
//! nodes whose create was still in flight, found again by session and attempt id.
//!
//! The reaper never deletes blindly: by the time it runs, a path it was handed may name another
//! node. A contender cancelled while giving the mutex back still counts the mutex as its own,
//! though the server may have applied the give-back and the rightful successor created
//! `privateLock` again; a queue node's name repeats once the fast path recreated an empty
//! monitor. So each node goes only if it is this session's and carries the attempt id (the
//! core's [`Removal::reap`]): a read and a conditional delete per node, on a path that only
//! abandoned acquisitions and dropped guards take.

use tokio::sync::mpsc;
use zookeeper_client::Client;

use super::driver::run_removal;
use super::node::{child_name, Paths};
use super::protocol::Removal;

/// Cleanup work handed to the session's reaper task: delete these nodes if they still carry
/// `attempt`, retrying on connection loss until done or until the session ends (which deletes
/// them anyway).
#[derive(Debug)]
pub(crate) struct Reap {
    pub queue_node: Option<String>,
    pub mutex: Option<String>,
    /// A create was in flight when the waiter went away: find what it made under this monitor
    /// path by session and attempt id, and delete it.
    pub search: Option<(String, String)>,
    /// The attempt id carried by the nodes to delete, checked before deleting each.
    pub attempt: String,
}

impl Reap {
    /// The monitor's path, and the core's removal for this job.
    fn removal(&self, me: i64) -> Option<(Paths, Removal)> {
        let monitor = match (&self.search, &self.queue_node, &self.mutex) {
            (Some((monitor, _)), _, _) => monitor.clone(),
            (None, Some(path), _) | (None, None, Some(path)) => {
                path.rsplit_once('/').map(|(m, _)| m.to_string())?
            }
            (None, None, None) => return None,
        };
        let removal = Removal::reap(
            me,
            &self.attempt,
            self.queue_node.as_deref().map(child_name),
            self.mutex.is_some(),
            self.search.as_ref().map(|(_, attempt)| attempt.clone()),
        );
        Some((Paths::of_monitor(&monitor), removal))
    }
}

/// Starts the reaper task of the session behind `client`; it ends when the sender is dropped.
pub(super) fn spawn(client: Client) -> mpsc::UnboundedSender<Reap> {
    let (reaper, mut reap_rx) = mpsc::unbounded_channel::<Reap>();
    tokio::spawn(async move {
        while let Some(job) = reap_rx.recv().await {
            if let Some((paths, removal)) = job.removal(client.session_id().0) {
                let _ = run_removal(&client, &paths, removal).await;
            }
        }
    });
    reaper
}
