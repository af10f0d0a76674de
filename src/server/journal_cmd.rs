//! `zkguard journal`: the partitions of a fleet's Kafka journal (`server.journal.backend =
//! kafka`) as the stores hold them: each partition's owner (the instance that last committed its
//! progress, whether it is a live member of the fleet, and its fencing token), committed and end
//! offsets, lag, and the age of its oldest unapplied operation. It reads the brokers, the
//! progress documents in Elasticsearch and the fleet's members in ZooKeeper; no instance needs
//! to run.

use rskafka::client::partition::UnknownTopicHandling;
use rskafka::client::ClientBuilder;
use serde::Serialize;
use zkguard::config::{JournalBackendKind, Settings};
use zkguard::es::EsStore;
use zkguard::ZkSession;

use super::journal::kafka::{self, owner, progress};
use crate::exit::{CliError, EX_UNAVAILABLE};

/// Arguments of `zkguard journal`.
#[derive(Debug, clap::Args)]
pub struct JournalArgs {
    /// Print JSON (the topic, the live members and one object per partition) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One partition, as printed.
#[derive(Debug, Serialize)]
struct Row {
    partition: i32,
    /// The instance that last committed the partition's progress.
    owner: Option<String>,
    /// Whether that instance is a live member of the fleet.
    owner_live: bool,
    /// That owner's fencing token, as its progress names it (`None` while nobody claimed the
    /// partition): a greater token is a lock taken later.
    token: Option<u64>,
    committed_offset: i64,
    end_offset: i64,
    lag: i64,
    oldest_unapplied_seconds: Option<f64>,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::new(EX_UNAVAILABLE, format!("{what}: {e}"))
}

/// Runs `zkguard journal`.
pub async fn run(settings: Settings, args: JournalArgs) -> Result<u8, CliError> {
    if settings.server.journal_backend != JournalBackendKind::Kafka {
        return Err(CliError::usage(
            "server.journal.backend is file: that journal is one instance's file (its status page and /metrics show it); zkguard journal reads a fleet's Kafka journal (set server.journal.backend=kafka and server.journal.kafka.brokers)",
        ));
    }
    let k = &settings.server.journal_kafka;
    let timeout = k.timeout;
    let client = tokio::time::timeout(timeout, ClientBuilder::new(k.brokers.clone()).build())
        .await
        .map_err(|_| unavailable("the journal's brokers", "no answer"))?
        .map_err(|e| unavailable("the journal's brokers", e))?;
    let store = EsStore::new(&settings.elasticsearch)?;
    let session = ZkSession::connect(&settings.zookeeper).await?;
    let members = session.members(&owner::members_group(&k.topic)).await?;
    let mut rows = Vec::new();
    for partition in 0..k.partitions as i32 {
        let pc = client
            .partition_client(k.topic.clone(), partition, UnknownTopicHandling::Error)
            .await
            .map_err(|e| unavailable(&format!("partition {partition} of {}", k.topic), e))?;
        let end = kafka::end_offset(&pc, timeout)
            .await
            .map_err(|e| unavailable(&format!("partition {partition}'s end"), e))?;
        let done = progress::read(&store, &k.index, &k.topic, partition)
            .await
            .map_err(|e| unavailable(&format!("partition {partition}'s progress"), e))?;
        let lag = (end - done.offset).max(0);
        let oldest = if lag > 0 {
            owner::oldest_at(&pc, done.offset, timeout)
                .await
                .map(|age| age.as_secs_f64())
        } else {
            None
        };
        rows.push(Row {
            partition,
            owner_live: done.owner.as_ref().is_some_and(|o| members.contains(o)),
            token: Some(done.token).filter(|&t| t > 0),
            owner: done.owner,
            committed_offset: done.offset,
            end_offset: end,
            lag,
            oldest_unapplied_seconds: oldest,
        });
    }
    if args.json {
        let out = serde_json::json!({"topic": k.topic, "members": members, "partitions": rows});
        println!("{out}");
    } else {
        print!("{}", table(&k.topic, &members, &rows));
    }
    Ok(0)
}

/// The human-readable listing.
fn table(topic: &str, members: &[String], rows: &[Row]) -> String {
    let mut out = format!(
        "journal topic {topic}: {} live member{} ({})\n{:<10} {:<32} {:>12} {:>12} {:>8}  OLDEST UNAPPLIED\n",
        members.len(),
        if members.len() == 1 { "" } else { "s" },
        members.join(", "),
        "PARTITION",
        "OWNER",
        "COMMITTED",
        "END",
        "LAG"
    );
    for r in rows {
        let owner = match (&r.owner, r.owner_live) {
            (Some(o), true) => o.clone(),
            (Some(o), false) => format!("{o} (gone)"),
            (None, _) => "-".into(),
        };
        let oldest = r
            .oldest_unapplied_seconds
            .map_or_else(|| "-".into(), |s| format!("{s:.1} s"));
        out.push_str(&format!(
            "{:<10} {:<32} {:>12} {:>12} {:>8}  {oldest}\n",
            r.partition, owner, r.committed_offset, r.end_offset, r.lag
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_gone_owners_and_waiting_ages() {
        let rows = [
            Row {
                partition: 0,
                owner: Some("a:7717".into()),
                owner_live: true,
                token: Some(12),
                committed_offset: 5,
                end_offset: 5,
                lag: 0,
                oldest_unapplied_seconds: None,
            },
            Row {
                partition: 1,
                owner: Some("b:7717".into()),
                owner_live: false,
                token: Some(9),
                committed_offset: 3,
                end_offset: 9,
                lag: 6,
                oldest_unapplied_seconds: Some(12.34),
            },
        ];
        let text = table("zkguard-journal", &["a:7717".into()], &rows);
        assert!(
            text.starts_with("journal topic zkguard-journal: 1 live member (a:7717)\n"),
            "{text}"
        );
        assert!(text.contains("b:7717 (gone)"), "{text}");
        assert!(text.contains("12.3 s"), "{text}");
        assert_eq!(text.lines().count(), 4, "{text}");
    }
}
