//! The lock abstraction shared by both backends.
//!
//! A [`LockService`] hands out [`Guard`]s for monitor objects. zkguard ships two services: the
//! ZooKeeper priority lock ([`crate::zk::ZkLockService`], the default) and the Elasticsearch lease
//! lock (`crate::eslock`). Guarded writes, background operations, `zkguard exec` and the demo only
//! see this trait, so `lock.backend` switches between them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

mod monitor;
pub(crate) use monitor::znode_char;
pub use monitor::{document_monitor, validate_monitor, MAX_MONITOR_LEN};

/// The class of a contender: foreground work goes before background work.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LockType {
    /// A person or a synchronous call is waiting ("Save Content"). The default.
    #[default]
    Foreground,
    /// Bulk propagation, searchable updates, KPI jobs.
    Background,
}

impl LockType {
    /// `"foreground"` or `"background"`: the name it is configured and reported by.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Foreground => "foreground",
            Self::Background => "background",
        }
    }
}

impl fmt::Display for LockType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for LockType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "foreground" | "fg" => Ok(Self::Foreground),
            "background" | "bg" => Ok(Self::Background),
            other => Err(format!(
                "unknown lock type `{other}`: use foreground or background"
            )),
        }
    }
}

/// Why a held lock stopped being held without its holder releasing it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LossReason {
    /// The ZooKeeper session expired: the server deleted the holder's ephemeral nodes.
    #[error("the ZooKeeper session expired")]
    SessionExpired,
    /// The ZooKeeper quorum answered nothing for the session for longer than the grace
    /// (`zookeeper.lock.loss.grace`, counted from the last request it answered): the connection
    /// is down, or the server it reaches is a follower cut off from the leader. The leader may
    /// soon expire the session and hand the lock to someone else. (The message says
    /// "disconnected" in both cases, as it always did.)
    #[error("disconnected from ZooKeeper for longer than {grace:?}")]
    Disconnected {
        /// The grace that was exceeded.
        grace: Duration,
    },
    /// The mutex node (`privateLock`) was deleted or replaced by someone else.
    #[error("the lock's mutex node was deleted by someone else")]
    MutexDeleted,
    /// The lease was taken over by another owner (Elasticsearch backend).
    #[error("the lease was taken over by `{by}`")]
    TakenOver {
        /// The new owner.
        by: String,
    },
    /// The lease expired before it could be renewed (Elasticsearch backend).
    #[error("the lease expired before it could be renewed")]
    LeaseExpired,
    /// The lock service was closed.
    #[error("the lock service was closed")]
    Closed,
}

/// What stood in the way of a contender that gave up ([`LockError::Timeout`]), as read from
/// the lock itself when it gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Blocker {
    /// Another contender held the lock.
    Holder {
        /// Its owner id (`host:pid:random`), when its lock node says.
        owner: Option<String>,
        /// Its lock info ("Save Content"), when its lock node says.
        info: Option<String>,
        /// Its queue node (ZooKeeper), when known.
        node: Option<String>,
    },
    /// Nobody held the lock, but contenders that go first were queued ahead (ZooKeeper).
    QueueAhead {
        /// How many.
        count: usize,
        /// The first one's queue node, e.g. `A-0000000012`.
        first_node: String,
        /// The first one's class (`foreground`/`background`, or the node prefix when its data
        /// could not be read).
        first_class: String,
        /// The first one's owner id, when its node says.
        first_owner: Option<String>,
    },
    /// Foreground contenders were waiting, and a background one lets them go first
    /// (Elasticsearch lease lock).
    ForegroundWaiters {
        /// How many registrations were live.
        count: usize,
    },
    /// A `privateLock` node that no zkguard contender holds blocked the lock (ZooKeeper): a
    /// persistent node, or an ephemeral one of a session with no queue node in the monitor.
    /// `zkguard locks --monitor ID --clear-stray` removes it.
    StrayMutex {
        /// Path of the node.
        path: String,
        /// The session owning it (`0x…`), or `None` when it is persistent.
        session: Option<String>,
    },
    /// The lock was free when the contender gave up (it was released just then).
    Released,
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Holder { owner, info, node } => {
                write!(
                    f,
                    "held by {}",
                    owner.as_deref().unwrap_or("an unknown owner")
                )?;
                let mut extra = Vec::new();
                if let Some(i) = info {
                    extra.push(format!("info {i:?}"));
                }
                if let Some(n) = node {
                    extra.push(format!("node {n}"));
                }
                if !extra.is_empty() {
                    write!(f, " ({})", extra.join(", "))?;
                }
                Ok(())
            }
            Self::QueueAhead {
                count,
                first_node,
                first_class,
                first_owner,
            } => write!(
                f,
                "{count} contender{} queued ahead, first {first_node} ({first_class}, owner {})",
                if *count == 1 { "" } else { "s" },
                first_owner.as_deref().unwrap_or("unknown")
            ),
            Self::ForegroundWaiters { count } => write!(
                f,
                "{count} foreground contender{} waiting, which go first",
                if *count == 1 { "" } else { "s" }
            ),
            Self::StrayMutex { path, session } => {
                let monitor = path.rsplit('/').nth(1).unwrap_or_default();
                write!(
                    f,
                    "a stray mutex node {path} ({}) blocks every contender; remove it with `zkguard locks --monitor {monitor} --clear-stray`",
                    match session {
                        None => "persistent, not a zkguard holder's".to_string(),
                        Some(s) => format!("ephemeral of session {s}, which holds no queue node"),
                    }
                )
            }
            Self::Released => f.write_str("it was released just as the wait ended"),
        }
    }
}

fn blocker(b: &Option<Box<Blocker>>) -> String {
    match b {
        Some(b) => b.to_string(),
        None => "what held it could not be read".into(),
    }
}

/// Errors of the lock layer, mirroring the design's exceptions.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The design's `InstanceLockException`: the lock was not acquired in time. With a zero
    /// timeout (try once) this comes at once when the lock is not free.
    #[error("lock on `{monitor}` ({lock_type}) not acquired within {}ms: {}; retry later or raise the {lock_type} timeout", waited.as_millis(), blocker(.blocked_by))]
    Timeout {
        /// Monitor object.
        monitor: String,
        /// Lock type.
        lock_type: LockType,
        /// How long the contender waited.
        waited: Duration,
        /// What stood in the way when it gave up; `None` when that could not be read. See
        /// [`LockError::blocked_by`].
        blocked_by: Option<Box<Blocker>>,
    },
    /// The design's `SessionExpiredException`.
    #[error("ZooKeeper session expired{}: the lock (if any) is gone; retry with a new session", ctx(.context))]
    SessionExpired {
        /// What was being done.
        context: String,
    },
    /// The design's `ConnectionLossException`: the service could not be reached.
    #[error("no connection to the lock service{}: {detail}", ctx(.context))]
    ConnectionLoss {
        /// What was being done.
        context: String,
        /// Underlying error, ending with the one piece of advice that fits it (for example
        /// "check zookeeper.servers and that ZooKeeper is running"); the message adds none.
        detail: String,
    },
    /// The chroot named at the end of `zookeeper.servers` does not exist on the server.
    #[error("the chroot `{chroot}` named in zookeeper.servers does not exist on ZooKeeper at {servers}; create it (e.g. `zkCli.sh -server {servers} create {chroot}`) or remove it from zookeeper.servers")]
    MissingChroot {
        /// The chroot path.
        chroot: String,
        /// The servers, without the chroot.
        servers: String,
    },
    /// The design's `NoNodeException`: `unlock()` of a lock that no longer exists.
    #[error(
        "unlock of `{monitor}`: the lock no longer exists ({detail}); it was lost before release"
    )]
    NoNode {
        /// Monitor object.
        monitor: String,
        /// What was missing.
        detail: String,
    },
    /// A held lock was lost (see [`LossReason`]).
    #[error("lock on `{monitor}` was lost: {reason}")]
    Lost {
        /// Monitor object.
        monitor: String,
        /// Why.
        reason: LossReason,
    },
    /// The monitor object name cannot be used.
    #[error("invalid monitor object name {name:?}: {reason}")]
    InvalidMonitor {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The lock info is longer than [`MAX_INFO_LEN`] (see [`validate_info`]).
    #[error("lock info of {len} bytes is too long: the limit is {limit} bytes (UTF-8), since it is stored in the lock's nodes; shorten it to a short description of the work, e.g. \"Save Content\"")]
    InfoTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_INFO_LEN`].
        limit: usize,
    },
    /// `must_release` found nothing held.
    #[error("release of `{monitor}`: nothing was held by this owner")]
    NotHeld {
        /// Monitor object.
        monitor: String,
    },
    /// The lock root exists with another ACL than `zookeeper.acl` gives the nodes zkguard
    /// creates.
    #[error("the lock root `{root}` exists with ACL {found}, not the one zookeeper.acl gives ({expected}); set zookeeper.acl to match it, give the root that ACL (zkCli.sh setAcl), or choose another zookeeper.lock.root")]
    LockRootAcl {
        /// The lock root.
        root: String,
        /// Its ACL, as `scheme:id:perms,...`.
        found: String,
        /// The configured ACL.
        expected: String,
    },
    /// Any other error of the backend.
    #[error("lock service error{}: {detail}", ctx(.context))]
    Backend {
        /// What was being done.
        context: String,
        /// Underlying error.
        detail: String,
    },
}

fn ctx(c: &str) -> String {
    if c.is_empty() {
        String::new()
    } else {
        format!(" while {c}")
    }
}

impl LockError {
    /// What stood in the way of a [`LockError::Timeout`], when it could be read.
    pub fn blocked_by(&self) -> Option<&Blocker> {
        match self {
            Self::Timeout { blocked_by, .. } => blocked_by.as_deref(),
            _ => None,
        }
    }

    /// For a [`LockError::Timeout`] of a request that tried once (a zero timeout, on purpose):
    /// the message without the advice to wait longer, which the caller chose not to.
    pub fn try_once_message(&self) -> Option<String> {
        match self {
            Self::Timeout {
                monitor,
                lock_type,
                blocked_by,
                ..
            } => Some(format!(
                "lock on `{monitor}` ({lock_type}) is not free: {}; it was tried once, without waiting (timeout 0): try again later, or give a timeout to wait for it",
                blocker(blocked_by)
            )),
            _ => None,
        }
    }

    /// Whether retrying the same operation later may succeed (timeouts and connection trouble).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. }
                | Self::SessionExpired { .. }
                | Self::ConnectionLoss { .. }
                | Self::Lost { .. }
        )
    }
}

/// The longest lock info ([`LockRequest::info`]), in bytes of UTF-8.
///
/// The info is stored in the lock's nodes: on ZooKeeper in the queue node and in the mutex node
/// of every acquisition, which go to the servers together with up to hundreds of other
/// acquisitions in one multi (a request that ZooKeeper refuses beyond its `jute.maxbuffer`).
pub const MAX_INFO_LEN: usize = 1024;

/// Checks a lock info: at most [`MAX_INFO_LEN`] bytes.
///
/// # Errors
/// [`LockError::InfoTooLong`] naming its length and the limit.
pub fn validate_info(info: &str) -> Result<(), LockError> {
    if info.len() > MAX_INFO_LEN {
        return Err(LockError::InfoTooLong {
            len: info.len(),
            limit: MAX_INFO_LEN,
        });
    }
    Ok(())
}

/// What to lock: a monitor object, a lock type, descriptive info and an optional timeout override.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use zkguard::{LockRequest, LockType};
///
/// let request = LockRequest::new("article-42", "Bulk Propagation")
///     .with_type(LockType::Background)
///     .with_timeout(Duration::from_secs(30));
/// assert_eq!(request.monitor, "article-42");
/// // A zero timeout tries once and never waits.
/// let attempt = LockRequest::new("article-42", "Save Content").with_timeout(Duration::ZERO);
/// assert_eq!(attempt.timeout, Some(Duration::ZERO));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct LockRequest {
    /// The monitor object.
    pub monitor: String,
    /// Foreground or background.
    pub lock_type: LockType,
    /// Short description of the work ("Save Content"), at most [`MAX_INFO_LEN`] bytes: a longer
    /// one is refused when the lock is asked for ([`LockError::InfoTooLong`]).
    pub info: String,
    /// Overrides the lock type's configured timeout; zero means try once.
    pub timeout: Option<Duration>,
    /// Overrides how long the lock is held before its holder watches it for a loss that only
    /// a request can show (see [`LockRequest::with_loss_watch_after`]).
    pub loss_watch_after: Option<Duration>,
}

impl LockRequest {
    /// A foreground request with the configured timeout.
    pub fn new(monitor: impl Into<String>, info: impl Into<String>) -> Self {
        Self {
            monitor: monitor.into(),
            lock_type: LockType::Foreground,
            info: info.into(),
            timeout: None,
            loss_watch_after: None,
        }
    }

    /// Sets the lock type.
    pub fn with_type(mut self, lock_type: LockType) -> Self {
        self.lock_type = lock_type;
        self
    }

    /// Overrides the timeout. [`Duration::ZERO`] means try once: the lock is taken if it is
    /// free right now (and no contender that goes first is queued), otherwise the acquisition
    /// fails at once with [`LockError::Timeout`], leaving nothing queued behind.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How long the lock is held before its holder starts watching it for a loss that only a
    /// request can show: on ZooKeeper, the deletion of its `privateLock` node by someone else
    /// (an operator's forced unlock), which costs a read that sets a watch. The default is
    /// [`crate::zk::MUTEX_WATCH_AFTER`] (100 ms); awaiting [`Guard::lost`] starts the watch at once.
    /// Session expiry and a disconnection longer than the grace are seen at once either way.
    ///
    /// A holder whose every write is fenced by the lock's token (a batch of background writes)
    /// can wait longer: a write sent after such a loss is refused by fencing once the next
    /// holder has written. The Elasticsearch lease lock ignores it (it renews its lease anyway).
    pub fn with_loss_watch_after(mut self, after: Duration) -> Self {
        self.loss_watch_after = Some(after);
        self
    }
}

/// A lock service: ZooKeeper or Elasticsearch.
///
/// Code that only needs "the lock of a monitor object" takes an `Arc<dyn LockService>`, so the
/// backend (`lock.backend`) can change without touching it.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use zkguard::{config::Settings, es::EsStore, eslock::EsLockService};
/// use zkguard::{LockRequest, LockService, LockType, ZkLockService, ZkSession};
///
/// async fn save(locks: &dyn LockService) -> Result<(), zkguard::LockError> {
///     let guard = locks
///         .acquire(LockRequest::new("article-42", "Save Content").with_type(LockType::Foreground))
///         .await?;
///     // ... write article-42 with guard.fencing_token() as its external version ...
///     guard.unlock().await
/// }
///
/// let settings = Settings::load(None)?;
/// let zk: Arc<dyn LockService> =
///     Arc::new(ZkLockService::new(ZkSession::connect(&settings.zookeeper).await?));
/// save(zk.as_ref()).await?;
/// let store = Arc::new(EsStore::new(&settings.elasticsearch)?);
/// let es: Arc<dyn LockService> = Arc::new(EsLockService::from_settings(&settings, store)?);
/// save(es.as_ref()).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait LockService: Send + Sync + 'static {
    /// Waits up to the request's timeout for the lock; with a zero timeout, tries once.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when not acquired in time (at once with a zero timeout), naming
    /// what stood in the way; connection and session errors.
    ///
    /// # Cancellation safety
    /// Cancel-safe: a dropped acquisition removes whatever it had queued, in the background.
    async fn acquire(&self, request: LockRequest) -> Result<Box<dyn Guard>, LockError>;

    /// Releases `held` and acquires `next`, as `held.release()` followed by
    /// `self.acquire(next)`, in one step where the backend can: a client that goes from one
    /// lock to the next (a bulk job working through objects one at a time, or a worker with
    /// more work on the same object that lets the contenders queued meanwhile go first).
    ///
    /// On ZooKeeper, when `held` was acquired through this service's session, the
    /// acquisition's first multi also deletes `held`'s nodes: the fast path's operations on a
    /// quiet monitor, the create of the queue node on a monitor busy lately. That is a request
    /// and a transaction (with its `fsync`) less per lock cycle, and `held` is free the moment
    /// the next acquisition's first step is applied. If that step fails, nothing of it was
    /// applied: the release follows at once, one round trip later than `held.release()` would
    /// have sent it, in a second multi with the new queue node when the fast path found the
    /// monitor busy, and the acquisition waits as usual. On the same monitor, the contenders queued behind `held` go first, as
    /// after a release: the new queue node's sequence number is higher than theirs. On the
    /// Elasticsearch lease lock, and for a guard of another session, the release goes first
    /// and the acquisition follows.
    ///
    /// Returns the release under way (await it for the outcome [`Guard::unlock`] would report)
    /// and the acquisition's outcome. A failed acquisition still releases `held`.
    ///
    /// # Errors
    /// The acquisition's are those of [`LockService::acquire`]; the release's those of
    /// [`Guard::unlock`].
    ///
    /// # Cancellation safety
    /// Cancel-safe: dropped before the release was sent, `held` is released in the background
    /// (as a dropped guard), and the acquisition cleans up as a dropped
    /// [`LockService::acquire`].
    async fn release_and_acquire(
        &self,
        held: Box<dyn Guard>,
        next: LockRequest,
    ) -> (Release, Result<Box<dyn Guard>, LockError>) {
        release_then_acquire(self, held, next).await
    }

    /// Releases several held locks at once, as [`Guard::release`] of each: on ZooKeeper, the
    /// locks this service's session holds go in one multi (a request and a transaction for all
    /// of them, up to 256 a multi), sent before this returns. A multi is atomic: when one of
    /// its releases cannot be applied (a lock lost meanwhile), none is, and each lock is then
    /// released on its own, as [`Guard::release`] would have. The default (the Elasticsearch
    /// lease lock, guards of another session) releases them one by one.
    ///
    /// # Errors
    /// The [`Release`] resolves to the first error [`Guard::unlock`] reports for one of them;
    /// the others are released all the same.
    ///
    /// # Cancellation safety
    /// Cancel-safe once polled: the releases finish in the background.
    async fn release_all(&self, held: Vec<Box<dyn Guard>>) -> Release {
        let mut releases = Vec::with_capacity(held.len());
        for guard in held {
            releases.push(guard.release().await);
        }
        Release::all(releases)
    }

    /// `"zookeeper"` or `"elasticsearch"`.
    fn backend_name(&self) -> &'static str;
}

/// Releases `held` ([`Guard::release`]) and then acquires `next` through `locks`, one after
/// the other: what [`LockService::release_and_acquire`] does where the backend cannot do both
/// in one step, and the way to measure it against that step.
///
/// # Errors
/// As [`LockService::release_and_acquire`].
///
/// # Cancellation safety
/// As [`LockService::release_and_acquire`].
pub async fn release_then_acquire<L: LockService + ?Sized>(
    locks: &L,
    held: Box<dyn Guard>,
    next: LockRequest,
) -> (Release, Result<Box<dyn Guard>, LockError>) {
    let release = held.release().await;
    (release, locks.acquire(next).await)
}

/// A held lock.
#[async_trait]
pub trait Guard: Send + Sync + fmt::Debug + std::any::Any {
    /// The monitor object.
    fn monitor(&self) -> &str;
    /// The lock type it was acquired with.
    fn lock_type(&self) -> LockType;
    /// A token strictly greater than every token issued before for this monitor (and, on
    /// ZooKeeper, for any monitor before this acquisition was asked for; locks of several
    /// monitors taken in one multi share it). Guarded writes send it as Elasticsearch's
    /// external version.
    fn fencing_token(&self) -> u64;
    /// Whether the lock is still held (not lost, not released).
    fn is_held(&self) -> bool;
    /// The loss reason, if the lock was lost.
    fn loss(&self) -> Option<LossReason>;
    /// Why a lock that is no longer held is not, for messages and logs: its loss reason, or
    /// `released` when it was released rather than lost.
    fn why_not_held(&self) -> String {
        self.loss()
            .map_or_else(|| "released".to_string(), |r| r.to_string())
    }
    /// Completes when the lock is lost; pending forever while it is held.
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only observes.
    async fn lost(&self) -> LossReason;
    /// Releases the lock.
    ///
    /// # Errors
    /// [`LockError::NoNode`] when the lock no longer existed; connection errors (the lock is then
    /// released by session expiry or lease expiry).
    async fn unlock(self: Box<Self>) -> Result<(), LockError>;

    /// Releases the lock without waiting for the answer: completes once the release is ordered
    /// before every later acquisition through the same lock service, and returns the release
    /// under way. Await the [`Release`] for the outcome that [`Guard::unlock`] would report (its
    /// answer is in by the time a later acquisition of the same session has its own), or
    /// [`Release::detach`] it.
    ///
    /// On ZooKeeper the request is sent before this returns and nothing is awaited: ZooKeeper
    /// applies a session's requests in order, so the session's next acquisition goes out right
    /// behind the release and needs no round trip of its own to wait for it (one write's
    /// latency, with its `fsync`, saved per lock cycle). Other sessions see the lock free once
    /// ZooKeeper has applied the release, as after `unlock`. The default (the Elasticsearch
    /// lease lock) completes the release first.
    ///
    /// # Cancellation safety
    /// Cancel-safe once polled: the release finishes in the background.
    async fn release(self: Box<Self>) -> Release {
        Release::done(self.unlock().await)
    }
}

/// A release on its way ([`Guard::release`]): a future of the outcome that [`Guard::unlock`]
/// reports. Dropping it lets the release finish in the background, unreported.
#[derive(Debug)]
#[must_use = "await the release for its outcome, or detach it to have a failure logged"]
pub struct Release(ReleaseState);

#[derive(Debug)]
enum ReleaseState {
    Done(Option<Result<(), LockError>>),
    Running(tokio::task::JoinHandle<Result<(), LockError>>),
}

impl Release {
    /// A release that has completed with `outcome` (for a [`Guard`] that wraps another, or
    /// releases before it returns).
    pub fn done(outcome: Result<(), LockError>) -> Self {
        Self(ReleaseState::Done(Some(outcome)))
    }

    /// Starts `work` in the calling thread: polls it once, which runs it up to its first
    /// pending point (a backend sends its request there, in the caller's order), then spawns the
    /// rest as a task.
    ///
    /// # Panics
    /// Outside a Tokio runtime, as [`tokio::spawn`], unless `work` completes at its first poll.
    pub(crate) fn start<F>(work: F) -> Self
    where
        F: std::future::Future<Output = Result<(), LockError>> + Send + 'static,
    {
        let mut work = Box::pin(work);
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        match work.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(outcome) => Self::done(outcome),
            // The task polls it again at once, with a waker of its own.
            std::task::Poll::Pending => Self(ReleaseState::Running(tokio::spawn(work))),
        }
    }

    /// The releases of `releases` as one: its outcome is the first error among theirs, or
    /// success; all of them run to their end.
    ///
    /// # Panics
    /// Outside a Tokio runtime while a release is still under way, as [`tokio::spawn`].
    pub fn all(releases: Vec<Release>) -> Self {
        Self::start(async move {
            futures::future::join_all(releases)
                .await
                .into_iter()
                .find(Result::is_err)
                .unwrap_or(Ok(()))
        })
    }

    /// Lets the release finish in the background and logs a failure at `warn`, after `what`
    /// (what the failure means to the caller).
    ///
    /// # Panics
    /// Outside a Tokio runtime while the release is still under way, as [`tokio::spawn`].
    pub fn detach(self, what: &'static str) {
        match self.0 {
            ReleaseState::Done(Some(Err(e))) => tracing::warn!(error = %e, "{what}"),
            ReleaseState::Done(_) => {}
            running => {
                let release = Self(running);
                tokio::spawn(async move {
                    if let Err(e) = release.await {
                        tracing::warn!(error = %e, "{what}");
                    }
                });
            }
        }
    }
}

impl std::future::Future for Release {
    type Output = Result<(), LockError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.0 {
            ReleaseState::Done(outcome) => std::task::Poll::Ready(
                outcome
                    .take()
                    .expect("a completed release is not polled again"),
            ),
            ReleaseState::Running(task) => std::pin::Pin::new(task).poll(cx).map(|joined| {
                joined.unwrap_or_else(|e| {
                    Err(LockError::Backend {
                        context: "releasing the lock".into(),
                        detail: e.to_string(),
                    })
                })
            }),
        }
    }
}

/// A shared, awaitable loss flag used by guards of both backends.
#[derive(Debug, Clone)]
pub(crate) struct LossSignal {
    tx: Arc<watch::Sender<Option<LossReason>>>,
    /// Woken when someone starts waiting for the loss ([`LossSignal::wait`]): a backend may
    /// watch more closely from then on.
    interest: Arc<tokio::sync::Notify>,
}

impl Default for LossSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl LossSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::channel(None).0),
            interest: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Resolves once someone waits for the loss (at once if someone already did).
    pub async fn interest(&self) {
        self.interest.notified().await
    }

    /// Marks the lock lost (the first reason wins). Returns whether this call fired it.
    pub fn fire(&self, reason: LossReason) -> bool {
        self.tx.send_if_modified(|cur| {
            if cur.is_none() {
                *cur = Some(reason);
                true
            } else {
                false
            }
        })
    }

    /// The reason, if fired.
    pub fn get(&self) -> Option<LossReason> {
        self.tx.borrow().clone()
    }

    /// Waits until fired.
    pub async fn wait(&self) -> LossReason {
        // A permit is kept when nobody listens yet: the next `interest()` resolves at once.
        self.interest.notify_one();
        let mut rx = self.tx.subscribe();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return LossReason::Closed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Release::start` runs the work up to its first pending point before it returns (where a
    /// backend sends its request), and the rest in a task whose outcome the `Release` answers.
    #[tokio::test]
    async fn a_release_starts_its_work_before_it_returns() {
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<Result<(), LockError>>();
        let release = Release::start({
            let sent = sent.clone();
            async move {
                sent.store(true, std::sync::atomic::Ordering::SeqCst);
                answer_rx.await.expect("answered")
            }
        });
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst));
        answer_tx
            .send(Err(LockError::NoNode {
                monitor: "m".into(),
                detail: "gone".into(),
            }))
            .unwrap();
        assert!(matches!(release.await, Err(LockError::NoNode { .. })));
        // Work that needs no waiting is done at once.
        assert!(Release::start(async { Ok(()) }).await.is_ok());
    }

    #[test]
    fn monitor_names() {
        for ok in [
            "a",
            "article-42",
            "P1",
            "tenant:7:doc",
            "ünïcode",
            "x".repeat(200).as_str(),
        ] {
            validate_monitor(ok).unwrap();
        }
        for (bad, needle) in [
            ("", "empty"),
            ("a/b", "`/`"),
            (".", "`.`"),
            ("..", "`.`"),
            ("a\nb", "U+000A"),
            ("article-\u{1f600}", "U+1F600"),
            ("\u{10000}", "Basic Multilingual Plane"),
            ("privateLock", "reserved"),
            (&"x".repeat(201), "201 bytes"),
        ] {
            let e = validate_monitor(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[tokio::test]
    async fn loss_signal_first_reason_wins() {
        let s = LossSignal::new();
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.wait().await }
        });
        assert!(s.fire(LossReason::SessionExpired));
        assert!(!s.fire(LossReason::MutexDeleted));
        assert_eq!(waiter.await.unwrap(), LossReason::SessionExpired);
        assert_eq!(s.get(), Some(LossReason::SessionExpired));
    }
}
