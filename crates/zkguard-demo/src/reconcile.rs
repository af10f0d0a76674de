//! The reconciliation: every operation checked against its article and the dead-letter sink.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;
use uuid::Uuid;

use zkguard::es::{DocStore, EsError};
use zkguard::write::deadletter::DeadLetterSink;
use zkguard::write::ops::Stamp;

use super::report::{tally, OpRecord, OpStatus, Reconciliation};

/// Checks every operation of `records` against the articles in `index` and the dead-letter
/// `sink`; see the module documentation. Sets each record's [`OpRecord::recorded`] from its
/// document, which settles the uncertain failures, and takes its counts from the records.
///
/// What cannot be read is reported in [`Reconciliation::unchecked`], not as an error: after
/// the first failure to read a document, the remaining articles are left unchecked (a server
/// that is down or frozen would make each read wait for its timeout).
///
/// # Cancellation safety
/// Cancel-safe: it only reads (a dropped call may leave some records' `recorded` set).
pub async fn reconcile(
    store: &dyn DocStore,
    index: &str,
    records: &mut [OpRecord],
    sink: &dyn DeadLetterSink,
) -> Reconciliation {
    let mut rec = Reconciliation::default();
    let parked_ids: Option<HashSet<Uuid>> = match sink.list().await {
        Ok(letters) => Some(letters.into_iter().map(|l| l.id).collect()),
        Err(e) => {
            rec.unchecked.push(format!(
                "the dead-letter {} could not be read, so parked and lost operations were not checked against it: {e}",
                sink.describe()
            ));
            None
        }
    };
    let mut by_article: BTreeMap<String, Vec<&mut OpRecord>> = BTreeMap::new();
    for r in records.iter_mut() {
        by_article.entry(r.article.clone()).or_default().push(r);
    }
    rec.articles = by_article.len();
    let mut unread: Option<(String, EsError)> = None;
    let mut unread_ops = 0;
    for (article, mut ops) in by_article {
        if unread.is_some() {
            unread_ops += ops.len();
            continue;
        }
        let doc = match store.get(index, &article).await {
            Ok(doc) => doc,
            Err(e) => {
                unread_ops += ops.len();
                unread = Some((article, e));
                continue;
            }
        };
        let Some(doc) = doc else {
            rec.mismatches.push(format!("{index}/{article} is missing"));
            continue;
        };
        let stamp = Stamp::of(&doc.source).unwrap_or_default();
        let mut expected: HashMap<&str, i64> = HashMap::new();
        for op in ops.iter_mut() {
            let recorded = stamp.contains(&op.id);
            op.recorded = Some(recorded);
            let who = format!("{} {} ({})", op.class, op.id, op.actor);
            let applied = match &op.status {
                OpStatus::Applied { .. } | OpStatus::Replayed => {
                    if !recorded {
                        rec.mismatches.push(format!(
                            "{who}: reported applied but {article} does not record it"
                        ));
                    }
                    true
                }
                OpStatus::Rejected {
                    ambiguous: true, ..
                } => recorded,
                OpStatus::Rejected { reason, .. } => {
                    if recorded {
                        rec.mismatches.push(format!(
                            "{who}: reported rejected ({reason}) but {article} records it"
                        ));
                    }
                    false
                }
                OpStatus::Parked { .. } => {
                    if recorded {
                        rec.mismatches
                            .push(format!("{who}: reported parked but {article} records it"));
                    } else if parked_ids.as_ref().is_some_and(|p| !p.contains(&op.id)) {
                        rec.mismatches.push(format!(
                            "{who}: reported parked but it is not in the dead-letter {}",
                            sink.describe()
                        ));
                    }
                    false
                }
                OpStatus::Lost { .. } => {
                    if recorded {
                        rec.mismatches
                            .push(format!("{who}: reported lost but {article} records it"));
                    } else if parked_ids.as_ref().is_some_and(|p| p.contains(&op.id)) {
                        rec.mismatches.push(format!(
                            "{who}: reported lost but it is in the dead-letter {}",
                            sink.describe()
                        ));
                    }
                    false
                }
            };
            if applied {
                *expected.entry(op.field).or_default() += 1;
            }
        }
        for field in ["saves", "propagations"] {
            let want = expected.get(field).copied().unwrap_or(0);
            let have = doc.source.get(field).and_then(Value::as_i64);
            if have != Some(want) {
                rec.mismatches.push(format!(
                    "{index}/{article}: {field} is {} but {want} operations were applied",
                    have.map_or_else(|| "missing".to_string(), |h| h.to_string())
                ));
            }
        }
    }
    if let Some((article, e)) = unread {
        rec.unchecked.push(format!(
            "{unread_ops} operations were not checked against Elasticsearch: reading {index}/{article} failed: {e}"
        ));
    }
    let all = tally(records.iter(), None);
    rec.checked = records.iter().filter(|r| r.recorded.is_some()).count();
    rec.ambiguous_resolved = records
        .iter()
        .filter(|r| {
            r.recorded.is_some()
                && matches!(
                    r.status,
                    OpStatus::Rejected {
                        ambiguous: true,
                        ..
                    }
                )
        })
        .count();
    rec.applied = all.applied + all.replayed;
    rec.rejected = all.rejected;
    rec.uncertain = all.uncertain;
    rec.parked = all.parked;
    rec.lost = all.lost;
    rec
}
