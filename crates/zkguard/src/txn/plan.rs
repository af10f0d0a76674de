//! Checking a transaction before anything is locked, and computing each document's after-image
//! from its before-image: pure functions, shared by the coordinator and recovery.

use std::collections::HashSet;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::{Action, Expect, MultiError, TxnOp, TxnRequest};
use crate::config::TxnSettings;
use crate::es::{merge_partial, Doc};
#[cfg(test)]
use crate::write::ops::DEFAULT_OPS_WINDOW;
use crate::write::ops::{with_stamp, Stamp, META_FIELD};

/// Parses NDJSON operations, one [`TxnOp`] per line (blank lines skipped).
///
/// # Errors
/// [`MultiError::Invalid`] naming the line and what is wrong with it.
pub fn parse_ndjson(text: &str) -> Result<Vec<TxnOp>, MultiError> {
    let mut ops = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let op: TxnOp = serde_json::from_str(line).map_err(|e| {
            MultiError::Invalid(format!(
                "line {}: {e}; each line is {{\"action\":\"index\"|\"update\"|\"delete\",\"index\":...,\"id\":...,\"doc\":{{...}}}} with optional upsert, monitor and expect ({{\"exists\":true|false}} or {{\"if_seq_no\":N,\"if_primary_term\":M}})",
                n + 1
            ))
        })?;
        ops.push(op);
    }
    Ok(ops)
}

/// Checks a request against the limits and the rules; nothing is locked or written before.
///
/// # Errors
/// [`MultiError::Invalid`] / [`MultiError::TooLarge`] saying what is wrong.
pub(super) fn validate(
    req: &TxnRequest,
    settings: &TxnSettings,
    unstamped: &crate::write::stamping::IndexPatterns,
) -> Result<(), MultiError> {
    crate::transfer::validate_id("transaction", &req.id)
        .map_err(|e| MultiError::Invalid(e.to_string()))?;
    if req.operations.is_empty() {
        return Err(MultiError::Invalid(
            "it has no operations; give at least one".into(),
        ));
    }
    let count = req.operations.len();
    if count > settings.max_operations {
        return Err(MultiError::TooLarge {
            what: "operations",
            key: "txn.max.operations",
            actual: count as u64,
            limit: settings.max_operations as u64,
        });
    }
    let bytes: u64 = req
        .operations
        .iter()
        .map(|op| op.doc.as_ref().map_or(0, |d| d.to_string().len() as u64))
        .sum();
    if bytes > settings.max_bytes {
        return Err(MultiError::TooLarge {
            what: "bytes of documents",
            key: "txn.max.bytes",
            actual: bytes,
            limit: settings.max_bytes,
        });
    }
    let mut seen = HashSet::new();
    for (n, op) in req.operations.iter().enumerate() {
        let bad = |what: String| {
            MultiError::Invalid(format!(
                "operation {} ({} `{}/{}`): {what}",
                n + 1,
                op.action.as_str(),
                op.index,
                op.id
            ))
        };
        if op.index.is_empty() || op.id.is_empty() {
            return Err(bad("`index` and `id` must not be empty".into()));
        }
        if op.index.starts_with(['_', '-', '+'])
            || op
                .index
                .chars()
                .any(|c| c.is_ascii_uppercase() || c.is_whitespace() || "\\/*?\"<>|,#:".contains(c))
        {
            return Err(bad(format!("`{}` is not a valid index name", op.index)));
        }
        if op.index == settings.log_index {
            return Err(bad(format!(
                "`{}` is the transaction log (txn.log.index); it cannot take part in a transaction",
                op.index
            )));
        }
        if unstamped.matches(&op.index) {
            return Err(bad(format!(
                "`{}` is listed in elastic.stamp.off: its documents carry no `zkguard` object, where a transaction marks its writes; take it out of elastic.stamp.off to use it in transactions",
                op.index
            )));
        }
        if !seen.insert((op.index.as_str(), op.id.as_str())) {
            return Err(bad(
                "the document appears twice; a transaction changes each document at most once (merge the two operations)".into(),
            ));
        }
        match (op.action, &op.doc) {
            (Action::Index | Action::Update, None) => {
                return Err(bad("it needs `doc`, a JSON object".into()))
            }
            (Action::Index | Action::Update, Some(d)) if !d.is_object() => {
                return Err(bad("`doc` must be a JSON object".into()))
            }
            (Action::Index | Action::Update, Some(d)) if d.get(META_FIELD).is_some() => {
                return Err(bad(format!(
                    "`doc` holds `{META_FIELD}`, the field zkguard keeps its stamp in; rename it"
                )))
            }
            (Action::Delete, Some(_)) => return Err(bad("a delete takes no `doc`".into())),
            _ => {}
        }
        if op.upsert && op.action != Action::Update {
            return Err(bad("`upsert` goes with `update` only".into()));
        }
        if let Some(monitor) = &op.monitor {
            crate::lock::validate_monitor(monitor).map_err(|e| bad(e.to_string()))?;
        }
    }
    Ok(())
}

/// Why the expectation of `op` fails on `current` (read under the lock), if it does.
pub(super) fn failed_expectation(op: &TxnOp, current: Option<&Doc>) -> Option<String> {
    let expect = op.expect?;
    let holds = match (expect, current) {
        (Expect::Presence { exists }, doc) => exists == doc.is_some(),
        (
            Expect::Version {
                if_seq_no,
                if_primary_term,
            },
            Some(doc),
        ) => doc.meta.seq_no == if_seq_no && doc.meta.primary_term == if_primary_term,
        (Expect::Version { .. }, None) => false,
    };
    if holds {
        return None;
    }
    let found = match current {
        None => "it does not exist".to_string(),
        Some(doc) => format!(
            "it exists at _seq_no {} and _primary_term {}",
            doc.meta.seq_no, doc.meta.primary_term
        ),
    };
    Some(format!(
        "expectation failed on `{}/{}`: expected {expect}, but {found}",
        op.index, op.id
    ))
}

/// The source `op` leaves, without zkguard's object, given the stored source before it
/// (`None`: absent): `Ok(None)` for a delete.
///
/// # Errors
/// Why it cannot be applied (an update of a missing document without `upsert`).
pub(super) fn after_image(op: &TxnOp, before: Option<&Value>) -> Result<Option<Value>, String> {
    let doc = || op.doc.clone().unwrap_or_else(|| Value::Object(Map::new()));
    match op.action {
        Action::Delete => Ok(None),
        Action::Index => Ok(Some(doc())),
        Action::Update => match before {
            Some(stored) => {
                let mut source = super::record::user_source(stored);
                if let (Value::Object(target), Some(Value::Object(changes))) =
                    (&mut source, &op.doc)
                {
                    merge_partial(target, changes);
                }
                Ok(Some(source))
            }
            None if op.upsert => Ok(Some(doc())),
            None => Err(format!(
                "`{}/{}` does not exist, and an update needs it (set \"upsert\": true to create it)",
                op.index, op.id
            )),
        },
    }
}

/// The id under which operation `n` of transaction `txn` is recorded in its document's stamp.
pub(super) fn op_id(txn: &str, n: usize, restore: bool) -> Uuid {
    let name = format!("{txn}#{n}{}", if restore { "#undo" } else { "" });
    Uuid::new_v5(&crate::write::ops::OP_KEY_NAMESPACE, name.as_bytes())
}

/// `source` with the stamp that follows `previous`'s (the stored document's) for operation
/// `op`, written with `token`; marked with `txn` when given. A tombstone when `source` is
/// `None`.
pub(super) fn stamped(
    window: usize,
    source: Option<Value>,
    previous: Option<&Value>,
    op: &Uuid,
    token: u64,
    txn: Option<&str>,
) -> Value {
    let old = previous.and_then(Stamp::of).unwrap_or_default();
    let mut stamp = old.next(op, token, window, source.is_none());
    stamp.txn = txn.map(str::to_string);
    with_stamp(source.unwrap_or_else(|| Value::Object(Map::new())), &stamp)
}

/// `source` as stored, rewritten with `token`: only the stamp's token changes, so that the
/// document carries a version newer than a stalled coordinator's while everything it holds
/// (another transaction's mark, a tombstone) stays as it is.
pub(super) fn rewritten(source: &Value, token: u64) -> Value {
    let mut stamp = Stamp::of(source).unwrap_or_default();
    stamp.token = token;
    with_stamp(source.clone(), &stamp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use serde_json::json;

    fn settings() -> TxnSettings {
        let mut s = Settings::default().txn;
        s.max_operations = 3;
        s.max_bytes = 100;
        s
    }

    #[test]
    fn bad_requests_are_named() {
        let s = settings();
        let cases = [
            (vec![], "no operations"),
            (
                vec![TxnOp::index("a", "1", json!({})), TxnOp::delete("a", "1")],
                "appears twice",
            ),
            (vec![TxnOp::delete("A", "1")], "not a valid index"),
            (
                vec![TxnOp {
                    doc: None,
                    ..TxnOp::index("a", "1", json!({}))
                }],
                "needs `doc`",
            ),
            (vec![TxnOp::index("a", "1", json!([1]))], "JSON object"),
            (
                vec![TxnOp::index("a", "1", json!({})); 4],
                "txn.max.operations",
            ),
            (
                vec![TxnOp::index("a", "1", json!({"x": "y".repeat(200)}))],
                "txn.max.bytes",
            ),
            (
                vec![TxnOp::index(&s.log_index, "1", json!({}))],
                "transaction log",
            ),
            (vec![TxnOp::index("a", "1", json!({})).upsert()], "`upsert`"),
        ];
        for (ops, needle) in cases {
            let e = validate(&TxnRequest::new(ops.clone()), &s, &Default::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{ops:?}: {e}");
        }
        validate(
            &TxnRequest::new(vec![
                TxnOp::index("a", "1", json!({})),
                TxnOp::delete("a", "2"),
            ]),
            &s,
            &Default::default(),
        )
        .unwrap();
    }

    #[test]
    fn ndjson_errors_name_the_line() {
        let ops = parse_ndjson(
            "{\"action\":\"delete\",\"index\":\"a\",\"id\":\"1\",\"expect\":{\"exists\":true}}\n\n{\"action\":\"update\",\"index\":\"a\",\"id\":\"2\",\"doc\":{},\"expect\":{\"if_seq_no\":3,\"if_primary_term\":1}}\n",
        )
        .unwrap();
        assert_eq!(ops[0].expect, Some(Expect::Exists));
        assert_eq!(
            ops[1].expect,
            Some(Expect::Version {
                if_seq_no: 3,
                if_primary_term: 1
            })
        );
        let e = parse_ndjson(
            "{\"action\":\"delete\",\"index\":\"a\",\"id\":\"1\"}\n{\"action\":\"upsert\"}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn after_images_merge_as_elasticsearch() {
        let stored = json!({"a": 1, "o": {"x": 1}, "zkguard": {"token": 5, "op": "x"}});
        let op = TxnOp::update("i", "1", json!({"o": {"y": 2}}));
        assert_eq!(
            after_image(&op, Some(&stored)).unwrap(),
            Some(json!({"a": 1, "o": {"x": 1, "y": 2}}))
        );
        assert!(after_image(&op, None).unwrap_err().contains("upsert"));
        assert_eq!(
            after_image(&op.clone().upsert(), None).unwrap(),
            Some(json!({"o": {"y": 2}}))
        );
        assert_eq!(
            after_image(&TxnOp::delete("i", "1"), Some(&stored)).unwrap(),
            None
        );
        let marked = stamped(
            DEFAULT_OPS_WINDOW,
            Some(json!({"a": 1})),
            Some(&stored),
            &op_id("t", 0, false),
            9,
            Some("t"),
        );
        assert!(super::super::record::marked_by(&marked, "t"));
        assert_eq!(marked["zkguard"]["token"], 9);
        let other =
            json!({"a": 1, "zkguard": {"token": 5, "op": "x", "deleted": true, "txn": "t2"}});
        assert_eq!(
            rewritten(&other, 9),
            json!({"a": 1, "zkguard": {"token": 9, "op": "x", "ops": [], "deleted": true, "txn": "t2"}})
        );
        let tomb = stamped(
            DEFAULT_OPS_WINDOW,
            None,
            Some(&stored),
            &op_id("t", 0, false),
            9,
            Some("t"),
        );
        assert_eq!(tomb["zkguard"]["deleted"], true);
    }
}
