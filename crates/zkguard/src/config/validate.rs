//! The whole configuration typed and checked: each key read by [`Reader`], then the rules that
//! span keys (prefixes, loss grace, credentials, lease skew, server limits).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reader::Reader;
use super::secrets::split_url_credentials;
use super::settings::{
    DeadLetterSinkKind, EsLockSettings, EsSettings, JournalBackendKind, JournalKafkaSettings,
    KafkaSettings, LockBackendKind, RetrySettings, ServerSettings, Settings, TxnSettings,
    ZkSettings,
};
use super::{gateway, grace, stamp, state, ConfigError};

/// The smallest `zookeeper.max.request.bytes`: an acquisition with the longest lock info fits in it.
pub(crate) const MIN_REQUEST_BYTES: usize = 16 * 1024;

impl Settings {
    /// Reads and checks every key of `raw` (key to value and origin), section by section,
    /// then the rules that span sections.
    pub(super) fn from_raw(
        raw: &HashMap<String, (String, String)>,
        _path: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let r = Reader { raw };
        let state_dir = state::dir(r.optional_string("state.dir").as_deref(), |v| {
            std::env::var(v).ok()
        });
        let zookeeper = zookeeper(&r)?;
        let elasticsearch = elasticsearch(&r)?;
        let retry = retry(&r, &state_dir)?;
        let backend = match r.choice("lock.backend", &["zookeeper", "elasticsearch"])? {
            "zookeeper" => LockBackendKind::ZooKeeper,
            _ => LockBackendKind::Elasticsearch,
        };
        let es_lock = es_lock(&r)?;
        let txn = txn(&r)?;
        let journal = journal(&r, backend)?;
        let server = server(
            &r,
            &state_dir,
            journal,
            &[
                &txn.accounts_index,
                &txn.transactions_index,
                &txn.log_index,
                &retry.index,
                &es_lock.index,
            ],
        )?;
        Ok(Self {
            zookeeper,
            elasticsearch,
            retry,
            backend,
            es_lock,
            txn,
            server,
            stamp: stamp::parse(
                r.get("elastic.stamp.window").0,
                r.get("elastic.stamp.off").0,
                r.get("elastic.stamp.mapping").0,
            )
            .map_err(|(key, expected)| r.err(key, expected))?,
            source: None,
            warnings: r.insecure_tls_warning(),
        })
    }
}

/// `zookeeper.*`: the session, the lock's classes and timeouts, and the rules between them (the
/// loss grace within the session's bound, the foreground prefix sorting first).
fn zookeeper(r: &Reader<'_>) -> Result<ZkSettings, ConfigError> {
    let raw = r.raw;
    let auth = r.zk_auth()?;
    let zookeeper = ZkSettings {
        servers: r.zk_servers("zookeeper.servers")?,
        session_timeout: r.duration_min("zookeeper.session.timeout", Duration::from_millis(1))?,
        connection_retry: r.int::<u32>("zookeeper.connection.retry", 1)?,
        connection_delay: r.duration("zookeeper.connection.delay")?,
        foreground_prefix: r.prefix("zookeeper.foreground.lock.prefix")?,
        background_prefix: r.prefix("zookeeper.background.lock.prefix")?,
        foreground_timeout: r.duration("zookeeper.foreground.task.timeout")?,
        background_timeout: r.duration("zookeeper.background.task.timeout")?,
        lock_root: r.zk_root("zookeeper.lock.root")?,
        background_max_wait: r.optional_duration("zookeeper.background.max.wait")?,
        loss_grace: r.optional_duration("zookeeper.lock.loss.grace")?,
        acl: r.zk_acl(auth.is_some())?,
        auth,
        tls: r.zk_tls()?,
        max_request_bytes: r.bytes_min("zookeeper.max.request.bytes", MIN_REQUEST_BYTES)?,
    };
    if let Some(grace) = zookeeper.loss_grace {
        let timeout = zookeeper.session_timeout;
        let connection_timeout = zookeeper.connection_timeout(timeout);
        let bound = grace::max_loss_grace(timeout, connection_timeout);
        if grace > bound {
            return Err(r.err(
                "zookeeper.lock.loss.grace",
                format!(
                    "at most {}ms for zookeeper.session.timeout={}ms{} ({}): a holder that cannot reach the ZooKeeper quorum for longer may still believe in its lock after the leader expired its session and gave the lock to another holder (see docs/zookeeper-lock.md, \"How long a holder may believe in its lock\"); use 0 for the bound",
                    bound.as_millis(),
                    timeout.as_millis(),
                    if connection_timeout.is_some() { " with TLS" } else { "" },
                    grace::describe_max_loss_grace(timeout, connection_timeout),
                ),
            ));
        }
    }
    if zookeeper.foreground_prefix == zookeeper.background_prefix {
        let (v, origin) = &raw["zookeeper.background.lock.prefix"];
        return Err(ConfigError::InvalidValue {
            key: "zookeeper.background.lock.prefix".into(),
            value: v.clone(),
            origin: origin.clone(),
            expected: "a prefix different from zookeeper.foreground.lock.prefix".into(),
        });
    }
    if zookeeper.foreground_prefix > zookeeper.background_prefix {
        return Err(prefixes_out_of_order(raw));
    }
    Ok(zookeeper)
}

/// `elasticsearch.*` (but the lock backend's): the URLs and one way to authenticate.
fn elasticsearch(r: &Reader<'_>) -> Result<EsSettings, ConfigError> {
    let mut urls = r.urls("elasticsearch.url")?;
    let password = r.secret("elasticsearch.password", "elasticsearch.password.file")?;
    let api_key = r.secret("elasticsearch.api.key", "elasticsearch.api.key.file")?;
    let credentials = split_url_credentials(
        &mut urls,
        r.optional_string("elasticsearch.username").as_deref(),
        password.as_deref(),
    )
    .map_err(|reason| r.err("elasticsearch.url", reason))?;
    let (username, password) = match credentials {
        Some((user, password)) => (Some(user), (!password.is_empty()).then_some(password)),
        None => (None, password),
    };
    if api_key.is_some() && (username.is_some() || password.is_some()) {
        return Err(r.err(
            "elasticsearch.api.key",
            "unset when basic authentication is configured (elasticsearch.username/password or user-info in elasticsearch.url); use one of the two",
        ));
    }
    if let Some(key) = &api_key {
        let valid = match key.split_once(':') {
            Some((id, secret)) => !id.is_empty() && !secret.is_empty(),
            None => key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+/=-_".contains(c)),
        };
        if !valid {
            return Err(r.err(
                "elasticsearch.api.key",
                "the base64 `encoded` value Elasticsearch returned for the key, or id:api_key (the value is not shown)",
            ));
        }
    }
    let es_tls = r.es_tls()?;
    let elasticsearch = EsSettings {
        urls,
        username,
        password,
        api_key,
        tls: es_tls,
        request_timeout: r
            .duration_min("elasticsearch.request.timeout", Duration::from_millis(1))?,
    };
    Ok(elasticsearch)
}

/// `elastic.request.retry.*`, `elastic.retry.*` and `deadletter.*`: retries and where the
/// operations that run out of them go.
fn retry(r: &Reader<'_>, state_dir: &Path) -> Result<RetrySettings, ConfigError> {
    let retry = RetrySettings {
        retry_count: r.int::<u32>("elastic.request.retry.count", 1)?,
        backoff_initial: r.duration("elastic.retry.backoff.initial")?,
        backoff_max: r.duration("elastic.retry.backoff.max")?,
        sink: match r.choice("deadletter.sink", &["file", "elasticsearch", "kafka"])? {
            "file" => DeadLetterSinkKind::File,
            "kafka" => DeadLetterSinkKind::Kafka,
            _ => DeadLetterSinkKind::Elasticsearch,
        },
        file_path: state::resolve(state_dir, &r.non_empty("deadletter.file.path")?),
        index: r.index_name("deadletter.index")?,
        kafka: KafkaSettings {
            brokers: r.kafka_brokers("deadletter.kafka.brokers")?,
            topic: r.kafka_name("deadletter.kafka.topic")?,
            client_id: r.non_empty("deadletter.kafka.client.id")?,
            group: r.non_empty("deadletter.kafka.group")?,
            auto_create: r.boolean("deadletter.kafka.auto.create")?,
            partitions: r.int::<u32>("deadletter.kafka.partitions", 1)?,
            delivery_timeout: r.duration_min(
                "deadletter.kafka.delivery.timeout",
                Duration::from_millis(100),
            )?,
        },
    };
    if retry.sink == DeadLetterSinkKind::Kafka && retry.kafka.brokers.is_empty() {
        return Err(r.err(
            "deadletter.kafka.brokers",
            "at least one host:port when deadletter.sink=kafka, e.g. kafka1:9092,kafka2:9092",
        ));
    }
    Ok(retry)
}

/// `elasticsearch.lock.*`: the Elasticsearch lock backend, its lease longer than twice the
/// clock skew.
fn es_lock(r: &Reader<'_>) -> Result<EsLockSettings, ConfigError> {
    let raw = r.raw;
    let es_lock = EsLockSettings {
        index: r.index_name("elasticsearch.lock.index")?,
        ttl: r.duration_min("elasticsearch.lock.ttl", Duration::from_millis(100))?,
        clock_skew: r.duration("elasticsearch.lock.clock.skew")?,
    };
    if es_lock.clock_skew * 2 >= es_lock.ttl {
        let (v, origin) = &raw["elasticsearch.lock.clock.skew"];
        return Err(ConfigError::InvalidValue {
            key: "elasticsearch.lock.clock.skew".into(),
            value: v.clone(),
            origin: origin.clone(),
            expected: "less than half of elasticsearch.lock.ttl".into(),
        });
    }
    Ok(es_lock)
}

/// `txn.*`: the transactions' indices and limits.
fn txn(r: &Reader<'_>) -> Result<TxnSettings, ConfigError> {
    let txn = TxnSettings {
        accounts_index: r.index_name("txn.accounts.index")?,
        transactions_index: r.index_name("txn.transactions.index")?,
        recovery_after: r.duration("txn.recovery.after")?,
        allow_overdraft: r.boolean("txn.allow.overdraft")?,
        log_index: r.index_name("txn.log.index")?,
        max_operations: r.int::<usize>("txn.max.operations", 1)?,
        max_bytes: r.int::<u64>("txn.max.bytes", 1)?,
    };
    Ok(txn)
}

/// `server.journal.backend` and `server.journal.kafka.*`: where accepted background operations
/// are kept; `server.instance.id`: this instance's name among a fleet's.
struct Journal {
    backend: JournalBackendKind,
    kafka: JournalKafkaSettings,
    instance_id: String,
}

/// Reads the journal's keys; the Kafka journal needs brokers and the ZooKeeper lock backend.
fn journal(r: &Reader<'_>, backend: LockBackendKind) -> Result<Journal, ConfigError> {
    let kafka = JournalKafkaSettings {
        brokers: r.kafka_brokers("server.journal.kafka.brokers")?,
        topic: r.kafka_name("server.journal.kafka.topic")?,
        partitions: r.int::<u32>("server.journal.kafka.partitions", 1)?,
        replication: r.int::<u16>("server.journal.kafka.replication", 1)?,
        timeout: r.duration_min("server.journal.kafka.timeout", Duration::from_millis(100))?,
        index: r.index_name("server.journal.kafka.index")?,
    };
    let journal_backend = match r.choice("server.journal.backend", &["file", "kafka"])? {
        "kafka" => JournalBackendKind::Kafka,
        _ => JournalBackendKind::File,
    };
    if journal_backend == JournalBackendKind::Kafka {
        if kafka.brokers.is_empty() {
            return Err(r.err(
                "server.journal.kafka.brokers",
                "at least one host:port when server.journal.backend=kafka, e.g. kafka1:9092,kafka2:9092",
            ));
        }
        if backend != LockBackendKind::ZooKeeper {
            return Err(r.err(
                "server.journal.backend",
                "file while lock.backend=elasticsearch: the Kafka journal's partitions are owned through ZooKeeper locks (set lock.backend=zookeeper to use kafka)",
            ));
        }
        if kafka.partitions > 1000 {
            return Err(r.err(
                "server.journal.kafka.partitions",
                "a count from 1 to 1000 (each partition is one ZooKeeper lock and one applier)",
            ));
        }
    }
    let instance_id = match r.optional_string("server.instance.id") {
        Some(id)
            if id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
                && id.len() <= 100 =>
        {
            id
        }
        Some(_) => {
            return Err(r.err(
                "server.instance.id",
                "1 to 100 ASCII letters, digits, - _ . or : (a ZooKeeper node name), or empty for the host name and listen port",
            ))
        }
        None => String::new(),
    };
    Ok(Journal {
        backend: journal_backend,
        kafka,
        instance_id,
    })
}

/// `server.*`: the service and its gate. `own` and the Kafka journal's index are the indices
/// of zkguard's own documents, which the service refuses to write unless `server.index.allow`
/// names them.
fn server(
    r: &Reader<'_>,
    state_dir: &Path,
    journal: Journal,
    own: &[&String],
) -> Result<ServerSettings, ConfigError> {
    let allowed_indices: Vec<String> = r
        .optional_string("server.index.allow")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let own_indices = std::iter::once(&journal.kafka.index)
        .chain(own.iter().copied())
        .filter(|i| !allowed_indices.contains(i))
        .cloned()
        .collect();
    let mut gateway = gateway::parse(
        r.get("server.gateway.listen").0,
        r.get("server.gateway.indices").0,
        r.get("server.gateway.background.indices").0,
    )
    .map_err(|(key, expected)| r.err(key, expected))?;
    gateway.bulk_max_items = r.int::<usize>("server.gateway.bulk.max.items", 1)?;
    gateway.bulk_max_locks = r.int::<usize>("server.gateway.bulk.max.locks", 1)?;
    gateway.bulk_max_concurrent = r.int::<usize>("server.gateway.bulk.max.concurrent", 1)?;
    gateway.body_max_inflight_bytes =
        r.bytes_min("server.gateway.body.max.inflight.bytes", 1 << 20)?;
    let server = ServerSettings {
        gateway,
        own_indices,
        allowed_indices,
        listen: {
            let (v, _) = r.get("server.listen");
            v.parse().map_err(|_| {
                r.err(
                    "server.listen",
                    "an IP address and port, e.g. 127.0.0.1:7717 or 0.0.0.0:7717",
                )
            })?
        },
        journal_path: state::resolve(state_dir, &r.non_empty("server.journal.path")?),
        journal_skip_corrupt: r.boolean("server.journal.skip.corrupt")?,
        journal_backend: journal.backend,
        journal_kafka: journal.kafka,
        instance_id: journal.instance_id,
        queue_max: r.int::<usize>("server.queue.max", 1)?,
        queue_max_bytes: r.int::<u64>("server.queue.max.bytes", 1)?,
        // The journal keeps the outcomes of the last 10,000 operations (about 1.5 MB).
        journal_max_bytes: match r.int::<u64>("server.journal.max.bytes", 1)? {
            n if n >= 16 << 20 => n,
            _ => {
                return Err(r.err(
                    "server.journal.max.bytes",
                    "a size in bytes of at least 16777216 (16 MiB): the journal also keeps the outcomes of the last 10,000 operations",
                ))
            }
        },
        max_body: r.int::<usize>("server.max.body", 1)?,
        max_concurrent: r.int::<usize>("server.max.concurrent", 1)?,
        request_timeout: r.duration_min("server.request.timeout", Duration::from_millis(1))?,
        body_timeout: r.duration_min("server.body.timeout", Duration::from_millis(1))?,
        header_timeout: r.duration_min("server.header.timeout", Duration::from_millis(1))?,
        max_connections: r.int::<usize>("server.max.connections", 1)?,
        drain_timeout: r.duration("server.drain.timeout")?,
        lock_ttl: r.duration_min("server.lock.ttl", Duration::from_millis(100))?,
        lock_ttl_max: r.duration_min("server.lock.ttl.max", Duration::from_millis(100))?,
        lock_max: r.int::<usize>("server.lock.max", 1)?,
        wait_max: r.int::<usize>("server.wait.max", 1)?,
        events_max: r.int::<usize>("server.events.max", 1)?,
        auth_tokens_file: r
            .optional_string("server.auth.tokens.file")
            .map(PathBuf::from),
        ui_enabled: r.boolean("server.ui.enabled")?,
        tls: match (
            r.optional_string("server.tls.cert"),
            r.optional_string("server.tls.key"),
        ) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(r.err(
                    "server.tls.key",
                    "a PEM private key file, since server.tls.cert is set (or unset both)",
                ))
            }
            (None, Some(_)) => {
                return Err(r.err(
                    "server.tls.cert",
                    "a PEM certificate file, since server.tls.key is set (or unset both)",
                ))
            }
        },
    };
    if server.lock_ttl > server.lock_ttl_max {
        return Err(r.err(
            "server.lock.ttl",
            format!(
                "at most server.lock.ttl.max ({}ms)",
                server.lock_ttl_max.as_millis()
            ),
        ));
    }
    Ok(server)
}

/// The error for a foreground prefix that sorts after the background one: queue order is the
/// byte order of the prefixes (the lower one is served first), so background contenders would
/// go first.
fn prefixes_out_of_order(raw: &HashMap<String, (String, String)>) -> ConfigError {
    let (fg, origin) = &raw["zookeeper.foreground.lock.prefix"];
    let (bg, _) = &raw["zookeeper.background.lock.prefix"];
    ConfigError::InvalidValue {
        key: "zookeeper.foreground.lock.prefix".into(),
        value: fg.clone(),
        origin: origin.clone(),
        expected: format!(
            "a prefix that sorts before the background one: queue nodes are served in the byte order of their prefixes, so with zookeeper.foreground.lock.prefix={fg} and zookeeper.background.lock.prefix={bg} background contenders would go first; choose a foreground prefix that sorts lower (ASCII order: digits, upper case, `_`, lower case), e.g. A and B, or swap the two"
        ),
    }
}
