//! The Kafka dead-letter sink (`deadletter.sink=kafka`).
//!
//! Each parked operation is one record in `deadletter.kafka.topic`:
//!
//! - key: the monitor, so that one object's dead letters stay in order in one partition (the
//!   partition is chosen like Kafka's default partitioner: murmur2 of the key);
//! - value: the same JSON as the other sinks store (a [`DeadLetter`]);
//! - headers: `zkguard-lock-type` (`foreground` / `background`), `zkguard-error-class` (the last
//!   error's class, e.g. `lock_timeout`) and `zkguard-id` (the operation id).
//!
//! A record is produced with `acks=all`, and an operation counts as parked only once the broker
//! acknowledged it. When no acknowledgement arrives within `deadletter.kafka.delivery.timeout`
//! (broker down or unreachable), the operation is parked in the file sink
//! (`deadletter.file.path`) instead, with a warning; [`KafkaSink::describe`] (and so the demo's
//! report) says how many went there. Listing and replaying read both.
//!
//! # Replay offsets
//!
//! The client has no consumer groups, so the replay keeps its own: the companion topic
//! `<topic>-offsets` (one partition) holds, for each replay group (`deadletter.kafka.group`),
//! records of two kinds: `commit` (every record of partition P before offset O is done) and
//! `done` (the record at partition P, offset O is done). `zkguard dlq replay --all` reads each
//! partition from its committed offset to the end seen at the start, and the fallback file,
//! replays the entries one document's in the order they were accepted (a partition holds a
//! monitor's records in parking order, which is not that order), marks each record done after
//! its operation was applied, superseded or re-parked (a failed replay produces a new record
//! with the attempt and error, then marks the old one done), and at the end commits each
//! partition up to its first record not done. A replay killed between applying and marking
//! applies the operation again the next time only in appearance: the operation id is in the
//! document, so nothing is written and the record is marked done.
//!
//! The producer is not idempotent (the client does not implement it): a retried produce may store
//! a record twice. Replay is idempotent per operation id, so a duplicate is only an extra
//! "already applied" line.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rskafka::client::error::{Error as RsError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::{Record, RecordAndOffset};
use rskafka::BackoffConfig;
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use uuid::Uuid;

use crate::config::KafkaSettings;
use crate::write::deadletter::{
    replay_items, replay_listed, DeadLetter, DeadLetterError, DeadLetterSink, FileSink, Item,
    ReplayEntry, ReplaySelection, Settle,
};
use crate::write::guarded::GuardedWriter;

/// Header naming the operation's lock type.
pub const HEADER_LOCK_TYPE: &str = "zkguard-lock-type";
/// Header naming the class of the last error.
pub const HEADER_ERROR_CLASS: &str = "zkguard-error-class";
pub use super::kafka_error::KafkaSinkError;

/// Header holding the operation id.
pub const HEADER_ID: &str = "zkguard-id";

/// Most bytes one fetch asks for.
const FETCH_BYTES: i32 = 4 * 1024 * 1024;
/// How long a fetch waits for records that are not there yet.
const FETCH_WAIT_MS: i32 = 50;

/// One record of the offsets companion topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OffsetRecord {
    group: String,
    kind: OffsetKind,
    partition: i32,
    offset: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OffsetKind {
    Commit,
    Done,
}

/// A replay group's progress: committed offsets and single records done.
#[derive(Debug, Default)]
struct Progress {
    committed: HashMap<i32, i64>,
    done: HashSet<(i32, i64)>,
}

/// A connection: the client, one partition client per partition of the topic, and one for the
/// offsets companion.
struct Conn {
    _client: Client,
    partitions: Vec<PartitionClient>,
    offsets: PartitionClient,
}

/// A parked entry found in the topic.
#[derive(Debug, Clone)]
struct Found {
    letter: DeadLetter,
    partition: i32,
    offset: i64,
}

/// Dead letters in a Kafka topic, with the file sink as fallback. See the module documentation.
pub struct KafkaSink {
    settings: KafkaSettings,
    fallback: FileSink,
    conn: tokio::sync::OnceCell<Arc<Conn>>,
    /// When the last connection attempt failed: parks within a delivery timeout of it go to the
    /// fallback at once instead of queueing behind new attempts.
    failed_at: std::sync::Mutex<Option<std::time::Instant>>,
    fallbacks: AtomicU64,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.settings.brokers)
            .field("topic", &self.settings.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A sink on `settings.topic`, falling back to a [`FileSink`] at `fallback_path`. It connects
    /// on first use.
    pub fn new(settings: &KafkaSettings, fallback_path: &Path) -> Self {
        Self {
            settings: settings.clone(),
            fallback: FileSink::new(fallback_path),
            conn: tokio::sync::OnceCell::new(),
            failed_at: std::sync::Mutex::new(None),
            fallbacks: AtomicU64::new(0),
        }
    }

    /// The companion topic of replay offsets.
    pub fn offsets_topic(&self) -> String {
        format!("{}-offsets", self.settings.topic)
    }

    /// How many operations this sink parked in the fallback file because the broker did not
    /// acknowledge them.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// The fallback file sink.
    pub fn fallback(&self) -> &FileSink {
        &self.fallback
    }

    fn timeout(&self) -> Duration {
        self.settings.delivery_timeout
    }

    fn broker_err(&self, action: &'static str, e: impl std::fmt::Display) -> KafkaSinkError {
        KafkaSinkError::Broker {
            topic: self.settings.topic.clone(),
            action,
            detail: e.to_string(),
        }
    }

    /// Connects (once), creating the topic and its companion when missing and allowed.
    ///
    /// # Errors
    /// [`KafkaSinkError::Unreachable`] when no broker answers within the delivery timeout,
    /// [`KafkaSinkError::TopicMissing`] when the topic is missing and auto-create is off.
    pub async fn connect(&self) -> Result<(), KafkaSinkError> {
        self.conn().await.map(|_| ())
    }

    async fn conn(&self) -> Result<Arc<Conn>, KafkaSinkError> {
        let result = self
            .conn
            .get_or_try_init(|| async {
                let brokers = self.settings.brokers.join(",");
                let span = tracing::info_span!("kafka_connect", %brokers);
                self.open().instrument(span).await.map(Arc::new)
            })
            .await
            .cloned();
        if result.is_err() {
            *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::time::Instant::now());
        }
        result
    }

    /// The connection for a park: none at once when the last attempt failed within a delivery
    /// timeout (so that parks do not queue behind one connection attempt after another).
    async fn conn_for_park(&self) -> Result<Arc<Conn>, KafkaSinkError> {
        if self.conn.get().is_none() {
            let recent = self
                .failed_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() < self.timeout());
            if recent {
                return Err(KafkaSinkError::Unreachable {
                    brokers: self.settings.brokers.join(","),
                    timeout: self.timeout(),
                    detail: "the last connection attempt failed moments ago".into(),
                });
            }
        }
        self.conn().await
    }

    async fn open(&self) -> Result<Conn, KafkaSinkError> {
        let timeout = self.timeout();
        let unreachable = |detail: String| KafkaSinkError::Unreachable {
            brokers: self.settings.brokers.join(","),
            timeout,
            detail,
        };
        let backoff = BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(timeout),
        };
        let client = tokio::time::timeout(
            timeout,
            ClientBuilder::new(self.settings.brokers.clone())
                .client_id(self.settings.client_id.as_str())
                .backoff_config(backoff)
                .build(),
        )
        .await
        .map_err(|_| unreachable("no answer".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
        let topic = self.settings.topic.clone();
        let offsets_topic = self.offsets_topic();
        let partitions = self
            .ensure_topic(&client, &topic, self.settings.partitions as i32)
            .await?;
        self.ensure_topic(&client, &offsets_topic, 1).await?;
        let mut clients = Vec::with_capacity(partitions.len());
        for p in partitions {
            clients.push(
                client
                    .partition_client(topic.clone(), p, UnknownTopicHandling::Retry)
                    .await
                    .map_err(|e| self.broker_err("open a partition", e))?,
            );
        }
        let offsets = client
            .partition_client(offsets_topic, 0, UnknownTopicHandling::Retry)
            .await
            .map_err(|e| self.broker_err("open the offsets companion", e))?;
        Ok(Conn {
            _client: client,
            partitions: clients,
            offsets,
        })
    }

    /// The partitions of `topic`, created first when missing (and allowed).
    async fn ensure_topic(
        &self,
        client: &Client,
        topic: &str,
        partitions: i32,
    ) -> Result<Vec<i32>, KafkaSinkError> {
        let find = || async {
            let topics = tokio::time::timeout(self.timeout(), client.list_topics())
                .await
                .map_err(|_| self.broker_err("list the topics", "no answer"))?
                .map_err(|e| self.broker_err("list the topics", e))?;
            Ok::<_, KafkaSinkError>(
                topics
                    .into_iter()
                    .find(|t| t.name == topic)
                    .map(|t| t.partitions.into_iter().collect::<Vec<_>>()),
            )
        };
        if let Some(found) = find().await? {
            if !found.is_empty() {
                return Ok(found);
            }
        }
        if !self.settings.auto_create {
            return Err(KafkaSinkError::TopicMissing {
                topic: topic.to_string(),
                main: self.settings.topic.clone(),
            });
        }
        let controller = client
            .controller_client()
            .map_err(|e| self.broker_err("create the topic", e))?;
        match controller
            .create_topic(topic, partitions, 1, self.timeout().as_millis() as i32)
            .await
        {
            Ok(()) => tracing::info!(topic, partitions, "created Kafka topic"),
            Err(RsError::ServerError {
                protocol_error: ProtocolError::TopicAlreadyExists,
                ..
            }) => {}
            Err(e) => return Err(self.broker_err("create the topic", e)),
        }
        match find().await? {
            Some(found) if !found.is_empty() => Ok(found),
            _ => Err(self.broker_err("create the topic", "it is still not listed")),
        }
    }

    fn record(letter: &DeadLetter) -> Result<Record, DeadLetterError> {
        let value = serde_json::to_vec(letter).map_err(|source| DeadLetterError::Json {
            what: format!("{} (encoding)", letter.id),
            source,
        })?;
        let mut headers = BTreeMap::new();
        headers.insert(
            HEADER_LOCK_TYPE.to_string(),
            letter.operation.lock_type.to_string().into_bytes(),
        );
        headers.insert(
            HEADER_ERROR_CLASS.to_string(),
            letter.error_kind.clone().into_bytes(),
        );
        headers.insert(HEADER_ID.to_string(), letter.id.to_string().into_bytes());
        Ok(Record {
            key: Some(letter.monitor.clone().into_bytes()),
            value: Some(value),
            headers,
            timestamp: chrono::Utc::now(),
        })
    }

    /// Produces `letter` and waits for the broker's acknowledgement; returns (partition, offset).
    async fn produce(&self, letter: &DeadLetter) -> Result<(i32, i64), KafkaSinkError> {
        let record = Self::record(letter).map_err(|e| self.broker_err("encode a record", e))?;
        let conn = self.conn_for_park().await?;
        let n = conn.partitions.len();
        let pc = &conn.partitions[partition_for(letter.monitor.as_bytes(), n)];
        let offsets = tokio::time::timeout(
            self.timeout(),
            pc.produce(vec![record], Compression::NoCompression),
        )
        .await
        .map_err(|_| self.broker_err("produce", "no acknowledgement within the delivery timeout"))?
        .map_err(|e| self.broker_err("produce", e))?;
        Ok((pc.partition(), offsets.first().copied().unwrap_or(-1)))
    }

    async fn read_progress(&self, conn: &Conn) -> Result<Progress, KafkaSinkError> {
        let mut progress = Progress::default();
        for r in self.read_partition(&conn.offsets, 0, None).await? {
            let Some(value) = r.record.value else {
                continue;
            };
            let Ok(rec) = serde_json::from_slice::<OffsetRecord>(&value) else {
                continue;
            };
            if rec.group != self.settings.group {
                continue;
            }
            match rec.kind {
                OffsetKind::Commit => {
                    let c = progress.committed.entry(rec.partition).or_insert(0);
                    *c = (*c).max(rec.offset);
                }
                OffsetKind::Done => {
                    progress.done.insert((rec.partition, rec.offset));
                }
            }
        }
        Ok(progress)
    }

    async fn write_progress(
        &self,
        conn: &Conn,
        kind: OffsetKind,
        partition: i32,
        offset: i64,
    ) -> Result<(), KafkaSinkError> {
        let rec = OffsetRecord {
            group: self.settings.group.clone(),
            kind,
            partition,
            offset,
        };
        let value = serde_json::to_vec(&rec).map_err(|e| self.broker_err("encode an offset", e))?;
        let record = Record {
            key: Some(self.settings.group.clone().into_bytes()),
            value: Some(value),
            headers: BTreeMap::new(),
            timestamp: chrono::Utc::now(),
        };
        tokio::time::timeout(
            self.timeout(),
            conn.offsets
                .produce(vec![record], Compression::NoCompression),
        )
        .await
        .map_err(|_| self.broker_err("commit an offset", "no acknowledgement"))?
        .map_err(|e| self.broker_err("commit an offset", e))?;
        Ok(())
    }

    /// Records of `pc` from `from` up to `until` (default: the end now).
    async fn read_partition(
        &self,
        pc: &PartitionClient,
        from: i64,
        until: Option<i64>,
    ) -> Result<Vec<RecordAndOffset>, KafkaSinkError> {
        let earliest = pc
            .get_offset(OffsetAt::Earliest)
            .await
            .map_err(|e| self.broker_err("read the earliest offset", e))?;
        let end = match until {
            Some(u) => u,
            None => pc
                .get_offset(OffsetAt::Latest)
                .await
                .map_err(|e| self.broker_err("read the latest offset", e))?,
        };
        let mut at = from.max(earliest);
        let mut out = Vec::new();
        while at < end {
            let (records, _high) = pc
                .fetch_records(at, 1..FETCH_BYTES, FETCH_WAIT_MS)
                .await
                .map_err(|e| self.broker_err("fetch records", e))?;
            let Some(last) = records.last().map(|r| r.offset) else {
                break;
            };
            out.extend(records.into_iter().filter(|r| r.offset < end));
            at = last + 1;
        }
        Ok(out)
    }

    /// Pending entries of the topic (after the group's committed offsets, not done), in offset
    /// order per partition.
    async fn pending(
        &self,
        conn: &Conn,
        progress: &Progress,
    ) -> Result<Vec<Found>, KafkaSinkError> {
        let mut out = Vec::new();
        for pc in &conn.partitions {
            let p = pc.partition();
            let from = progress.committed.get(&p).copied().unwrap_or(0);
            for r in self.read_partition(pc, from, None).await? {
                if progress.done.contains(&(p, r.offset)) {
                    continue;
                }
                if let Some(letter) = self.decode(p, &r) {
                    out.push(Found {
                        letter,
                        partition: p,
                        offset: r.offset,
                    });
                }
            }
        }
        Ok(out)
    }

    fn decode(&self, partition: i32, r: &RecordAndOffset) -> Option<DeadLetter> {
        let value = r.record.value.as_ref()?;
        match serde_json::from_slice::<DeadLetter>(value) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(topic = %self.settings.topic, partition, offset = r.offset, error = %e,
                    "skipping a record that is not a zkguard dead letter");
                None
            }
        }
    }

    /// The sink's replay ([`DeadLetterSink::replay`], which every caller runs): for
    /// [`ReplaySelection::All`], reads each partition from the replay group's committed offset
    /// to the end seen at the start, and the fallback file, and replays those entries one
    /// document's in the order they were accepted (see [`crate::write::deadletter::replay`]): a
    /// record is marked done once its operation was applied (or superseded, or re-parked as a
    /// new record), and each partition's offset is then committed up to its first record not
    /// done. For one id, replays that entry (in the topic or the file), after the older
    /// entries of its document, and marks its records done.
    ///
    /// # Errors
    /// [`DeadLetterError`] when the broker cannot be reached or read, or no entry has the id.
    pub async fn replay(
        &self,
        writer: &GuardedWriter,
        selection: ReplaySelection,
    ) -> Result<Vec<ReplayEntry>, DeadLetterError> {
        <Self as DeadLetterSink>::replay(self, writer, selection).await
    }

    /// [`KafkaSink::replay`] of the whole topic and the fallback file.
    async fn replay_all(
        &self,
        writer: &GuardedWriter,
    ) -> Result<Vec<ReplayEntry>, DeadLetterError> {
        let conn = self.conn().await?;
        let progress = self.read_progress(&conn).await?;
        let mut items = Vec::new();
        // Per partition: where the replay started, where the records read end, and the offsets
        // of the entries it replays (a commit stops before the first one not done).
        let mut ranges = Vec::new();
        for pc in &conn.partitions {
            let p = pc.partition();
            let from = progress.committed.get(&p).copied().unwrap_or(0);
            let mut end = from;
            for r in self.read_partition(pc, from, None).await? {
                end = end.max(r.offset + 1);
                if progress.done.contains(&(p, r.offset)) {
                    continue;
                }
                if let Some(letter) = self.decode(p, &r) {
                    items.push(Item {
                        letter,
                        at: Some((p, r.offset)),
                    });
                }
            }
            ranges.push((p, from, end));
        }
        items.extend(
            self.fallback
                .list()
                .await?
                .into_iter()
                .map(|letter| Item { letter, at: None }),
        );
        let pending: Vec<(i32, i64)> = items.iter().filter_map(|i| i.at).collect();
        let settle = KafkaSettle {
            sink: self,
            conn: &conn,
            done: std::sync::Mutex::new(HashSet::new()),
        };
        let out = replay_items(writer, items, &settle, None).await;
        let done = settle.done.into_inner().unwrap_or_else(|e| e.into_inner());
        for (p, from, end) in ranges {
            let first_open = pending
                .iter()
                .filter(|(q, o)| *q == p && !done.contains(&(*q, *o)))
                .map(|(_, o)| *o)
                .min();
            let commit = first_open.unwrap_or(end);
            if commit > from {
                self.write_progress(&conn, OffsetKind::Commit, p, commit)
                    .await?;
            }
        }
        Ok(out)
    }

    /// Marks the record at `at` done in the replay group's progress.
    async fn mark_done(&self, conn: &Conn, (partition, offset): (i32, i64)) -> Result<(), String> {
        self.write_progress(conn, OffsetKind::Done, partition, offset)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Settles the entries of a replay of the whole topic: records are marked done, fallback
/// entries removed from the file.
struct KafkaSettle<'a> {
    sink: &'a KafkaSink,
    conn: &'a Conn,
    /// The records marked done.
    done: std::sync::Mutex<HashSet<(i32, i64)>>,
}

impl KafkaSettle<'_> {
    fn record_done(&self, at: (i32, i64)) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(at);
    }
}

#[async_trait]
impl Settle for KafkaSettle<'_> {
    async fn done(&self, item: &Item) -> Result<(), String> {
        match item.at {
            Some((partition, offset)) => {
                let at = (partition, offset);
                tracing::debug!(
                    partition,
                    offset,
                    "operation applied; committing its offset"
                );
                self.sink.mark_done(self.conn, at).await?;
                self.record_done(at);
                Ok(())
            }
            None => self
                .sink
                .fallback
                .remove(item.letter.id)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    async fn repark(&self, item: &Item, updated: &DeadLetter) -> Option<String> {
        let Some(at) = item.at else {
            return self
                .sink
                .fallback
                .park(updated)
                .await
                .err()
                .map(|e| e.to_string());
        };
        // Re-park first (topic, or the fallback file), then mark the record done: a crash in
        // between leaves the entry twice, never zero times.
        if let Err(e) = self.sink.park(updated).await {
            return Some(e.to_string());
        }
        match self.sink.mark_done(self.conn, at).await {
            Ok(()) => {
                self.record_done(at);
                None
            }
            Err(e) => Some(format!(
                "re-parked, but the record was not marked done: {e}"
            )),
        }
    }
}

#[async_trait]
impl DeadLetterSink for KafkaSink {
    async fn park(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        match self.produce(letter).await {
            Ok((partition, offset)) => {
                tracing::info!(id = %letter.id, topic = %self.settings.topic, partition, offset,
                    "operation parked");
                Ok(())
            }
            Err(e) => match self.fallback.park(letter).await {
                Ok(()) => {
                    self.fallbacks.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(id = %letter.id, error = %e,
                        file = %self.fallback.path().display(),
                        "the Kafka broker did not acknowledge the dead letter; parked in the fallback file");
                    Ok(())
                }
                Err(file_error) => {
                    tracing::warn!(id = %letter.id, error = %e,
                        "the Kafka broker did not acknowledge the dead letter, and the fallback file refused it");
                    Err(file_error)
                }
            },
        }
    }

    async fn list(&self) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let conn = self.conn().await?;
        let progress = self.read_progress(&conn).await?;
        let mut found = self.pending(&conn, &progress).await?;
        found.sort_by_key(|f| f.letter.parked_at);
        let mut order: Vec<Uuid> = Vec::new();
        let mut latest: HashMap<Uuid, DeadLetter> = HashMap::new();
        let file = self.fallback.list().await?;
        for letter in found.into_iter().map(|f| f.letter).chain(file) {
            if !latest.contains_key(&letter.id) {
                order.push(letter.id);
            }
            latest.insert(letter.id, letter);
        }
        Ok(order
            .into_iter()
            .filter_map(|id| latest.remove(&id))
            .collect())
    }

    async fn remove(&self, id: Uuid) -> Result<bool, DeadLetterError> {
        let conn = self.conn().await?;
        let progress = self.read_progress(&conn).await?;
        let mut removed = false;
        for f in self.pending(&conn, &progress).await? {
            if f.letter.id == id {
                self.write_progress(&conn, OffsetKind::Done, f.partition, f.offset)
                    .await?;
                removed = true;
            }
        }
        Ok(self.fallback.remove(id).await? || removed)
    }

    async fn replay(
        &self,
        writer: &GuardedWriter,
        selection: ReplaySelection,
    ) -> Result<Vec<ReplayEntry>, DeadLetterError> {
        match selection {
            ReplaySelection::All => self.replay_all(writer).await,
            ReplaySelection::Id(_) => replay_listed(writer, self, selection).await,
        }
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "Kafka topic {} on {}",
            self.settings.topic,
            self.settings.brokers.join(",")
        );
        let n = self.fallbacks();
        if n > 0 {
            s.push_str(&format!(
                " ({n} parked in the fallback file {} because the broker did not acknowledge them)",
                self.fallback.path().display()
            ));
        } else {
            s.push_str(&format!(
                " (fallback file {})",
                self.fallback.path().display()
            ));
        }
        s
    }
}

/// The partition of `key` among `n`, as Kafka's default partitioner picks it:
/// `(murmur2(key) & 0x7fffffff) % n`.
pub fn partition_for(key: &[u8], n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    ((murmur2(key) & 0x7fff_ffff) as usize) % n
}

/// Kafka's murmur2 (the Java client's `Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // Values from the Kafka Java client's own tests.
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58_897_971
        );
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }

    #[test]
    fn one_key_always_maps_to_one_partition() {
        let p = partition_for(b"article-7", 3);
        assert!(p < 3);
        assert_eq!(partition_for(b"article-7", 3), p);
        assert_eq!(partition_for(b"anything", 1), 0);
    }
}
