//! The vocabulary between the lock's sans-IO core and whatever performs its requests: the
//! requests (paths relative to one monitor), ZooKeeper's answers, and the events a contender
//! waits for.

/// A node of one monitor, or of the lock root above it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// The monitor node (a container).
    Monitor,
    /// `privateLock`, the mutex.
    Mutex,
    /// A queue node of the monitor, by child name (`A-0000000012`).
    Node(String),
    /// The `i`-th ancestor of the monitor counted from the top: `0` is the first segment of
    /// the lock root (`/zkguard`), the last one the lock root itself.
    Root(usize),
}

/// What a created node holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Content {
    /// No data (monitor nodes, the lock root).
    Empty,
    /// The contender's data: owner, lock info, this acquisition's attempt id.
    Contender,
    /// The contender's data naming its queue node (the mutex of a contender that queued).
    Mutex {
        /// The holder's queue node.
        node: String,
    },
}

/// How a node is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Stays until deleted.
    Persistent,
    /// Deleted by ZooKeeper once it had a child and has none left.
    Container,
    /// Goes with its session.
    Ephemeral,
    /// Goes with its session; the name gets the parent's next sequence number. The target of
    /// such a create is [`Target::Node`] holding the prefix alone (`A`).
    EphemeralSequential,
}

/// One operation of a `multi` (or a request of its own).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Creates a node.
    Create {
        /// Where (for a sequential node, `Target::Node(prefix)`).
        target: Target,
        /// Its data.
        content: Content,
        /// Its mode.
        mode: Mode,
    },
    /// Deletes a node, of that version if given.
    Delete {
        /// Which.
        target: Target,
        /// Its expected version.
        version: Option<i32>,
    },
    /// Empties a node's data (zkguard never writes anything else).
    SetData {
        /// Which.
        target: Target,
    },
    /// Checks a node's data version.
    Check {
        /// Which.
        target: Target,
        /// The version it must have.
        version: i32,
    },
}

/// A request to ZooKeeper.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Request {
    /// Operations applied all or nothing.
    Multi(Vec<Op>),
    /// One operation on its own ([`Op::Create`] or [`Op::Delete`]).
    Single(Op),
    /// Lists a node's children.
    GetChildren(Target),
    /// Reads a node.
    GetData(Target),
    /// Reads a node and leaves a one-shot data watch on it (none when it does not exist).
    Watch(Target),
    /// Lets the server catch up with the leader before the next request.
    Sync(Target),
}

/// What ZooKeeper refused or what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Code {
    /// No such node.
    NoNode,
    /// The node exists.
    NodeExists,
    /// The node has children.
    NotEmpty,
    /// The version did not match.
    BadVersion,
    /// Refused by an ACL.
    NoAuth,
    /// The ACL was refused.
    InvalidAcl,
    /// The answer was lost (the connection broke or timed out): the request may or may not
    /// have been applied.
    Lost(String),
    /// The session expired.
    Expired,
    /// The session was closed.
    Closed,
    /// An answer that could not be read, or anything else.
    Other(String),
}

impl Code {
    /// Whether the request's answer was lost: it may or may not have been applied.
    pub fn is_lost(&self) -> bool {
        matches!(self, Code::Lost(_))
    }
}

/// A node's stat, as far as the lock reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stat {
    /// The zxid of the transaction that created it.
    pub czxid: i64,
    /// The zxid of the transaction that last modified it.
    pub mzxid: i64,
    /// The zxid of the transaction that last changed its children.
    pub pzxid: i64,
    /// Its data version.
    pub version: i32,
    /// The session owning it, if ephemeral (0 otherwise).
    pub owner: i64,
    /// Whether the server filled it in (ZooKeeper 3.8.0 returns none for a create inside a
    /// multi, ZOOKEEPER-4026).
    pub valid: bool,
}

/// The result of one operation of an applied multi.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OpResult {
    /// A create: the child name it made and the node's stat.
    Create {
        /// Child name (a sequential node's full name).
        name: String,
        /// Its stat.
        stat: Stat,
    },
    /// A delete.
    Delete,
    /// A `setData`: the node's stat after it.
    SetData {
        /// The stat.
        stat: Stat,
    },
    /// A check.
    Check,
}

/// How a multi ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MultiError {
    /// Operation `index` was refused: nothing was applied.
    Failed {
        /// Which operation (among the core's own, when carried by a release).
        index: usize,
        /// Why.
        code: Code,
    },
    /// The request as a whole failed, or its answer was lost: it may have been applied.
    Request(Code),
    /// Carried by a release whose own part failed: nothing was applied, the release went on
    /// its own (see [`Send::carry`]).
    NotCarried,
}

/// A node read: its data's attempt id (`None` when its data is not a contender's) and stat.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Read {
    /// The attempt id in its data.
    pub attempt: Option<String>,
    /// Its stat.
    pub stat: Stat,
}

/// ZooKeeper's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reply {
    /// To [`Request::Multi`].
    Multi(Result<Vec<OpResult>, MultiError>),
    /// To a create: the child name made and its stat.
    Created(Result<(String, Stat), Code>),
    /// To a delete.
    Deleted(Result<(), Code>),
    /// To [`Request::GetChildren`]: the children and the parent's stat.
    Children(Result<(Vec<String>, Stat), Code>),
    /// To [`Request::GetData`] or [`Request::Watch`].
    Data(Result<Read, Code>),
    /// To [`Request::Sync`].
    Synced(Result<(), Code>),
    /// Not sent (a read pipelined behind a multi that a release sends later, from its task).
    Skipped,
}

/// What fired a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fired {
    /// The node's data changed (a release's hand-over mark).
    DataChanged,
    /// The node was deleted.
    Deleted,
    /// A session event (the watch ended without a change of the node).
    Session,
}

/// Requests to send, pipelined: their replies come back in order, in one [`Input::Replies`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Send {
    /// The requests.
    pub requests: Vec<Request>,
    /// The first request (a multi) goes with the release of the lock this acquisition follows
    /// (`release_and_acquire`): the release's operations first, in one transaction. When
    /// `false`, a lock still to be released goes on its own first.
    pub carry: bool,
}

/// What the core asks of its driver next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// Send these and answer with [`Input::Replies`].
    Send(Send),
    /// Wait for the watch just set to fire ([`Input::Fired`]), for the time to look again
    /// ([`Input::Woke`] at `Acquisition::poll_timeout`: the deadline, or a starving background
    /// waiter's promotion) or for the session to end ([`Input::Ended`]).
    AwaitWatch,
    /// Wait until connected ([`Input::Connected`]); the driver gives up with a connection loss
    /// at the deadline (the core's nodes, and what a request in doubt may have made, go to the
    /// session's reaper).
    AwaitConnected,
    /// Wait a little (a retry after a connection loss), then [`Input::Woke`].
    Backoff,
    /// Find out what stands in the way (for the timeout's error), then [`Input::Described`].
    Describe,
    /// Finished.
    Done,
}

/// What the driver tells the core.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    /// The replies to the last [`Action::Send`], in order.
    Replies(Vec<Reply>),
    /// The watch fired.
    Fired(Fired),
    /// Time to look again.
    Woke,
    /// Connected again.
    Connected,
    /// The session ended while waiting.
    Ended,
    /// What stood in the way was read.
    Described,
}
