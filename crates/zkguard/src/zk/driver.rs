//! The thin async layer under the sans-IO core (`zk::protocol`): performs its requests with
//! `zookeeper-client`, pipelined as asked, and turns the client's answers into the core's
//! [`Reply`]s.

use std::future::Future;
use std::pin::Pin;

use futures::FutureExt;
use zookeeper_client::{
    Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter,
    OneshotWatcher,
};

use super::node::{child_name, encode, encode_mutex, NodeData, Paths};
use super::protocol::{
    Action, Code, Content, Input, Mode, MultiError, Op, OpResult, Read, Removal, Reply, Request,
    Stat, Target,
};
use crate::lock::LockError;

/// The path of `target` under `monitor` (`/zkguard/locks/<monitor>`).
pub(super) fn path_of(monitor: &str, target: &Target) -> String {
    match target {
        Target::Monitor => monitor.to_string(),
        Target::Mutex => format!("{monitor}/{}", super::names::MUTEX_NODE),
        Target::Node(name) => format!("{monitor}/{name}"),
        Target::Root(i) => {
            let root = monitor.rsplit_once('/').map_or("", |(root, _)| root);
            let mut path = String::new();
            for seg in root.trim_start_matches('/').split('/').take(i + 1) {
                path.push('/');
                path.push_str(seg);
            }
            path
        }
    }
}

/// How many nodes a lock root has (`/zkguard/locks`: 2).
pub(super) fn root_depth(root: &str) -> usize {
    root.trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .count()
}

/// The core's code for a client error.
pub(super) fn code(e: &ZkError) -> Code {
    match e {
        ZkError::NoNode => Code::NoNode,
        ZkError::NodeExists => Code::NodeExists,
        ZkError::NotEmpty => Code::NotEmpty,
        ZkError::BadVersion => Code::BadVersion,
        ZkError::NoAuth => Code::NoAuth,
        ZkError::InvalidAcl => Code::InvalidAcl,
        ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) => {
            Code::Lost(e.to_string())
        }
        ZkError::SessionExpired => Code::Expired,
        ZkError::ClientClosed => Code::Closed,
        other => Code::Other(other.to_string()),
    }
}

/// The client error for a core's code.
pub(super) fn zk_error(code: &Code) -> ZkError {
    match code {
        Code::NoNode => ZkError::NoNode,
        Code::NodeExists => ZkError::NodeExists,
        Code::NotEmpty => ZkError::NotEmpty,
        Code::BadVersion => ZkError::BadVersion,
        Code::NoAuth => ZkError::NoAuth,
        Code::InvalidAcl => ZkError::InvalidAcl,
        Code::Lost(_) => ZkError::ConnectionLoss,
        Code::Expired => ZkError::SessionExpired,
        Code::Closed => ZkError::ClientClosed,
        Code::Other(detail) => ZkError::UnexpectedError(detail.clone()),
    }
}

/// The lock layer's error for a core's code.
pub(super) fn lock_error(code: &Code, context: &str) -> LockError {
    match code {
        Code::Lost(detail) => LockError::ConnectionLoss {
            context: context.to_string(),
            detail: format!("{detail}; check that ZooKeeper is running and reachable"),
        },
        code => super::map_zk(zk_error(code), context),
    }
}

fn stat(s: &zookeeper_client::Stat) -> Stat {
    Stat {
        czxid: s.czxid,
        mzxid: s.mzxid,
        pzxid: s.pzxid,
        version: s.version,
        owner: s.ephemeral_owner,
        valid: !s.is_invalid(),
    }
}

/// The core's view of a node read: its attempt id (from its data) and stat.
pub(super) fn read(bytes: &[u8], s: &zookeeper_client::Stat) -> Read {
    Read {
        attempt: serde_json::from_slice::<NodeData>(bytes)
            .ok()
            .map(|d| d.attempt),
        stat: stat(s),
    }
}

/// What the nodes a contender creates hold: its data, with the core's attempt id.
pub(super) struct Contents<'a> {
    pub(super) data: &'a NodeData,
}

impl Contents<'_> {
    /// The data an operation writes (a create's content; nothing for the others).
    pub(super) fn bytes_of(&self, op: &Op) -> Vec<u8> {
        match op {
            Op::Create { content, .. } => self.bytes(content),
            _ => Vec::new(),
        }
    }

    fn bytes(&self, content: &Content) -> Vec<u8> {
        match content {
            Content::Empty => Vec::new(),
            Content::Contender => encode(self.data),
            Content::Mutex { node } => encode_mutex(self.data, node),
        }
    }
}

/// Adds core operations to a multi, each with its data (`bytes`, one per operation).
pub(super) fn add_ops(
    multi: &mut MultiWriter<'_>,
    paths: &Paths,
    ops: &[Op],
    bytes: &[Vec<u8>],
) -> Result<(), ZkError> {
    ops.iter()
        .enumerate()
        .try_for_each(|(i, op)| add_op(multi, paths, op, bytes.get(i).map_or(&[], |b| b)))
}

/// Adds one core operation to a multi (`bytes`: a create's data).
pub(super) fn add_op(
    multi: &mut MultiWriter<'_>,
    paths: &Paths,
    op: &Op,
    bytes: &[u8],
) -> Result<(), ZkError> {
    let monitor = &paths.monitor;
    match op {
        Op::Create { target, mode, .. } => {
            let path = create_path(monitor, target, *mode);
            multi.add_create(&path, bytes, &paths.create(create_mode(*mode)))
        }
        Op::Delete { target, version } => multi.add_delete(&path_of(monitor, target), *version),
        Op::SetData { target } => multi.add_set_data(&path_of(monitor, target), &[], None),
        Op::Check { target, version } => {
            multi.add_check_version(&path_of(monitor, target), *version)
        }
    }
}

fn create_mode(mode: Mode) -> CreateMode {
    match mode {
        Mode::Persistent => CreateMode::Persistent,
        Mode::Container => CreateMode::Container,
        Mode::Ephemeral => CreateMode::Ephemeral,
        Mode::EphemeralSequential => CreateMode::EphemeralSequential,
    }
}

/// A sequential node is created as `<prefix>-` under the monitor.
pub(super) fn create_path(monitor: &str, target: &Target, mode: Mode) -> String {
    match (target, mode) {
        (Target::Node(prefix), Mode::EphemeralSequential) => format!("{monitor}/{prefix}-"),
        (target, _) => path_of(monitor, target),
    }
}

/// The core's reply to a multi's outcome.
pub(super) fn multi_reply(result: Result<Vec<MultiWriteResult>, MultiWriteError>) -> Reply {
    Reply::Multi(match result {
        Ok(results) => Ok(results
            .iter()
            .map(|r| match r {
                MultiWriteResult::Create { path, stat: s } => OpResult::Create {
                    name: child_name(path),
                    stat: stat(s),
                },
                MultiWriteResult::Delete => OpResult::Delete,
                MultiWriteResult::SetData { stat: s } => OpResult::SetData { stat: stat(s) },
                MultiWriteResult::Check => OpResult::Check,
                // The client's enum is open to more kinds; zkguard's multis have none.
                _ => OpResult::Check,
            })
            .collect()),
        Err(MultiWriteError::OperationFailed { index, source }) => Err(MultiError::Failed {
            index,
            code: code(&source),
        }),
        Err(MultiWriteError::RequestFailed { source }) => Err(MultiError::Request(code(&source))),
    })
}

type Answer<'a> = Pin<Box<dyn Future<Output = (Reply, Option<OneshotWatcher>)> + Send + 'a>>;

/// Sends `requests` in order, each before the next is made (ZooKeeper answers a session's
/// requests in order), and gathers their replies; a watch request also hands back its watcher.
pub(super) async fn perform(
    client: &Client,
    paths: &Paths,
    contents: Option<&Contents<'_>>,
    requests: &[Request],
) -> (Vec<Reply>, Option<OneshotWatcher>) {
    let monitor = paths.monitor.as_str();
    // Paths first: the client's futures borrow them.
    let targets: Vec<String> = requests
        .iter()
        .map(|r| match r {
            Request::Single(Op::Create { target, mode, .. }) => create_path(monitor, target, *mode),
            Request::Single(Op::Delete { target, .. })
            | Request::GetChildren(target)
            | Request::GetData(target)
            | Request::Watch(target)
            | Request::Sync(target) => path_of(monitor, target),
            Request::Single(_) | Request::Multi(_) => String::new(),
        })
        .collect();
    let mut answers: Vec<Answer<'_>> = Vec::with_capacity(requests.len());
    for (request, path) in requests.iter().zip(&targets) {
        let answer: Answer<'_> = match request {
            Request::Multi(ops) => {
                let mut multi = client.new_multi_writer();
                let bytes: Vec<Vec<u8>> = ops
                    .iter()
                    .map(|op| contents.map(|c| c.bytes_of(op)).unwrap_or_default())
                    .collect();
                match add_ops(&mut multi, paths, ops, &bytes) {
                    Ok(()) => Box::pin(multi.commit().map(|r| (multi_reply(r), None))),
                    Err(e) => {
                        let reply = Reply::Multi(Err(MultiError::Request(code(&e))));
                        Box::pin(async move { (reply, None) })
                    }
                }
            }
            Request::Single(Op::Create {
                target,
                content,
                mode,
            }) => {
                let bytes = contents.map(|c| c.bytes(content)).unwrap_or_default();
                let options = paths.create(create_mode(*mode));
                let sequential = *mode == Mode::EphemeralSequential;
                let name = match target {
                    Target::Node(n) => n.clone(),
                    Target::Mutex => super::names::MUTEX_NODE.to_string(),
                    _ => String::new(),
                };
                Box::pin(client.create(path, &bytes, &options).map(move |r| {
                    let reply = Reply::Created(match r {
                        Ok((s, seq)) if sequential => Ok((format!("{name}-{seq}"), stat(&s))),
                        Ok((s, _)) => Ok((name, stat(&s))),
                        Err(e) => Err(code(&e)),
                    });
                    (reply, None)
                }))
            }
            Request::Single(Op::Delete { version, .. }) => Box::pin(
                client
                    .delete(path, *version)
                    .map(|r| (Reply::Deleted(r.map_err(|e| code(&e))), None)),
            ),
            Request::Single(op) => {
                let reply = Reply::Multi(Err(MultiError::Request(Code::Other(format!(
                    "{op:?} is not a request of its own"
                )))));
                Box::pin(async move { (reply, None) })
            }
            Request::GetChildren(_) => Box::pin(client.get_children(path).map(|r| {
                let reply = Reply::Children(match r {
                    Ok((children, s)) => Ok((children, stat(&s))),
                    Err(e) => Err(code(&e)),
                });
                (reply, None)
            })),
            Request::GetData(_) => Box::pin(client.get_data(path).map(|r| {
                let reply = Reply::Data(match r {
                    Ok((bytes, s)) => Ok(read(&bytes, &s)),
                    Err(e) => Err(code(&e)),
                });
                (reply, None)
            })),
            Request::Watch(_) => Box::pin(client.get_and_watch_data(path).map(|r| match r {
                Ok((_, s, watcher)) => (
                    Reply::Data(Ok(Read {
                        attempt: None,
                        stat: stat(&s),
                    })),
                    Some(watcher),
                ),
                Err(e) => (Reply::Data(Err(code(&e))), None),
            })),
            Request::Sync(_) => Box::pin(
                client
                    .sync(path)
                    .map(|r| (Reply::Synced(r.map_err(|e| code(&e))), None)),
            ),
        };
        answers.push(answer);
    }
    let mut watcher = None;
    let replies = futures::future::join_all(answers)
        .await
        .into_iter()
        .map(|(reply, w)| {
            if w.is_some() {
                watcher = w;
            }
            reply
        })
        .collect();
    (replies, watcher)
}

/// Runs a removal to its end: its requests, and a growing pause before each retry after a
/// lost answer (until done, or until the session ends, which removes the nodes anyway).
/// Returns its outcome and whether the hand-over mark was refused.
pub(super) async fn run_removal(
    client: &Client,
    paths: &Paths,
    removal: Removal,
) -> (Result<(), ZkError>, bool) {
    let alone: Option<fn(Vec<Op>) -> std::future::Ready<Reply>> = None;
    run_removal_via(client, paths, removal, alone).await
}

/// [`run_removal`], its first request sent by `first_multi` when it is a multi (a release
/// that goes with the session's other releases of the moment: `zk::release_batch`).
pub(super) async fn run_removal_via<F, Fut>(
    client: &Client,
    paths: &Paths,
    removal: Removal,
    mut first_multi: Option<F>,
) -> (Result<(), ZkError>, bool)
where
    F: FnOnce(Vec<Op>) -> Fut,
    Fut: Future<Output = Reply>,
{
    let mut backoff = crate::Backoff::new(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_secs(1),
    );
    // Its careful deletes of the mutex check the lock root's version as well (the monitor's
    // parent, whose version every creation of a monitor moves).
    let lock_root = paths.monitor.rsplit_once('/').map_or("", |(root, _)| root);
    let mut removal = removal.with_lock_root(root_depth(lock_root));
    let mut action = removal.start();
    loop {
        action = match action {
            Action::Send(send) => {
                let replies = match (first_multi.take(), send.requests.as_slice()) {
                    (Some(send_multi), [Request::Multi(ops)]) => {
                        vec![send_multi(ops.clone()).await]
                    }
                    _ => perform(client, paths, None, &send.requests).await.0,
                };
                removal.handle(Input::Replies(replies))
            }
            Action::Backoff => {
                tokio::time::sleep(backoff.next_delay()).await;
                removal.handle(Input::Woke)
            }
            Action::Done => break,
            other => {
                tracing::warn!(?other, "a removal asked for what it never asks");
                break;
            }
        };
    }
    let outcome = match removal.outcome() {
        Some(Ok(())) | None => Ok(()),
        Some(Err(code)) => Err(zk_error(code)),
    };
    (outcome, removal.mark_refused)
}
