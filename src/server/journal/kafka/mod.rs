//! The Kafka journal (`server.journal.backend=kafka`): background operations of a fleet of
//! `zkguard serve` instances in one replicated topic.
//!
//! - **Accept**: each operation is one record of `server.journal.kafka.topic`, keyed by its
//!   monitor and sent to partition `murmur2(monitor) % partitions` (Kafka's default
//!   partitioner), so that one document's operations stay in one partition in the order they
//!   were accepted. A request's records are produced with `acks=all` (in one produce request
//!   per partition it touches, the partitions in parallel) and the request is answered 202 only
//!   once every one is acknowledged; otherwise 503 `journal_unavailable` (see
//!   [`KafkaJournal::accept`]). Requests accepted while a partition's produce request waits for
//!   its acknowledgement share the next one ([`group`]), over connections of their own, apart
//!   from those the appliers fetch on (a broker may answer one connection's requests in turn,
//!   and a fetch waits for records).
//! - **Ownership** ([`owner`]): every instance registers as an ephemeral member of the fleet in
//!   ZooKeeper and takes a fair share of the partitions, each through zkguard's own lock on the
//!   monitor `zkguard-journal-<topic>-<partition>`. A partition is applied only by the holder of
//!   its lock; the lock lost, its applier stops at once.
//! - **Progress** ([`progress`]): each partition's applied offset is a document of
//!   `server.journal.kafka.index`, written with the owner's fencing token as its external
//!   version (`version_type=external_gte`): a new owner writes it first, after which a deposed
//!   owner's commit is refused (409) and it stops. A new owner resumes from the committed offset;
//!   operations applied after it by the previous owner are recognised by the operation ids the
//!   documents remember, so nothing is applied twice.
//! - **Outcomes**: written to the same index, one document per batch the dispatcher finished
//!   (`outcomes-<uuid>`, the operations' ids in its one indexed field `ops`; earlier versions
//!   wrote one `op-<id>` per operation, still read), read by every instance for
//!   `GET /v1/operations/{id}`.
//!
//! The status of every partition ([`JournalStatus`]) is refreshed every second.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use serde::Serialize;
use tokio::sync::watch;
use uuid::Uuid;
use zkguard::config::JournalKafkaSettings;
use zkguard::es::DocStore;
use zkguard::write::deadletter::kafka::partition_for;
use zkguard::write::ops::Operation;
use zkguard::{LockService, ZkSession};

use super::{Entry, Journal, JournalError, OpState, KEEP_FINISHED};

mod group;
pub mod owner;
mod parts;
pub mod progress;

/// The fleet's journal status, as [`crate::server::state::AppState::journal_status`] returns it
/// (`None` there with the file journal): one [`PartitionStatus`] per partition of the topic.
/// Refreshed every second; stable for the status page, `/metrics` and `zkguard journal`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JournalStatus {
    /// The journal topic.
    pub topic: String,
    /// This instance's name (`server.instance.id`).
    pub instance: String,
    /// The live members of the fleet, as ZooKeeper last listed them.
    pub members: Vec<String>,
    /// Each partition, in order.
    pub partitions: Vec<PartitionStatus>,
    /// Why the broker cannot take writes now, if it cannot (then background writes get 503).
    pub problem: Option<String>,
}

/// One partition of the Kafka journal (see [`JournalStatus`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PartitionStatus {
    /// Partition number.
    pub partition: i32,
    /// The instance that applies it (the owner named in its progress document), if any.
    pub owner: Option<String>,
    /// Whether this instance holds its lock and applies it.
    pub owned_here: bool,
    /// The owner's fencing token: that of the lock held here when [`Self::owned_here`], else
    /// the token in the partition's progress document (the last owner's claim); `None` while
    /// nobody ever claimed it. A lock taken later has a greater token, so a new token tells a
    /// new lock (a takeover, or an instance that took its partition back with a new session)
    /// from the same owner going on.
    pub token: Option<u64>,
    /// Offset up to which every record is applied (committed, fenced by the owner's token).
    pub committed_offset: i64,
    /// The partition's end (the offset its next record gets).
    pub end_offset: i64,
    /// Records not applied yet: `end_offset - committed_offset`.
    pub lag: i64,
    /// How long ago the oldest operation not applied yet was accepted (`None`: none waits).
    #[serde(serialize_with = "secs")]
    pub oldest_unapplied_age: Option<Duration>,
}

fn secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Operations accepted by this instance, remembered for `GET /v1/operations/{id}` until their
/// outcome is known (at most [`KEEP_FINISHED`]).
#[derive(Default)]
struct Accepted {
    ops: HashMap<Uuid, Arc<Operation>>,
    order: VecDeque<Uuid>,
}

/// The Kafka journal of one instance. See the module documentation.
pub struct KafkaJournal {
    settings: JournalKafkaSettings,
    instance: String,
    _client: Client,
    /// Each partition's client for fetches and offsets (the appliers, the status).
    partitions: Vec<Arc<PartitionClient>>,
    /// Each partition's produce requests, on a connection of their own (see [`group`]).
    producers: Vec<Arc<group::Group<Record>>>,
    /// The table of operation states (in memory), shared with the service's state.
    table: Arc<Journal>,
    store: Arc<dyn DocStore>,
    session: ZkSession,
    locks: Arc<dyn LockService>,
    /// `server.queue.max`: records of the topic not applied yet, fleet-wide, beyond which
    /// acceptance is refused.
    queue_max: usize,
    problem: watch::Sender<Option<String>>,
    accepted: Mutex<Accepted>,
    /// Records not applied yet, fleet-wide, at the last status refresh, plus those this
    /// instance produced since.
    lag: AtomicI64,
    status: Mutex<JournalStatus>,
    /// The partitions owned here (see [`owner`] and [`parts`]).
    owned: parts::Owned,
}

impl std::fmt::Debug for KafkaJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaJournal")
            .field("topic", &self.settings.topic)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// Why the Kafka journal cannot start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaJournalError {
    /// No broker answered.
    #[error("the Kafka journal's brokers ({brokers}) do not answer: {detail}; check server.journal.kafka.brokers and that the brokers run")]
    Unreachable {
        /// The brokers tried.
        brokers: String,
        /// What failed.
        detail: String,
    },
    /// The topic exists with another partition count.
    #[error("the journal topic {topic} has {found} partitions but server.journal.kafka.partitions is {configured}: set server.journal.kafka.partitions={found} (every instance of the fleet must use the topic's count, since a monitor's partition depends on it)")]
    Partitions {
        /// The topic.
        topic: String,
        /// Its partitions.
        found: usize,
        /// The configured count.
        configured: u32,
    },
    /// The broker refused something else.
    #[error("the Kafka journal (topic {topic}) cannot start: {detail}")]
    Broker {
        /// The topic.
        topic: String,
        /// What failed.
        detail: String,
    },
}

impl KafkaJournal {
    /// Connects to the brokers, creates the topic when missing (refusing one with another
    /// partition count) and the progress index.
    ///
    /// # Errors
    /// [`KafkaJournalError`].
    pub async fn connect(
        settings: &JournalKafkaSettings,
        instance: String,
        table: Arc<Journal>,
        store: Arc<dyn DocStore>,
        session: ZkSession,
        locks: Arc<dyn LockService>,
        queue_max: usize,
    ) -> Result<Arc<Self>, KafkaJournalError> {
        let topic = settings.topic.clone();
        let broker = |detail: String| KafkaJournalError::Broker {
            topic: topic.clone(),
            detail,
        };
        let unreachable = |detail: String| KafkaJournalError::Unreachable {
            brokers: settings.brokers.join(","),
            detail,
        };
        let backoff = BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(settings.timeout),
        };
        let client = tokio::time::timeout(
            settings.timeout,
            ClientBuilder::new(settings.brokers.clone())
                .client_id(format!("zkguard-{instance}"))
                .backoff_config(backoff)
                .build(),
        )
        .await
        .map_err(|_| unreachable("no answer".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
        let found = list_partitions(&client, &topic, settings.timeout)
            .await
            .map_err(broker)?;
        let count = match found {
            Some(n) if n != settings.partitions as usize => {
                return Err(KafkaJournalError::Partitions {
                    topic,
                    found: n,
                    configured: settings.partitions,
                })
            }
            Some(n) => n,
            None => {
                let controller = client
                    .controller_client()
                    .map_err(|e| broker(e.to_string()))?;
                match controller
                    .create_topic(
                        &topic,
                        settings.partitions as i32,
                        settings.replication as i16,
                        settings.timeout.as_millis() as i32,
                    )
                    .await
                {
                    Ok(()) => tracing::info!(
                        topic,
                        partitions = settings.partitions,
                        "created the journal topic"
                    ),
                    Err(rskafka::client::error::Error::ServerError {
                        protocol_error: rskafka::client::error::ProtocolError::TopicAlreadyExists,
                        ..
                    }) => {}
                    Err(e) => return Err(broker(format!("creating the topic: {e}"))),
                }
                settings.partitions as usize
            }
        };
        let mut partitions = Vec::with_capacity(count);
        let mut producers = Vec::with_capacity(count);
        for p in 0..count as i32 {
            // Two clients, each with its own connection to the partition's leader: the
            // produce requests do not wait behind a fetch that waits for records.
            partitions.push(open_partition(&client, &topic, p).await.map_err(broker)?);
            let producer = open_partition(&client, &topic, p).await.map_err(broker)?;
            producers.push(group::Group::new(
                produce_with(producer, settings.timeout),
                group::MAX_GROUP_BYTES,
            ));
        }
        // Created again once Elasticsearch answers, if it does not yet (see [`owner::run`]).
        if let Err(e) = progress::ensure_index(store.as_ref(), &settings.index).await {
            tracing::warn!(index = %settings.index, error = %e, "cannot create the journal's index yet");
        }
        let status = JournalStatus {
            topic: topic.clone(),
            instance: instance.clone(),
            members: Vec::new(),
            partitions: (0..count as i32)
                .map(|partition| PartitionStatus {
                    partition,
                    ..PartitionStatus::default()
                })
                .collect(),
            problem: None,
        };
        Ok(Arc::new(Self {
            settings: settings.clone(),
            instance,
            _client: client,
            partitions,
            producers,
            table,
            store,
            session,
            locks,
            queue_max,
            problem: watch::channel(None).0,
            accepted: Mutex::new(Accepted::default()),
            lag: AtomicI64::new(0),
            status: Mutex::new(status),
            owned: parts::Owned::default(),
        }))
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.settings.topic
    }

    /// This instance's name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The last status snapshot (refreshed every second by [`owner::run`]).
    pub fn status(&self) -> JournalStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        s.problem = self.problem();
        s
    }

    /// Why the broker cannot take writes now, if it cannot (`/readyz` reports it; background
    /// writes are refused with 503 meanwhile).
    pub fn problem(&self) -> Option<String> {
        self.problem.borrow().clone()
    }

    fn set_problem(&self, why: Option<String>) {
        self.problem.send_if_modified(|p| {
            let changed = *p != why;
            *p = why;
            changed
        });
    }

    /// The partition of `monitor`.
    pub fn partition_of(&self, monitor: &str) -> i32 {
        partition_for(monitor.as_bytes(), self.partitions.len()) as i32
    }

    /// Produces `ops` (those the table does not know already), each a record keyed by its
    /// monitor, and returns once the broker acknowledged every one (`acks=all`). The records
    /// of one partition go in one produce request, which the broker appends whole or not at all;
    /// the partitions of a bulk are produced in parallel. Requests accepted at the same time
    /// share a partition's produce request ([`group`]); each is answered once the produce request
    /// that carried its records was acknowledged.
    ///
    /// # Errors
    /// [`JournalError::Full`] when the topic holds `server.queue.max` records not applied yet
    /// (nothing produced); [`JournalError::Broker`] when a partition's produce failed or was not
    /// acknowledged within `server.journal.kafka.timeout`: the request is not answered 202,
    /// though the records of other partitions (or the failed one, when only its acknowledgement
    /// was lost) may still be applied: a client retrying with the same `op_id` or idempotency
    /// key makes that safe.
    pub async fn accept(&self, ops: Vec<Operation>) -> Result<Vec<Operation>, JournalError> {
        if let Some(why) = self.problem() {
            return Err(JournalError::Broker {
                topic: self.settings.topic.clone(),
                detail: format!("{why}; nothing new is accepted until it answers"),
            });
        }
        let mut seen = std::collections::HashSet::new();
        let fresh: Vec<Operation> = ops
            .into_iter()
            .filter(|op| self.table.get(&op.id).is_none() && seen.insert(op.id))
            .map(|op| op.with_accepted(zkguard::write::ops::acceptance_now()))
            .collect();
        if fresh.is_empty() {
            return Ok(fresh);
        }
        let lag = self.lag.load(Ordering::Relaxed).max(0) as usize;
        if lag + fresh.len() > self.queue_max {
            return Err(JournalError::Full {
                what: format!(
                    "{lag} records of the journal topic {} are not applied yet and {} more would pass server.queue.max ({})",
                    self.settings.topic,
                    fresh.len(),
                    self.queue_max
                ),
            });
        }
        let mut by_partition: HashMap<i32, (Vec<Record>, usize)> = HashMap::new();
        for op in &fresh {
            let value = serde_json::to_vec(op).map_err(|e| JournalError::Broker {
                topic: self.settings.topic.clone(),
                detail: format!("encoding an operation: {e}"),
            })?;
            let (records, bytes) = by_partition
                .entry(self.partition_of(&op.monitor))
                .or_default();
            *bytes += value.len() + op.monitor.len();
            records.push(Record {
                key: Some(op.monitor.clone().into_bytes()),
                value: Some(value),
                headers: Default::default(),
                timestamp: chrono::Utc::now(),
            });
        }
        let timeout = self.settings.timeout;
        let produced = futures::future::join_all(by_partition.into_iter().map(
            |(p, (records, bytes))| {
                let group = self.producers[p as usize].clone();
                async move {
                    // Also bounded here: a request queued behind a produce request that is not
                    // acknowledged waits no longer than one that was sent at once.
                    match tokio::time::timeout(timeout, group.produce(records, bytes)).await {
                        Err(_) => Err(format!(
                            "partition {p}: no acknowledgement within server.journal.kafka.timeout ({timeout:?})"
                        )),
                        Ok(Err(e)) => Err(format!("partition {p}: {e}")),
                        Ok(Ok(())) => Ok(()),
                    }
                }
            },
        ))
        .await;
        if let Some(e) = produced.into_iter().find_map(Result::err) {
            self.set_problem(Some(format!("the broker did not take a record ({e})")));
            return Err(JournalError::Broker {
                topic: self.settings.topic.clone(),
                detail: e,
            });
        }
        self.lag.fetch_add(fresh.len() as i64, Ordering::Relaxed);
        let mut accepted = self.accepted.lock().unwrap_or_else(|p| p.into_inner());
        for op in &fresh {
            accepted.ops.insert(op.id, Arc::new(op.clone()));
            accepted.order.push_back(op.id);
        }
        while accepted.order.len() > KEEP_FINISHED {
            if let Some(old) = accepted.order.pop_front() {
                accepted.ops.remove(&old);
            }
        }
        Ok(fresh)
    }

    /// What is known of operation `id` on this instance: its outcome in the outcomes index
    /// (the first recorded, by whichever instance applied it), else in the table, else queued
    /// when accepted or loaded here; `None` when unknown.
    pub async fn lookup(&self, id: &Uuid) -> Option<Entry> {
        let local = self.table.get(id);
        let here = self
            .accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ops
            .get(id)
            .cloned();
        let op = local.as_ref().and_then(|e| e.op.clone()).or(here);
        match progress::read_outcome(self.store.as_ref(), &self.settings.index, id).await {
            Ok(Some(finished)) => {
                return Some(Entry {
                    op,
                    finished: Some(finished),
                })
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(op = %id, error = %e, "cannot read an outcome"),
        }
        if local.as_ref().is_some_and(|e| e.finished.is_some()) {
            return local;
        }
        op.map(|op| Entry {
            op: Some(op),
            finished: None,
        })
    }

    /// Records outcomes of the dispatcher: written to the outcomes index, then their records
    /// count as applied for the progress of their partition; returns those recorded, for the
    /// table. They are recorded in each monitor's order ([`parts::Owned::ready`]): one whose
    /// monitor has operations read before it not finished yet waits for them (a later call
    /// records it). Outcomes of partitions no longer owned here are dropped (the new owner
    /// applies them again, finding them applied).
    pub async fn finished(&self, all: &[super::Finished]) -> Vec<super::Finished> {
        let mine = self.owned.ready(all);
        if mine.is_empty() {
            return mine;
        }
        let refs: Vec<&super::Finished> = mine.iter().collect();
        if let Err(e) =
            progress::write_outcomes(self.store.as_ref(), &self.settings.index, &refs).await
        {
            tracing::warn!(error = %e, count = mine.len(), "cannot record outcomes in the journal's index: GET /v1/operations on other instances does not see them");
        }
        for f in &mine {
            self.owned.done(&f.id, f.status != OpState::Queued);
        }
        mine
    }

    /// Whether the dispatcher may start `op`: true unless it was read from a partition that is
    /// no longer owned here (its lock lost or released).
    pub fn may_start(&self, op: &Operation) -> bool {
        self.owned.may_start(&op.id)
    }
}

/// A client of partition `p` of `topic`, with a connection of its own to its leader.
async fn open_partition(
    client: &Client,
    topic: &str,
    p: i32,
) -> Result<Arc<PartitionClient>, String> {
    client
        .partition_client(topic.to_string(), p, UnknownTopicHandling::Retry)
        .await
        .map(Arc::new)
        .map_err(|e| format!("opening partition {p}: {e}"))
}

/// Sends one produce request of a partition's [`group::Group`] with `pc`, acknowledged by
/// every in-sync replica (`acks=all`, as every produce request of the client), within
/// `timeout` (`server.journal.kafka.timeout`).
fn produce_with(pc: Arc<PartitionClient>, timeout: Duration) -> group::Produce<Record> {
    Arc::new(move |records: Vec<Record>| {
        let pc = pc.clone();
        Box::pin(async move {
            match tokio::time::timeout(timeout, pc.produce(records, Compression::NoCompression))
                .await
            {
                Err(_) => Err(format!(
                    "no acknowledgement within server.journal.kafka.timeout ({timeout:?})"
                )),
                Ok(Err(e)) => Err(e.to_string()),
                Ok(Ok(_)) => Ok(()),
            }
        })
    })
}

/// The partition count of `topic`, `None` when it does not exist.
async fn list_partitions(
    client: &Client,
    topic: &str,
    timeout: Duration,
) -> Result<Option<usize>, String> {
    let topics = tokio::time::timeout(timeout, client.list_topics())
        .await
        .map_err(|_| "listing the topics: no answer".to_string())?
        .map_err(|e| format!("listing the topics: {e}"))?;
    Ok(topics
        .into_iter()
        .find(|t| t.name == topic)
        .map(|t| t.partitions.len())
        .filter(|n| *n > 0))
}

/// Most bytes the fetch that reads a partition's end asks for (the broker answers at least one
/// batch whole; fewer bytes would cut it, which the client refuses).
const END_FETCH_BYTES: i32 = 1024 * 1024;

/// The end offset of a partition (the offset its next record gets): the greater of the
/// latest offset the broker lists and the high watermark a fetch from there answers. Some
/// brokers (tansu 0.6) list the first offset of the last batch + 1 as the latest offset, below
/// the end when that batch holds several records (a request's records of one partition are one
/// batch); the fetch's high watermark is the end the records reach. (The fetch waits 1 ms:
/// tansu answers a fetch that may not wait with no partition at all.)
pub(crate) async fn end_offset(pc: &PartitionClient, timeout: Duration) -> Result<i64, String> {
    let listed = tokio::time::timeout(timeout, pc.get_offset(OffsetAt::Latest))
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, pc.fetch_records(listed, 1..END_FETCH_BYTES, 1)).await {
        Ok(Ok((_, high_watermark))) => Ok(listed.max(high_watermark)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".to_string()),
    }
}
