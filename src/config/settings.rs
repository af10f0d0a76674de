//! The typed settings of each area: ZooKeeper, Elasticsearch, retries and dead letters, the lease
//! lock, transactions, `zkguard serve`, and [`Settings`], the whole of them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::lock::LockType;

use super::gateway::GatewaySettings;
use super::grace;
use super::secrets::display_urls;
use super::security::{EsTls, ZkAcl, ZkAuth, ZkTls};
use super::stamp::StampSettings;

/// The lock-service backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockBackendKind {
    /// ZooKeeper priority lock.
    ZooKeeper,
    /// Elasticsearch lease lock.
    Elasticsearch,
}

/// Where dead letters are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterSinkKind {
    /// A JSON-lines file.
    File,
    /// An Elasticsearch index.
    Elasticsearch,
    /// A Kafka topic (falling back to the file when the broker cannot be reached).
    Kafka,
}

/// ZooKeeper settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZkSettings {
    /// Connect string (`host:port,...[/chroot]`).
    pub servers: String,
    /// Requested session timeout.
    pub session_timeout: Duration,
    /// Connection attempts.
    pub connection_retry: u32,
    /// Delay between attempts.
    pub connection_delay: Duration,
    /// Foreground prefix.
    pub foreground_prefix: String,
    /// Background prefix.
    pub background_prefix: String,
    /// Foreground wait timeout.
    pub foreground_timeout: Duration,
    /// Background wait timeout.
    pub background_timeout: Duration,
    /// Lock root.
    pub lock_root: String,
    /// Anti-starvation threshold (`None` = off).
    pub background_max_wait: Option<Duration>,
    /// How long after the last answer of the ZooKeeper quorum a held lock counts as lost
    /// (`None` = [`grace::max_loss_grace`] of the session timeout; never more than it).
    pub loss_grace: Option<Duration>,
    /// Authentication sent to ZooKeeper with every session (`None`: none).
    pub auth: Option<ZkAuth>,
    /// ACL of every node zkguard creates (lock root, monitor nodes, queue nodes, `privateLock`).
    pub acl: ZkAcl,
    /// TLS to the servers (`None`: plain TCP).
    pub tls: Option<ZkTls>,
    /// The largest request zkguard sends to ZooKeeper, in bytes (`zookeeper.max.request.bytes`):
    /// the multis that carry many acquisitions' fast paths or many releases are cut to fit, and
    /// an acquisition whose own requests could not fit is refused. Keep it under the servers'
    /// `jute.maxbuffer`, beyond which ZooKeeper closes the connection.
    pub max_request_bytes: usize,
}

impl ZkSettings {
    /// The queue-node prefix of a lock type.
    pub fn prefix(&self, lock_type: LockType) -> &str {
        match lock_type {
            LockType::Foreground => &self.foreground_prefix,
            LockType::Background => &self.background_prefix,
        }
    }

    /// The wait timeout of a lock type.
    pub fn timeout(&self, lock_type: LockType) -> Duration {
        match lock_type {
            LockType::Foreground => self.foreground_timeout,
            LockType::Background => self.background_timeout,
        }
    }

    /// The connection timeout zkguard gives the client for a session timeout: with TLS
    /// [`grace::tls_connection_timeout`], otherwise none (the client's default, 2/5 of the
    /// session).
    pub fn connection_timeout(&self, session_timeout: Duration) -> Option<Duration> {
        self.tls
            .as_ref()
            .map(|_| grace::tls_connection_timeout(session_timeout))
    }
}

impl Default for ZkSettings {
    fn default() -> Self {
        Settings::default().zookeeper
    }
}

/// Elasticsearch client settings.
///
/// Its `Debug` output shows the URLs without user-info and hides the password.
#[derive(Clone)]
#[non_exhaustive]
pub struct EsSettings {
    /// One or more base URLs (credentials found in `elasticsearch.url` are moved to
    /// `username`/`password` when loading).
    pub urls: Vec<url::Url>,
    /// Basic-auth user.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<String>,
    /// API key (`elasticsearch.api.key`): the base64 `encoded` value or `id:api_key`.
    pub api_key: Option<String>,
    /// TLS of `https://` URLs: extra CA certificates, a client certificate, verification.
    pub tls: EsTls,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

impl fmt::Debug for EsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EsSettings")
            .field("urls", &display_urls(&self.urls))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .field("api_key", &self.api_key.as_ref().map(|_| "(hidden)"))
            .field("tls", &self.tls)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Background retry and dead-letter settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetrySettings {
    /// Attempts before parking (`elastic.request.retry.count`).
    pub retry_count: u32,
    /// First backoff delay.
    pub backoff_initial: Duration,
    /// Backoff cap.
    pub backoff_max: Duration,
    /// Dead-letter sink kind.
    pub sink: DeadLetterSinkKind,
    /// Dead-letter file.
    pub file_path: PathBuf,
    /// Dead-letter index.
    pub index: String,
    /// Kafka dead-letter settings (used when `sink` is [`DeadLetterSinkKind::Kafka`]).
    pub kafka: KafkaSettings,
}

/// Kafka dead-letter sink settings (`deadletter.kafka.*`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port` each (empty unless `deadletter.sink=kafka`).
    pub brokers: Vec<String>,
    /// Topic of parked operations.
    pub topic: String,
    /// Client id sent to the broker.
    pub client_id: String,
    /// Replay group: the key of the committed offsets.
    pub group: String,
    /// Whether zkguard creates a missing topic.
    pub auto_create: bool,
    /// Partitions of a topic that zkguard creates.
    pub partitions: u32,
    /// How long a park waits for the broker's acknowledgement.
    pub delivery_timeout: Duration,
}

/// Elasticsearch lease-lock settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EsLockSettings {
    /// Lock index.
    pub index: String,
    /// Lease length.
    pub ttl: Duration,
    /// Assumed maximum clock skew between contenders.
    pub clock_skew: Duration,
}

/// Multi-document transaction settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TxnSettings {
    /// Accounts index.
    pub accounts_index: String,
    /// Transactions index.
    pub transactions_index: String,
    /// Age after which recovery resumes a transaction.
    pub recovery_after: Duration,
    /// Whether overdrafts are allowed.
    pub allow_overdraft: bool,
    /// Log index of document transactions (`txn.log.index`).
    pub log_index: String,
    /// Most operations in one document transaction (`txn.max.operations`).
    pub max_operations: usize,
    /// Most bytes of documents in one document transaction (`txn.max.bytes`).
    pub max_bytes: u64,
}

/// Where `zkguard serve` journals accepted background operations (`server.journal.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalBackendKind {
    /// A local file (`server.journal.path`): one host.
    File,
    /// A Kafka topic (`server.journal.kafka.*`): a fleet of instances.
    Kafka,
}

/// The Kafka journal's settings (`server.journal.kafka.*`).
#[derive(Debug, Clone)]
pub struct JournalKafkaSettings {
    /// Bootstrap brokers, `host:port` each (empty unless the backend is Kafka).
    pub brokers: Vec<String>,
    /// The journal topic.
    pub topic: String,
    /// Partitions of the topic (created with this many; another existing count is refused).
    pub partitions: u32,
    /// Replication factor of a topic that zkguard creates.
    pub replication: u16,
    /// Acknowledgement wait of a produce, and timeout of the other broker requests.
    pub timeout: Duration,
    /// Elasticsearch index of the partitions' progress and of the operations' outcomes.
    pub index: String,
}

/// Settings of `zkguard serve`.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Listen address.
    pub listen: std::net::SocketAddr,
    /// Write-ahead journal of background operations.
    pub journal_path: PathBuf,
    /// Background operations kept queued (`server.queue.max`).
    pub queue_max: usize,
    /// Bytes of queued background operations (`server.queue.max.bytes`).
    pub queue_max_bytes: u64,
    /// Largest size of the journal file (`server.journal.max.bytes`).
    pub journal_max_bytes: u64,
    /// Start over a journal with damaged lines, skipping them (`server.journal.skip.corrupt`).
    pub journal_skip_corrupt: bool,
    /// Where background operations are journaled (`server.journal.backend`).
    pub journal_backend: JournalBackendKind,
    /// The Kafka journal (`server.journal.kafka.*`), used when `journal_backend` is
    /// [`JournalBackendKind::Kafka`].
    pub journal_kafka: JournalKafkaSettings,
    /// This instance's name among a fleet (`server.instance.id`; empty: `zkguard serve` uses the
    /// host name and its listen port).
    pub instance_id: String,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Requests handled at once.
    pub max_concurrent: usize,
    /// Longest time spent on one request.
    pub request_timeout: Duration,
    /// Longest time a request's body may take to arrive (read before the request takes a slot).
    pub body_timeout: Duration,
    /// Longest time a connection may take to send a request's headers (from its opening or its
    /// previous answer): the idle and slow-header timeout.
    pub header_timeout: Duration,
    /// Connections kept open at once.
    pub max_connections: usize,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub drain_timeout: Duration,
    /// Lease of an explicit lock that names none.
    pub lock_ttl: Duration,
    /// Longest lease an explicit lock may ask for.
    pub lock_ttl_max: Duration,
    /// Explicit locks held at once.
    pub lock_max: usize,
    /// Requests waiting for an operation's outcome at once (`server.wait.max`).
    pub wait_max: usize,
    /// Event streams (`GET /v1/events`) open at once (`server.events.max`).
    pub events_max: usize,
    /// File of accepted bearer tokens; `None`: no authentication.
    pub auth_tokens_file: Option<PathBuf>,
    /// Whether the status page `GET /ui` is served (`server.ui.enabled`).
    pub ui_enabled: bool,
    /// Certificate chain and private key (PEM files) for HTTPS; `None`: plain HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// zkguard's own indices (transactions, dead letters, the lease lock) less those of
    /// `server.index.allow`: the API refuses to write them.
    pub own_indices: Vec<String>,
    /// `server.index.allow`: own and system indices the API may write anyway.
    pub allowed_indices: Vec<String>,
    /// The Elasticsearch-compatible write gate (`server.gateway.*`).
    pub gateway: GatewaySettings,
}

impl ServerSettings {
    /// Why the API refuses to write `index`, if it does: zkguard's own index, or a system index
    /// (a leading `.`), unless `server.index.allow` names it.
    pub fn protected_index(&self, index: &str) -> Option<&'static str> {
        if self.allowed_indices.iter().any(|a| a == index) {
            None
        } else if self.own_indices.iter().any(|o| o == index) {
            Some("is one of zkguard's own indices (transactions, dead letters, lease locks)")
        } else if index.starts_with('.') {
            Some("is a system index (its name starts with `.`)")
        } else {
            None
        }
    }
}

/// The whole configuration, typed.
///
/// # Examples
///
/// ```
/// use zkguard::config::Settings;
///
/// // Built-in defaults, overridden by ZKGUARD_* environment variables when set.
/// let settings = Settings::load(None)?;
/// println!("ZooKeeper at {}", settings.zookeeper.servers);
/// for warning in &settings.warnings {
///     eprintln!("warning: {warning}");
/// }
/// // From a properties file: Settings::load(Some("conf/zkguard.properties".as_ref()))
/// # Ok::<(), zkguard::config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// ZooKeeper.
    pub zookeeper: ZkSettings,
    /// Elasticsearch client.
    pub elasticsearch: EsSettings,
    /// Background retries and dead letters.
    pub retry: RetrySettings,
    /// Which lock backend.
    pub backend: LockBackendKind,
    /// Elasticsearch lease lock.
    pub es_lock: EsLockSettings,
    /// Transactions.
    pub txn: TxnSettings,
    /// `zkguard serve`.
    pub server: ServerSettings,
    /// The `zkguard` object in written documents (`elastic.stamp.*`).
    pub stamp: StampSettings,
    /// The file the settings were read from, if any.
    pub source: Option<PathBuf>,
    /// Warnings found while loading (unknown `ZKGUARD_` variables); the CLI prints them.
    pub warnings: Vec<String>,
}
