//! Recovery after a connection loss during a create: finding the queue node (and mutex) this
//! attempt may have made, by session and attempt id, instead of creating a second one.

use super::super::remove::is_ours;
use super::super::types::{Action, Code, Reply, Request, Target};
use super::{code_of, code_of_opt, Acquisition, Awaiting, OnceGivenBack, QueueRound, Step};
use crate::zk::names::Queue;

impl Acquisition {
    // ---------------------------------------------------------------- recovery

    /// After a connection loss during a create: find our queue node (and mutex) by session and
    /// attempt id, once the server caught up (a sync before the listing).
    pub(super) fn recover(&mut self, mode: QueueRound) -> Action {
        self.send(
            Awaiting::RecoveryListing(mode),
            vec![
                Request::Sync(Target::Monitor),
                Request::GetChildren(Target::Monitor),
            ],
        )
    }

    pub(super) fn on_rec_list(&mut self, mode: QueueRound, replies: Vec<Reply>) -> Action {
        let mut replies = replies.into_iter();
        let synced = replies.next();
        let listed = replies.next();
        let children = match (synced, listed) {
            (Some(Reply::Synced(Ok(()) | Err(Code::NoNode))), Some(Reply::Children(c))) => c,
            (Some(Reply::Synced(Err(code))), _) => Err(code),
            (_, other) => Err(code_of_opt(other)),
        };
        match children {
            Ok((children, _)) => {
                let names: Vec<String> = Queue::from_children(&children)
                    .nodes
                    .into_iter()
                    .map(|n| n.name)
                    .collect();
                self.rec_read_from(mode, names, 0)
            }
            Err(Code::NoNode) => self.recovered(mode),
            Err(code) => self.recovery_failed(mode, code, "looking for our queue node"),
        }
    }

    pub(super) fn rec_read_from(
        &mut self,
        mode: QueueRound,
        names: Vec<String>,
        next: usize,
    ) -> Action {
        match names.get(next) {
            Some(name) => {
                let target = Target::Node(name.clone());
                self.send(
                    Awaiting::RecoveryReads { mode, names, next },
                    vec![Request::GetData(target)],
                )
            }
            None => self.send(
                Awaiting::RecoveryMutexRead(mode),
                vec![Request::GetData(Target::Mutex)],
            ),
        }
    }

    pub(super) fn on_rec_read(
        &mut self,
        mode: QueueRound,
        names: Vec<String>,
        next: usize,
        reply: Reply,
    ) -> Action {
        match reply {
            Reply::Data(Ok(read)) => {
                if is_ours(&read, self.spec.me, &self.attempt, self.spec.flaw) {
                    self.node = Some(names[next].clone());
                }
            }
            Reply::Data(Err(Code::NoNode)) => {}
            other => {
                return self.recovery_failed(mode, code_of(other), "looking for our queue node")
            }
        }
        self.rec_read_from(mode, names, next + 1)
    }

    pub(super) fn on_rec_mutex(&mut self, mode: QueueRound, reply: Reply) -> Action {
        match reply {
            Reply::Data(Ok(read))
                if is_ours(&read, self.spec.me, &self.attempt, self.spec.flaw) =>
            {
                // Ours: give it back and verify the order on the next step (or, without a
                // queue node, it is stray).
                self.holds_mutex = true;
                self.yield_mutex(OnceGivenBack::Recovery(mode))
            }
            Reply::Data(Ok(_) | Err(Code::NoNode)) => self.recovered(mode),
            other => self.recovery_failed(mode, code_of(other), "reading the mutex"),
        }
    }

    pub(super) fn recovered(&mut self, mode: QueueRound) -> Action {
        self.in_flight = false;
        if self.node.is_some() {
            return self.step(Step::Wait(Queue::default()));
        }
        match mode {
            QueueRound::FirstTry => self.queue_step(),
            mode => self.plain_create(mode),
        }
    }

    /// In the first queueing loop, a connection lost during the recovery means waiting for it
    /// and looking again; otherwise the acquisition fails.
    pub(super) fn recovery_failed(
        &mut self,
        mode: QueueRound,
        code: Code,
        context: &'static str,
    ) -> Action {
        if mode == QueueRound::FirstTry && code.is_lost() {
            return self.await_connected(Awaiting::ReconnectionToRecover(mode));
        }
        self.fail(code, context)
    }
}
