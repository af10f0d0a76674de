//! The Kafka journal's partitions on `/metrics`: per partition, whether this instance owns it,
//! its owner and the owner's fencing token, committed and end offsets, lag and the oldest
//! unapplied operation's age, written as OpenMetrics text (every instance reports every
//! partition, so that the fleet's alerts can tell a partition nobody owns from one owned twice).

use std::fmt::Write;

use super::journal::kafka::PartitionStatus;

/// The gauge families, each with its help text and the value of a partition.
type Family = (&'static str, &'static str, fn(&PartitionStatus) -> f64);

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
pub fn render(out: &mut String, partitions: &[PartitionStatus]) {
    if partitions.is_empty() {
        return;
    }
    for (name, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}.\n# TYPE {name} gauge");
        for p in partitions {
            let _ = writeln!(out, "{name}{{partition=\"{}\"}} {}", p.partition, value(p));
        }
    }
    let name = "zkguard_journal_partition_token";
    let _ = writeln!(
        out,
        "# HELP {name} The fencing token of the journal partition's owner: its lock's where this instance owns it, else the one its progress names (absent while nobody ever claimed it); a greater token is a lock taken later.\n# TYPE {name} gauge"
    );
    for p in partitions {
        if let Some(token) = p.token {
            let _ = writeln!(out, "{name}{{partition=\"{}\"}} {token}", p.partition);
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
    use std::time::Duration;

    #[test]
    fn each_partition_gets_every_gauge_and_its_owner() {
        let mut out = String::new();
        render(
            &mut out,
            &[
                PartitionStatus {
                    partition: 0,
                    owner: Some("host-\"a\"".into()),
                    owned_here: true,
                    token: Some(4_294_967_301),
                    committed_offset: 7,
                    end_offset: 10,
                    lag: 3,
                    oldest_unapplied_age: Some(Duration::from_millis(2500)),
                },
                PartitionStatus {
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
            "zkguard_journal_partition_token{partition=\"0\"} 4294967301",
            "# TYPE zkguard_journal_partition_token gauge",
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
        assert!(!out.contains("owner_info{partition=\"1\""), "{out}");
        assert!(!out.contains("token{partition=\"1\""), "{out}");
    }

    #[test]
    fn the_file_journal_has_no_partitions() {
        let mut out = String::new();
        render(&mut out, &[]);
        assert_eq!(out, "");
    }
}
