//! A model of ZooKeeper's client-visible semantics, as far as the lock uses them: one lock root
//! node and one monitor below it; persistent, container, ephemeral and sequential nodes; data
//! versions and the zxids of a stat; a `multi` applied all or nothing under one zxid; one-shot
//! data watches; sessions whose end deletes their ephemeral nodes in one transaction; container
//! nodes reaped once emptied. Sequence numbers come from a counter of the parent that every
//! creation of a child moves, a deletion not (as ZooKeeper 3.8.0 does, which
//! `zk_lock::requests::sequence_numbers_count_the_creations_of_children` checks; the child
//! version, which a deletion moves too, is a separate count), so names repeat once a monitor
//! is recreated.
//!
//! Answers follow ZooKeeper 3.8.0 where 3.8 releases differ: a create inside a multi answers an
//! invalid stat (ZOOKEEPER-4026), a `setData` inside a multi a valid one.

use std::collections::BTreeMap;

use zkguard::zk::protocol::{
    Code, Content, Fired, Mode, MultiError, Op, OpResult, Read, Reply, Request, Stat, Target,
};

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub attempt: Option<String>,
    pub owner: i64,
    pub container: bool,
    pub version: i32,
    pub cversion: i32,
    /// Children created so far: the next sequence number.
    pub created: i32,
    pub czxid: i64,
    pub mzxid: i64,
    pub pzxid: i64,
}

/// The server: its nodes, its last zxid, the data watches of each session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Zk {
    pub nodes: BTreeMap<Target, Node>,
    pub zxid: i64,
    /// Per session id: the path it watches (one at a time: a driver keeps one watcher).
    pub watches: BTreeMap<i64, Target>,
    /// Per session id: what fired its watch, not yet delivered.
    pub fired: BTreeMap<i64, Fired>,
}

fn parent(target: &Target) -> Option<Target> {
    match target {
        Target::Root(0) => None,
        Target::Root(i) => Some(Target::Root(i - 1)),
        // The model's lock root has one node: `Root(0)`.
        Target::Monitor => Some(Target::Root(0)),
        Target::Mutex | Target::Node(_) => Some(Target::Monitor),
    }
}

fn name_of(target: &Target) -> String {
    match target {
        Target::Mutex => "privateLock".into(),
        Target::Node(name) => name.clone(),
        Target::Monitor => "monitor".into(),
        Target::Root(i) => format!("root{i}"),
    }
}

impl Zk {
    /// A server holding the lock root.
    pub fn new() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            Target::Root(0),
            Node {
                attempt: None,
                owner: 0,
                container: false,
                version: 0,
                cversion: 0,
                created: 0,
                czxid: 1,
                mzxid: 1,
                pzxid: 1,
            },
        );
        Self {
            nodes,
            zxid: 1,
            watches: BTreeMap::new(),
            fired: BTreeMap::new(),
        }
    }

    fn stat(node: &Node) -> Stat {
        Stat {
            czxid: node.czxid,
            mzxid: node.mzxid,
            pzxid: node.pzxid,
            version: node.version,
            owner: node.owner,
            valid: true,
        }
    }

    /// The children of `target`.
    pub fn children(&self, target: &Target) -> Vec<Target> {
        self.nodes
            .keys()
            .filter(|t| parent(t).as_ref() == Some(target))
            .cloned()
            .collect()
    }

    fn fire(&mut self, target: &Target, fired: Fired) {
        let watchers: Vec<i64> = self
            .watches
            .iter()
            .filter(|(_, t)| *t == target)
            .map(|(s, _)| *s)
            .collect();
        for session in watchers {
            self.watches.remove(&session);
            self.fired.insert(session, fired);
        }
    }

    /// Applies one operation at zxid `zxid` (already taken), or refuses it (nothing changed).
    fn apply_op(
        &mut self,
        session: i64,
        attempt: &str,
        op: &Op,
        zxid: i64,
        events: &mut Vec<(Target, Fired)>,
    ) -> Result<OpResult, Code> {
        match op {
            Op::Create {
                target,
                content,
                mode,
            } => {
                let up = parent(target);
                let parent_node = match &up {
                    Some(p) => Some(self.nodes.get(p).ok_or(Code::NoNode)?.clone()),
                    None => None,
                };
                if parent_node.as_ref().is_some_and(|p| p.owner != 0) {
                    return Err(Code::Other("NoChildrenForEphemerals".into()));
                }
                let target = match (target, mode) {
                    (Target::Node(prefix), Mode::EphemeralSequential) => {
                        let seq = parent_node.as_ref().map_or(0, |p| p.created);
                        Target::Node(format!("{prefix}-{seq:010}"))
                    }
                    (target, _) => target.clone(),
                };
                if self.nodes.contains_key(&target) {
                    return Err(Code::NodeExists);
                }
                let node = Node {
                    attempt: match content {
                        Content::Empty => None,
                        Content::Contender | Content::Mutex { .. } => Some(attempt.to_string()),
                    },
                    owner: match mode {
                        Mode::Ephemeral | Mode::EphemeralSequential => session,
                        _ => 0,
                    },
                    container: *mode == Mode::Container,
                    version: 0,
                    cversion: 0,
                    created: 0,
                    czxid: zxid,
                    mzxid: zxid,
                    pzxid: zxid,
                };
                self.nodes.insert(target.clone(), node);
                if let Some(p) = up.and_then(|p| self.nodes.get_mut(&p)) {
                    p.cversion += 1;
                    p.created += 1;
                    p.pzxid = zxid;
                }
                Ok(OpResult::Create {
                    name: name_of(&target),
                    // ZOOKEEPER-4026: no valid stat for a create inside a multi on 3.8.0.
                    stat: Stat::default(),
                })
            }
            Op::Delete { target, version } => {
                let node = self.nodes.get(target).ok_or(Code::NoNode)?;
                if version.is_some_and(|v| v != node.version) {
                    return Err(Code::BadVersion);
                }
                if !self.children(target).is_empty() {
                    return Err(Code::NotEmpty);
                }
                self.nodes.remove(target);
                if let Some(p) = parent(target).and_then(|p| self.nodes.get_mut(&p)) {
                    p.cversion += 1;
                    p.pzxid = zxid;
                }
                events.push((target.clone(), Fired::Deleted));
                Ok(OpResult::Delete)
            }
            Op::SetData { target } => {
                let node = self.nodes.get_mut(target).ok_or(Code::NoNode)?;
                node.version += 1;
                node.mzxid = zxid;
                node.attempt = None;
                events.push((target.clone(), Fired::DataChanged));
                Ok(OpResult::SetData {
                    stat: Self::stat(node),
                })
            }
            Op::Check { target, version } => {
                let node = self.nodes.get(target).ok_or(Code::NoNode)?;
                if node.version != *version {
                    return Err(Code::BadVersion);
                }
                Ok(OpResult::Check)
            }
        }
    }

    /// Applies `ops` all or nothing, under one zxid.
    fn multi(
        &mut self,
        session: i64,
        attempt: &str,
        ops: &[Op],
    ) -> Result<Vec<OpResult>, MultiError> {
        let mut trial = self.clone();
        let zxid = self.zxid + 1;
        let mut events = Vec::new();
        let mut results = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            match trial.apply_op(session, attempt, op, zxid, &mut events) {
                Ok(result) => results.push(result),
                Err(code) => return Err(MultiError::Failed { index, code }),
            }
        }
        *self = trial;
        self.zxid = zxid;
        for (target, fired) in events {
            self.fire(&target, fired);
        }
        Ok(results)
    }

    /// Applies a session's request and answers it. `attempt`: the attempt id the request's
    /// creates carry.
    pub fn apply(&mut self, session: i64, attempt: &str, request: &Request) -> Reply {
        match request {
            Request::Multi(ops) => Reply::Multi(self.multi(session, attempt, ops)),
            Request::Single(op @ Op::Create { .. }) => {
                match self.multi(session, attempt, std::slice::from_ref(op)) {
                    Ok(mut results) => match results.pop() {
                        Some(OpResult::Create { name, .. }) => {
                            let target = if name == "privateLock" {
                                Target::Mutex
                            } else if name == "monitor" {
                                Target::Monitor
                            } else if let Some(i) = name.strip_prefix("root") {
                                Target::Root(i.parse().unwrap_or(0))
                            } else {
                                Target::Node(name.clone())
                            };
                            let stat = Self::stat(&self.nodes[&target]);
                            Reply::Created(Ok((name, stat)))
                        }
                        _ => {
                            Reply::Created(Err(Code::Other("create answered out of shape".into())))
                        }
                    },
                    Err(MultiError::Failed { code, .. }) => Reply::Created(Err(code)),
                    Err(_) => Reply::Created(Err(Code::Other("create failed".into()))),
                }
            }
            Request::Single(op) => match self.multi(session, attempt, std::slice::from_ref(op)) {
                Ok(_) => Reply::Deleted(Ok(())),
                Err(MultiError::Failed { code, .. }) => Reply::Deleted(Err(code)),
                Err(_) => Reply::Deleted(Err(Code::Other("delete failed".into()))),
            },
            Request::GetChildren(target) => Reply::Children(match self.nodes.get(target) {
                Some(node) => Ok((
                    self.children(target).iter().map(name_of).collect(),
                    Self::stat(node),
                )),
                None => Err(Code::NoNode),
            }),
            Request::GetData(target) => Reply::Data(self.read(target)),
            Request::Watch(target) => {
                let read = self.read(target);
                if read.is_ok() {
                    // The driver keeps one watcher: a new one replaces the old, whose event,
                    // fired or not, is never heard.
                    self.watches.insert(session, target.clone());
                    self.fired.remove(&session);
                }
                Reply::Data(read)
            }
            Request::Sync(_) => Reply::Synced(Ok(())),
        }
    }

    fn read(&self, target: &Target) -> Result<Read, Code> {
        let node = self.nodes.get(target).ok_or(Code::NoNode)?;
        Ok(Read {
            attempt: node.attempt.clone(),
            stat: Self::stat(node),
        })
    }

    /// The end of a session: its ephemeral nodes go in one transaction.
    pub fn close_session(&mut self, session: i64) {
        let mine: Vec<Target> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.owner == session)
            .map(|(t, _)| t.clone())
            .collect();
        self.watches.remove(&session);
        self.fired.remove(&session);
        if mine.is_empty() {
            return;
        }
        let ops: Vec<Op> = mine
            .into_iter()
            .map(|target| Op::Delete {
                target,
                version: None,
            })
            .collect();
        let _ = self.multi(session, "", &ops);
    }

    /// Whether the container reaper may delete the monitor: a container that had children
    /// and has none.
    pub fn monitor_reapable(&self) -> bool {
        self.nodes
            .get(&Target::Monitor)
            .is_some_and(|m| m.container && m.cversion > 0)
            && self.children(&Target::Monitor).is_empty()
    }

    /// An operator deletes a node (whatever its owner).
    pub fn delete_as_operator(&mut self, target: &Target) {
        let _ = self.multi(
            0,
            "",
            &[Op::Delete {
                target: target.clone(),
                version: None,
            }],
        );
    }

    /// The container reaper deletes the emptied monitor.
    pub fn reap_monitor(&mut self) {
        let _ = self.multi(
            0,
            "",
            &[Op::Delete {
                target: Target::Monitor,
                version: None,
            }],
        );
    }
}
