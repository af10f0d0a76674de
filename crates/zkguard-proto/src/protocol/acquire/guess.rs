//! The node ahead without a listing. A holder that queues again in the multi that releases its
//! lock of the same monitor (`release_and_acquire`) learns which node is just ahead of its new
//! one from the sequence numbers, and watches it: one request where a listing and a watch take
//! two.
//!
//! ZooKeeper names a sequential child after the monitor's counter, which every creation of a
//! child moves, in the order of the creations (3.8 moves it on creations only; were deletions
//! to move it too, the check below would fail more often, never pass wrongly). Let our new node
//! be `P-n`. If `P-(n-2)` exists and was created before our take of the mutex (zxid `before`,
//! the creation of our `privateLock`), then our `privateLock`, created between the two, took
//! the one value between them: no other node was created in between. `P-(n-2)` is then the
//! youngest node of our class older than ours, the node just ahead of ours, and every node
//! created later sorts after ours. Anything else (no such node, created after our take,
//! another class) lists the queue as before. See `docs/zookeeper-lock.md`, "The node ahead
//! without a listing".

use super::super::types::{Action, Code, Reply, Request, Target};
use super::super::Flaw;
use super::{code_of, Acquisition, Awaiting, Step};
use crate::zk::names::{Queue, QueueNode};

impl Acquisition {
    /// The multi that creates the queue node in a release's multi, and the child list behind
    /// it unless the node ahead can be found without it.
    pub(super) fn carried_create(&self) -> Vec<Request> {
        let mut requests = vec![Request::Multi(vec![self.new_node()])];
        if self.carried_take.is_none() {
            requests.push(Request::GetChildren(Target::Monitor));
        }
        requests
    }

    /// Our node `name` was created in the release's multi, with no read behind it: watch the
    /// node the sequence numbers name as just ahead, or list the queue.
    pub(super) fn guess_ahead(&mut self, name: &str) -> Action {
        let guess = self
            .carried_take
            .and_then(|before| Some((QueueNode::parse(name)?.two_before()?, before)));
        match guess {
            Some((ahead, before)) => self.send(
                Awaiting::WatchOnGuessSet {
                    ahead: ahead.clone(),
                    before,
                },
                vec![Request::Watch(Target::Node(ahead))],
            ),
            None => self.step(Step::Wait(Queue::default())),
        }
    }

    pub(super) fn on_guess(&mut self, ahead: String, before: i64, reply: Reply) -> Action {
        let unordered = self.spec.flaw == Some(Flaw::GuessUnordered);
        match reply {
            Reply::Data(Ok(read)) if read.stat.czxid < before || unordered => {
                // Just ahead of us. Not known to be the head: woken by its deletion (it gave
                // up), we list the queue; by its release's mark, we are first.
                self.others_seen = true;
                self.awaiting = Awaiting::AheadToGo {
                    was_second: false,
                    ahead,
                };
                Action::AwaitWatch
            }
            // Created after our take: another node may sit between it and ours. Gone: the
            // queue changed. The queue says who is ahead (a watch left on the node is
            // replaced by the next one, or fires unheard).
            Reply::Data(Ok(_) | Err(Code::NoNode)) => self.step(Step::Wait(Queue::default())),
            Reply::Data(Err(code)) if code.is_lost() => {
                self.await_connected(Awaiting::ReconnectionToLookAgain)
            }
            other => self.fail(code_of(other), "watching the node ahead"),
        }
    }
}
