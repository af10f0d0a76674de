//! Bulk release: the release multis of a session's concurrent releases go to ZooKeeper
//! together, in one multi.
//!
//! A release is one multi on its monitor (check the monitor's version, delete the mutex, mark
//! and delete the queue node: `protocol::release_ops`). A background job over many objects
//! (the service's lanes, the gate's `_bulk`) releases many locks at once; sent one by one, each
//! is one ZooKeeper transaction, and the job is bounded by ZooKeeper's request rate. Here the
//! releases asked for while [`MAX_SENDERS`] multis are on their way wait for one to end and
//! then go out together: one transaction for up to [`MAX_GROUPS`] monitors. A few concurrent
//! releases, such as foreground hand-offs, wait for nothing: each is sent before
//! `LockGuard::release` returns, so the session's next request finds it applied. A release that
//! waits is sent with the next multi; an acquisition of its monitor that the same session sends
//! meanwhile finds the lock still held and queues behind it (a `try_lock` reports it busy).
//!
//! The releases of one multi touch disjoint monitors (two releases of one monitor never share
//! a multi), so the multi applied is the same as each release applied alone, one after the
//! other with nothing in between. A multi is all or nothing: when one release's part fails
//! (its mutex was deleted by someone else, a newer holder took it, the mark was refused),
//! ZooKeeper names the failed operation; that release gets its own failure, exactly as if it
//! had gone alone, and goes on as usual (carefully); the others go again in the next multi. A
//! lost answer is every release's: each deletes carefully on its own, by attempt id, which is
//! what a lost answer of its own multi leads to.

use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::oneshot;
use tracing::debug;
use zookeeper_client::Client;

use super::batch::{failed_part, take_per_monitor};
use super::driver::{add_ops, code, multi_reply};
use super::node::Paths;
use super::protocol::{Code, MultiError, Op, OpResult, Reply};
use super::request_size::Limit;

/// The most releases that share one multi (four operations each, no data); fewer when their
/// bytes reach the session's [`Limit`] (`zk::request_size`).
const MAX_GROUPS: usize = 128;

/// The most release multis a session has on their way at once; releases asked for meanwhile
/// wait for one to be answered and go together (as `zk::batch` does for fast paths).
const MAX_SENDERS: usize = 4;

/// One release's multi, waiting to go.
struct Group {
    paths: Paths,
    ops: Vec<Op>,
    reply: oneshot::Sender<Reply>,
    /// The bytes of its operations in a multi.
    size: usize,
}

#[derive(Default)]
struct State {
    pending: Vec<Group>,
    senders: usize,
}

/// The release multis of one session waiting for the multi they go in.
pub(crate) struct Releases {
    state: StdMutex<State>,
    client: Client,
    /// The size limit of the session's requests.
    limit: Limit,
}

impl Releases {
    /// The releases of the session of `client`, in multis within `limit`.
    pub(super) fn new(client: Client, limit: Limit) -> Arc<Self> {
        Arc::new(Self {
            state: StdMutex::new(State::default()),
            client,
            limit,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the release multi `ops` on the monitor of `paths` with the others asked for
    /// meanwhile, and returns its reply as if it had gone alone. One that does not fit a
    /// request of its own (see [`Limit`]) is refused, not sent.
    ///
    /// # Cancellation safety
    /// The multi goes whether or not the caller waits for its answer (a release is run by a
    /// task of its own, `lock::Release`, so it is not dropped in practice).
    pub(super) async fn send(self: &Arc<Self>, paths: &Paths, ops: Vec<Op>) -> Reply {
        let size = self.limit.ops(paths, &ops, &[]);
        if !self.limit.fits(size) {
            let detail = self.limit.too_large("the release", size);
            return Reply::Multi(Err(MultiError::Request(Code::Other(detail))));
        }
        let (tx, rx) = oneshot::channel();
        let ops = {
            let mut state = self.state();
            if state.senders < MAX_SENDERS {
                state.senders += 1;
                Some(ops)
            } else {
                state.pending.push(Group {
                    paths: paths.clone(),
                    ops,
                    reply: tx,
                    size,
                });
                None
            }
        };
        let Some(ops) = ops else {
            return rx.await.unwrap_or_else(|_| {
                Reply::Multi(Err(MultiError::Request(Code::Lost(
                    "the session's release sender stopped".into(),
                ))))
            });
        };
        // Sent at this future's first poll, as a release alone is (`LockGuard::release` sends
        // it before it returns); then this sender's place goes to the releases that came
        // meanwhile, if any.
        let reply = commit(&self.client, [(paths, ops.as_slice())]).await;
        let more = {
            let mut state = self.state();
            if state.pending.is_empty() {
                state.senders -= 1;
            }
            !state.pending.is_empty()
        };
        if more {
            let releases = self.clone();
            tokio::spawn(async move { drain(&releases).await });
        }
        reply
    }
}

/// One multi of the release operations of `parts`, in order.
async fn commit<'a>(
    client: &Client,
    parts: impl IntoIterator<Item = (&'a Paths, &'a [Op])>,
) -> Reply {
    let mut multi = client.new_multi_writer();
    let added = parts
        .into_iter()
        .try_for_each(|(paths, ops)| add_ops(&mut multi, paths, ops, &[]));
    match added {
        Ok(()) => multi_reply(multi.commit().await),
        Err(e) => Reply::Multi(Err(MultiError::Request(code(&e)))),
    }
}

/// Sends what is pending, batch after batch, until nothing is.
async fn drain(releases: &Arc<Releases>) {
    loop {
        let batch = {
            let mut state = releases.state();
            let batch = take_batch(&mut state.pending, releases.limit.budget());
            if batch.is_empty() {
                state.senders -= 1;
                return;
            }
            batch
        };
        send_batch(&releases.client, batch).await;
    }
}

/// Up to [`MAX_GROUPS`] pending groups of `budget` bytes in all, at most one per monitor, in
/// the order they came.
fn take_batch(pending: &mut Vec<Group>, budget: usize) -> Vec<Group> {
    take_per_monitor(pending, MAX_GROUPS, budget, |g| (&g.paths.monitor, g.size))
}

/// Sends `batch` as one multi; a group whose own part failed gets that failure and leaves, the
/// others go again, until the multi is applied or fails as a whole.
async fn send_batch(client: &Client, mut batch: Vec<Group>) {
    while !batch.is_empty() {
        let result = commit(client, batch.iter().map(|g| (&g.paths, g.ops.as_slice()))).await;
        match result {
            Reply::Multi(Ok(results)) => {
                if batch.len() > 1 {
                    debug!(releases = batch.len(), "locks released in one multi");
                }
                let mut results = results.into_iter();
                for group in batch.drain(..) {
                    let mine: Vec<OpResult> = results.by_ref().take(group.ops.len()).collect();
                    let _ = group.reply.send(Reply::Multi(Ok(mine)));
                }
            }
            Reply::Multi(Err(MultiError::Failed { index, code })) => {
                let Some((at, offset)) = failed_part(batch.iter().map(|g| g.ops.len()), index)
                else {
                    let detail = format!(
                        "a multi of {} releases failed at operation {index}, past its end",
                        batch.len()
                    );
                    // Not applied (a failed multi applies nothing): each goes alone next.
                    for group in batch.drain(..) {
                        let reply =
                            Reply::Multi(Err(MultiError::Request(Code::Other(detail.clone()))));
                        let _ = group.reply.send(reply);
                    }
                    return;
                };
                let group = batch.remove(at);
                let reply = Reply::Multi(Err(MultiError::Failed {
                    index: index - offset,
                    code,
                }));
                let _ = group.reply.send(reply);
            }
            other => {
                // Lost or refused as a whole: applied or not, all or none.
                for group in batch.drain(..) {
                    let _ = group.reply.send(other.clone());
                }
            }
        }
    }
}
