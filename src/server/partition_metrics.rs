//! The Kafka journal's partitions on `/metrics`: per partition, whether this instance owns it,
//! its owner, committed and end offsets, lag and the oldest unapplied operation's age, written
//! as OpenMetrics text (every instance reports every partition, so that the fleet's alerts can
//! tell a partition nobody owns from one owned twice).

use std::fmt::Write;
use std::time::Duration;

/// One partition as `/metrics` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionView {
    /// Partition number.
    pub partition: i32,
    /// The instance that applies it, if any.
    pub owner: Option<String>,
    /// Whether this instance applies it.
    pub owned_here: bool,
    /// Offset up to which every record is applied.
    pub committed_offset: i64,
    /// The partition's end offset.
    pub end_offset: i64,
    /// Records produced and not applied yet.
    pub lag: i64,
    /// How long ago the oldest unapplied operation was accepted (`None`: none waits).
    pub oldest_unapplied_age: Option<Duration>,
}

/// The gauge families, each with its help text and the value of a partition.
type Family = (&'static str, &'static str, fn(&PartitionView) -> f64);

const FAMILIES: [Family; 5] = [
    (
        "zkguard_journal_partition_owned",
        "1 when this instance holds the journal partition's lock and applies it",
        |p| f64::from(u8::from(p.owned_here)),
    ),
    (
        "zkguard_journal_partition_committed_offset",
        "Offset up to which every record of the journal partition is applied",
        |p| p.committed_offset as f64,
    ),
    (
        "zkguard_journal_partition_end_offset",
        "The journal partition's end offset",
        |p| p.end_offset as f64,
    ),
    (
        "zkguard_journal_partition_lag",
        "Operations produced to the journal partition and not applied yet",
        |p| p.lag as f64,
    ),
    (
        "zkguard_journal_partition_oldest_unapplied_seconds",
        "Age of the journal partition's oldest operation not applied yet (0: none waits)",
        |p| p.oldest_unapplied_age.map_or(0.0, |d| d.as_secs_f64()),
    ),
];

/// Writes the partitions' families (nothing without partitions: the file journal).
pub fn render(out: &mut String, partitions: &[PartitionView]) {
    if partitions.is_empty() {
        return;
    }
    for (name, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} gauge");
        for p in partitions {
            let _ = writeln!(out, "{name}{{partition=\"{}\"}} {}", p.partition, value(p));
        }
    }
    let name = "zkguard_journal_partition_owner_info";
    let _ = writeln!(
        out,
        "# HELP {name} The instance that applies the journal partition (1, labelled with the owner; absent while nobody does).\n# TYPE {name} gauge"
    );
    for p in partitions {
        if let Some(owner) = &p.owner {
            let _ = writeln!(
                out,
                "{name}{{partition=\"{}\",owner=\"{}\"}} 1",
                p.partition,
                escape(owner)
            );
        }
    }
}

/// A label value escaped for the text format (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_gets_every_gauge_and_its_owner() {
        let mut out = String::new();
        render(
            &mut out,
            &[
                PartitionView {
                    partition: 0,
                    owner: Some("host-\"a\"".into()),
                    owned_here: true,
                    committed_offset: 7,
                    end_offset: 10,
                    lag: 3,
                    oldest_unapplied_age: Some(Duration::from_millis(2500)),
                },
                PartitionView {
                    partition: 1,
                    ..Default::default()
                },
            ],
        );
        for line in [
            "zkguard_journal_partition_owned{partition=\"0\"} 1",
            "zkguard_journal_partition_owned{partition=\"1\"} 0",
            "zkguard_journal_partition_committed_offset{partition=\"0\"} 7",
            "zkguard_journal_partition_end_offset{partition=\"0\"} 10",
            "zkguard_journal_partition_lag{partition=\"0\"} 3",
            "zkguard_journal_partition_oldest_unapplied_seconds{partition=\"0\"} 2.5",
            "zkguard_journal_partition_oldest_unapplied_seconds{partition=\"1\"} 0",
            "zkguard_journal_partition_owner_info{partition=\"0\",owner=\"host-\\\"a\\\"\"} 1",
            "# TYPE zkguard_journal_partition_owner_info gauge",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert!(!out.contains("owner_info{partition=\"1\""), "{out}");
    }

    #[test]
    fn the_file_journal_has_no_partitions() {
        let mut out = String::new();
        render(&mut out, &[]);
        assert_eq!(out, "");
    }
}
