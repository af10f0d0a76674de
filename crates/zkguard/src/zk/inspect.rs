//! Read-only inspection of the lock tree, for `zkguard locks`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use zookeeper_client::{Client, Error as ZkError, Stat};

use super::names::{Queue, QueueNode, MUTEX_NODE};
use super::node::NodeData;
use super::{map_zk, ZkSession};
use crate::lock::{Blocker, LockError, MAX_MONITOR_LEN};

/// One contender of a monitor, as seen in ZooKeeper.
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// Queue-node name, e.g. `A-0000000012`.
    pub node: String,
    /// Class prefix.
    pub class: String,
    /// Sequence number.
    pub sequence: u64,
    /// Owner id (`host:pid:random`), when the node carries zkguard data.
    pub owner: Option<String>,
    /// Lock info.
    pub info: Option<String>,
    /// Lock type.
    pub lock_type: Option<String>,
    /// Milliseconds since the node was created.
    pub age_ms: u64,
    /// ZooKeeper session that owns the node.
    pub session: String,
    /// Whether this contender holds the mutex.
    pub holder: bool,
}

/// Holder and queue of one monitor.
#[derive(Debug, Clone, Serialize)]
pub struct MonitorState {
    /// Monitor object.
    pub monitor: String,
    /// The holder, if the mutex is held.
    pub holder: Option<Contender>,
    /// Fencing token of the current holder (from the czxid of the mutex node).
    pub token: Option<u64>,
    /// Everyone queued, in lock order (the holder included).
    pub queue: Vec<Contender>,
    /// Whether `privateLock` exists but is not one of zkguard's: persistent, or ephemeral of a
    /// session that holds no queue node in the monitor. It blocks every contender until it is
    /// removed (`zkguard locks --monitor ID --clear-stray`).
    pub stray: bool,
    /// The session owning a stray `privateLock` (`0x0` when it is persistent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stray_session: Option<String>,
}

/// One queue node as read.
pub(crate) struct NodeView {
    pub node: QueueNode,
    pub data: Option<NodeData>,
    pub stat: Stat,
}

/// The mutex node of a monitor, classified.
pub(crate) enum MutexView {
    /// No `privateLock`.
    Free,
    /// Held by a zkguard contender: its session holds a queue node in the monitor.
    Held { data: Option<NodeData>, stat: Stat },
    /// Not one of zkguard's (see [`MonitorState::stray`]).
    Stray { stat: Stat },
}

/// A monitor's mutex and queue, read in the order that keeps a live holder from looking stray.
pub(crate) struct MonitorView {
    pub mutex: MutexView,
    /// Queue nodes in lock order.
    pub nodes: Vec<NodeView>,
}

impl MonitorView {
    /// The queue node of the holder: the one with the mutex's attempt id, else the first of
    /// the mutex's session.
    pub fn holder(&self) -> Option<&NodeView> {
        let MutexView::Held { data, stat } = &self.mutex else {
            return None;
        };
        let attempt = data.as_ref().map(|d| d.attempt.as_str());
        self.nodes
            .iter()
            .find(|n| attempt.is_some() && n.data.as_ref().map(|d| d.attempt.as_str()) == attempt)
            .or_else(|| {
                self.nodes
                    .iter()
                    .find(|n| n.stat.ephemeral_owner == stat.ephemeral_owner)
            })
    }

    /// What stands in the way of a contender of class `prefix` (with queue node `own`, if it
    /// has one): the holder, a stray mutex, or the contenders that go first.
    pub fn blocker(&self, mutex_path: &str, prefix: &str, own: Option<&str>) -> Blocker {
        match &self.mutex {
            MutexView::Stray { stat } => Blocker::StrayMutex {
                path: mutex_path.to_string(),
                session: (stat.ephemeral_owner != 0)
                    .then(|| format!("{:#x}", stat.ephemeral_owner)),
            },
            MutexView::Held { data, .. } => {
                let holder = self.holder();
                Blocker::Holder {
                    owner: data.as_ref().map(|d| d.owner.clone()),
                    info: data.as_ref().map(|d| d.info.clone()),
                    node: holder
                        .map(|h| h.node.name.clone())
                        .or_else(|| data.as_ref().and_then(|d| d.node.clone())),
                }
            }
            MutexView::Free => {
                let own = own.and_then(|o| self.nodes.iter().find(|n| n.node.name == o));
                let ahead: Vec<&NodeView> = self
                    .nodes
                    .iter()
                    .take_while(|n| match own {
                        Some(o) => n.node.name != o.node.name,
                        None => n.node.prefix.as_str() <= prefix,
                    })
                    .collect();
                match ahead.first() {
                    None => Blocker::Released,
                    Some(first) => Blocker::QueueAhead {
                        count: ahead.len(),
                        first_node: first.node.name.clone(),
                        first_class: first
                            .data
                            .as_ref()
                            .map_or_else(|| first.node.prefix.clone(), |d| d.lock_type.to_string()),
                        first_owner: first.data.as_ref().map(|d| d.owner.clone()),
                    },
                }
            }
        }
    }
}

/// Reads the mutex of the monitor at `monitor_path`, then its queue. `None` when the monitor
/// node does not exist.
///
/// A zkguard holder creates `privateLock` while its queue node exists (or in one multi with
/// it) and deletes it before or together with its queue node, so a mutex read *before* the
/// queue belongs to a session that shows a queue node in the queue read after, unless it was
/// released in between: then the mutex is read again, and only a mutex that is still the same
/// node counts as stray.
pub(crate) async fn read_monitor(
    client: &Client,
    monitor_path: &str,
) -> Result<Option<MonitorView>, ZkError> {
    let mutex_path = format!("{monitor_path}/{MUTEX_NODE}");
    let read_mutex = || async {
        match client.get_data(&mutex_path).await {
            Ok((bytes, stat)) => Ok(Some((
                serde_json::from_slice::<NodeData>(&bytes).ok(),
                stat,
            ))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    };
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mutex = read_mutex().await?;
        let children = match client.list_children(monitor_path).await {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut nodes = Vec::new();
        for node in Queue::from_children(&children).nodes {
            match client
                .get_data(&format!("{monitor_path}/{}", node.name))
                .await
            {
                Ok((bytes, stat)) => nodes.push(NodeView {
                    node,
                    data: serde_json::from_slice::<NodeData>(&bytes).ok(),
                    stat,
                }),
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        let mutex = match mutex {
            None => MutexView::Free,
            Some((data, stat)) => {
                let live = stat.ephemeral_owner != 0
                    && nodes
                        .iter()
                        .any(|n| n.stat.ephemeral_owner == stat.ephemeral_owner);
                if live {
                    MutexView::Held { data, stat }
                } else {
                    let again = read_mutex().await?;
                    match again {
                        Some((_, now)) if now.czxid == stat.czxid => MutexView::Stray { stat },
                        // Released (and maybe taken again) in between: read everything again.
                        _ if rounds < 5 => continue,
                        _ => MutexView::Held { data, stat },
                    }
                }
            }
        };
        return Ok(Some(MonitorView { mutex, nodes }));
    }
}

/// What `zkguard locks --clear-stray` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrayOutcome {
    /// The stray mutex node was removed; the session that owned it (`None`: persistent).
    Removed {
        /// Owner session, `0x…`.
        session: Option<String>,
    },
    /// The monitor has no mutex node: nothing to clear.
    NoMutex,
    /// The mutex node belongs to a live zkguard holder and was left alone.
    LiveHolder {
        /// The holder's owner id, when its node says.
        owner: Option<String>,
        /// The holder's queue node, when found.
        node: Option<String>,
    },
}

/// The name of the node `clear_stray` keeps in a monitor while it works (with a random
/// suffix): not a queue node's name (no `-<digits>`), so contenders and listings ignore it.
const CLEAR_STRAY_PIN: &str = "clearStray.";

/// How many times [`clear_stray`] inspects again when the monitor changed under it.
const CLEAR_STRAY_ROUNDS: usize = 5;

/// Removes the `privateLock` of `monitor` if it is stray (see [`MonitorState::stray`]); never
/// touches a live holder's mutex, even one that took the lock while the stray one was being
/// inspected.
///
/// It first pins the monitor node with an ephemeral child of its own, so that the monitor is not
/// deleted and created again meanwhile (the fast path does so with an empty monitor); reads the
/// monitor's data version; then inspects the mutex and the queue. The delete is one multi that
/// checks the monitor's data version read before the inspection, deletes the mutex of the
/// version inspected and the pin: every take of the mutex sets the monitor's data in its own
/// transaction, so a holder that took the lock since the inspection makes the multi fail (the
/// mutex is then inspected again, and reported as the live holder's). A take by a session that
/// may not write monitor nodes (see `docs/zookeeper-lock.md`, "ACLs of lock nodes") does not
/// set it and is not seen.
///
/// # Errors
/// [`LockError::InvalidMonitor`]; connection and session errors; a backend error when the
/// monitor kept changing under it.
///
/// # Cancellation safety
/// A dropped call may or may not have removed the stray node; its pin goes with the session.
#[tracing::instrument(name = "zk_clear_stray", skip(session))]
pub async fn clear_stray(session: &ZkSession, monitor: &str) -> Result<StrayOutcome, LockError> {
    crate::lock::validate_monitor(monitor)?;
    let slot = session.slot().await?;
    let client = &slot.client;
    let path = format!("{}/{monitor}", session.settings().lock_root);
    let pin = format!("{path}/{CLEAR_STRAY_PIN}{}", uuid::Uuid::new_v4().simple());
    let acl = super::acl::acl_list(&session.settings().acl);
    let options =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::new(&acl));
    match client.create(&pin, &[], &options).await {
        Ok(_) => {}
        // No monitor node: no mutex either.
        Err(ZkError::NoNode) => return Ok(StrayOutcome::NoMutex),
        Err(e) => {
            return Err(map_zk(
                e,
                "pinning the monitor node to clear its stray mutex",
            ))
        }
    }
    let outcome = clear_pinned(client, &path, &pin, monitor).await;
    if !matches!(outcome, Ok(StrayOutcome::Removed { .. })) {
        // The multi that removes the stray mutex takes the pin with it; otherwise it goes here
        // (or with the session).
        let _ = client.delete(&pin, None).await;
    }
    outcome
}

/// [`clear_stray`] once the monitor at `path` is pinned by the node `pin`.
async fn clear_pinned(
    client: &Client,
    path: &str,
    pin: &str,
    monitor: &str,
) -> Result<StrayOutcome, LockError> {
    let mutex_path = format!("{path}/{MUTEX_NODE}");
    for _ in 0..CLEAR_STRAY_ROUNDS {
        // Before the inspection: a take after this read changes it.
        let Some(monitor_stat) = client
            .check_stat(path)
            .await
            .map_err(|e| map_zk(e, "reading the monitor node"))?
        else {
            return Ok(StrayOutcome::NoMutex);
        };
        let view = read_monitor(client, path)
            .await
            .map_err(|e| map_zk(e, "reading the lock"))?;
        let Some(view) = view else {
            return Ok(StrayOutcome::NoMutex);
        };
        let stat = match &view.mutex {
            MutexView::Free => return Ok(StrayOutcome::NoMutex),
            MutexView::Held { data, .. } => {
                return Ok(StrayOutcome::LiveHolder {
                    owner: data.as_ref().map(|d| d.owner.clone()),
                    node: view.holder().map(|h| h.node.name.clone()),
                })
            }
            MutexView::Stray { stat } => *stat,
        };
        let mut multi = client.new_multi_writer();
        let added = multi
            .add_check_version(path, monitor_stat.version)
            .and_then(|()| multi.add_delete(&mutex_path, Some(stat.version)))
            .and_then(|()| multi.add_delete(pin, None));
        added.map_err(|e| map_zk(e, "removing the stray mutex"))?;
        match multi.commit().await {
            Ok(_) => {
                let session =
                    (stat.ephemeral_owner != 0).then(|| format!("{:#x}", stat.ephemeral_owner));
                tracing::warn!(path = %mutex_path, ?session, "removed a stray mutex node");
                return Ok(StrayOutcome::Removed { session });
            }
            // Gone since it was inspected: whatever is there now was not inspected.
            Err(zookeeper_client::MultiWriteError::OperationFailed {
                index: 1,
                source: ZkError::NoNode,
            }) => return Ok(StrayOutcome::NoMutex),
            // Taken since the inspection (the monitor's version moved), or the mutex changed:
            // inspect again.
            Err(zookeeper_client::MultiWriteError::OperationFailed {
                index: 0 | 1,
                source: ZkError::BadVersion,
            }) => tracing::debug!("the lock changed while it was inspected; inspecting again"),
            Err(zookeeper_client::MultiWriteError::OperationFailed { source, .. })
            | Err(zookeeper_client::MultiWriteError::RequestFailed { source }) => {
                return Err(map_zk(source, "removing the stray mutex"))
            }
        }
    }
    Err(LockError::Backend {
        context: format!("clearing the stray mutex of `{monitor}`"),
        detail: format!(
            "the lock changed each of the {CLEAR_STRAY_ROUNDS} times it was inspected; run the command again"
        ),
    })
}

fn age(ctime_ms: i64) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    (now - ctime_ms).max(0) as u64
}

/// Lists the holder and queue of `monitor`, or of every monitor under the lock root.
///
/// # Errors
/// Connection and session errors.
///
/// # Cancellation safety
/// Cancel-safe: it only reads.
pub async fn list_locks(
    session: &ZkSession,
    monitor: Option<&str>,
) -> Result<Vec<MonitorState>, LockError> {
    let slot = session.slot().await?;
    let client = &slot.client;
    let root = &session.settings().lock_root;
    let monitors = match monitor {
        Some(m) => {
            crate::lock::validate_monitor(m)?;
            vec![m.to_string()]
        }
        None => match client.list_children(root).await {
            Ok(mut m) => {
                m.sort();
                m
            }
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(map_zk(e, "listing monitors")),
        },
    };
    let mut out = Vec::new();
    for m in monitors {
        if let Some(state) = monitor_state(client, root, m).await? {
            out.push(state);
        }
    }
    Ok(out)
}

/// The holder and queue of monitor `m` under `root`; `None` when nobody holds, waits or left a
/// stray mutex (or the monitor node is gone).
async fn monitor_state(
    client: &Client,
    root: &str,
    m: String,
) -> Result<Option<MonitorState>, LockError> {
    let path = format!("{root}/{m}");
    let view = match read_monitor(client, &path).await {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(None),
        Err(e) => return Err(map_zk(e, "reading the lock")),
    };
    let holder_node = view.holder().map(|h| h.node.name.clone());
    let contenders: Vec<Contender> = view
        .nodes
        .iter()
        .map(|n| Contender {
            node: n.node.name.clone(),
            class: n.node.prefix.clone(),
            sequence: n.node.sequence,
            owner: n.data.as_ref().map(|d| d.owner.clone()),
            info: n.data.as_ref().map(|d| d.info.clone()),
            lock_type: n.data.as_ref().map(|d| d.lock_type.to_string()),
            age_ms: age(n.stat.ctime),
            session: format!("{:#x}", n.stat.ephemeral_owner),
            holder: holder_node.as_deref() == Some(n.node.name.as_str()),
        })
        .collect();
    let (token, stray_session) = match &view.mutex {
        MutexView::Free => (None, None),
        MutexView::Held { stat, .. } => (Some(super::protocol::from_zxid(stat.czxid as u64)), None),
        MutexView::Stray { stat } => (None, Some(format!("{:#x}", stat.ephemeral_owner))),
    };
    let stray = stray_session.is_some();
    if contenders.is_empty() && token.is_none() && !stray {
        return Ok(None);
    }
    Ok(Some(MonitorState {
        monitor: m,
        holder: contenders.iter().find(|c| c.holder).cloned(),
        token,
        queue: contenders,
        stray,
        stray_session,
    }))
}

/// One page of the busy monitors ([`list_locks_page`]).
#[derive(Debug, Clone, Serialize)]
pub struct LocksPage {
    /// Monitors (matching the filter) with a holder, a queue or a mutex node, all pages
    /// together.
    pub total: usize,
    /// Of those, how many have a mutex node (held, or a stray mutex).
    pub held: usize,
    /// Queue nodes in those monitors (holders included).
    pub queued: usize,
    /// The page's monitors, by name, read in full. A monitor that emptied between the count
    /// and the read is left out, so a page may hold fewer than asked.
    pub monitors: Vec<MonitorState>,
}

/// Monitors whose children are read in one multi-read request by [`list_locks_page`] (fewer
/// when their paths would pass `zookeeper.max.request.bytes`).
const CENSUS_BATCH: usize = 500;

/// Monitors read in full at once (pipelined on the session's connection).
const PAGE_READS: usize = 32;

/// The monitors under the lock root whose name contains `filter`, counted, and page
/// `offset..offset + limit` of them read in full (holder, queue, stray mutex), by name.
///
/// It costs one child listing of the lock root, one multi-read request per 500 monitors (their children: who is queued, whether the mutex exists), and the full reads of
/// the page's monitors only: tens of thousands of monitors are counted in a few requests.
///
/// # Errors
/// Connection and session errors.
///
/// # Cancellation safety
/// Cancel-safe: it only reads.
#[tracing::instrument(name = "zk_list_locks_page", skip(session))]
pub async fn list_locks_page(
    session: &ZkSession,
    filter: &str,
    offset: usize,
    limit: usize,
) -> Result<LocksPage, LockError> {
    use futures::{StreamExt, TryStreamExt};
    use zookeeper_client::MultiReadResult;
    let slot = session.slot().await?;
    let client = &slot.client;
    let root = &session.settings().lock_root;
    let mut names = match client.list_children(root).await {
        Ok(names) => names,
        Err(ZkError::NoNode) => Vec::new(),
        Err(e) => return Err(map_zk(e, "listing monitors")),
    };
    names.retain(|m| m.contains(filter));
    names.sort();
    let (mut busy, mut held, mut queued) = (Vec::new(), 0, 0);
    let per_request = CENSUS_BATCH.min(slot.limit.reads(root.len() + 1 + MAX_MONITOR_LEN));
    for batch in names.chunks(per_request) {
        let mut reader = client.new_multi_reader();
        for m in batch {
            reader
                .add_get_children(&format!("{root}/{m}"))
                .map_err(|e| map_zk(e, "listing monitors"))?;
        }
        let results = reader
            .commit()
            .await
            .map_err(|e| map_zk(e, "reading the monitors' queues"))?;
        for (m, result) in batch.iter().zip(results) {
            // A monitor reaped since the root was listed answers NoNode: it is not busy.
            let MultiReadResult::Children { children } = result else {
                continue;
            };
            let queue = Queue::from_children(&children);
            if queue.nodes.is_empty() && !queue.mutex_present {
                continue;
            }
            held += usize::from(queue.mutex_present);
            queued += queue.nodes.len();
            busy.push(m);
        }
    }
    let page: Vec<String> = busy
        .iter()
        .skip(offset)
        .take(limit)
        .map(|m| m.to_string())
        .collect();
    let monitors: Vec<MonitorState> = futures::stream::iter(page)
        .map(|m| monitor_state(client, root, m))
        .buffered(PAGE_READS)
        .try_filter_map(|state| std::future::ready(Ok(state)))
        .try_collect()
        .await?;
    Ok(LocksPage {
        total: busy.len(),
        held,
        queued,
        monitors,
    })
}

/// A watch on a monitor's nodes ([`watch_monitor`]).
#[derive(Debug)]
pub struct MonitorWatch(zookeeper_client::OneshotWatcher);

impl MonitorWatch {
    /// Resolves at the monitor's next change: a node of its queue or its mutex created or
    /// deleted, the monitor node itself created or deleted; or when the session's connection
    /// breaks (ask again then).
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropping it only forgets the watch.
    pub async fn changed(self) {
        let _ = self.0.changed().await;
    }
}

/// The change index of `monitor`, and a watch that fires at its next change.
///
/// The index is the zxid of the monitor's last change: the last creation or deletion of one of
/// its nodes (the holder's mutex, a queue node), or of the monitor node itself; 0 when there is
/// no monitor node. It only grows, so a caller that saw index `N` waits for a change with
/// [`MonitorWatch::changed`] while the index is still `N` (a blocking query, as Consul's).
///
/// # Errors
/// [`LockError::InvalidMonitor`]; connection and session errors.
///
/// # Cancellation safety
/// Cancel-safe: it only reads.
pub async fn watch_monitor(
    session: &ZkSession,
    monitor: &str,
) -> Result<(i64, MonitorWatch), LockError> {
    crate::lock::validate_monitor(monitor)?;
    let slot = session.slot().await?;
    let client = &slot.client;
    let path = format!("{}/{monitor}", session.settings().lock_root);
    loop {
        match client.get_and_watch_children(&path).await {
            Ok((_, stat, watcher)) => return Ok((stat.pzxid, MonitorWatch(watcher))),
            Err(ZkError::NoNode) => {}
            Err(e) => return Err(map_zk(e, "watching the lock")),
        }
        // No monitor node: watch for its creation (or find it created meanwhile).
        match client.check_and_watch_stat(&path).await {
            Ok((None, watcher)) => return Ok((0, MonitorWatch(watcher))),
            Ok((Some(_), _)) => continue,
            Err(e) => return Err(map_zk(e, "watching the lock")),
        }
    }
}
