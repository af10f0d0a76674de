//! zkguard's own object (`zkguard`, the stamp of the library's writes and the mark of a
//! document transaction) in the documents written through the gate.
//!
//! No client writes it through the gate: a read-modify-write client that read the document
//! straight from the cluster sends it back, and a transaction's mark sent back so would make
//! that transaction's recovery take the client's document for the transaction's write. So the
//! gate drops `zkguard` from every source it is sent (an index, a create, a `_bulk` line, an
//! update's `doc` and `upsert`), and an update never carries a mark of the stored document
//! over (the mark is decided first: `single::settled`).

use axum::body::Bytes;
use serde_json::{Map, Value};
use zkguard::write::ops::META_FIELD;

/// `body` without a top-level `zkguard` field: as sent when it has none (or is not a JSON
/// object: the cluster answers that).
pub fn client_source(body: &Bytes) -> Bytes {
    if !may_hold_meta(body) {
        return body.clone();
    }
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(body) else {
        return body.clone();
    };
    if map.remove(META_FIELD).is_none() {
        return body.clone();
    }
    serde_json::to_vec(&map).map_or_else(|_| body.clone(), Bytes::from)
}

/// An `_update` body (or `_bulk` update line) without `zkguard` in its `doc` and `upsert`.
pub fn strip_update(map: &mut Map<String, Value>) {
    for key in ["doc", "upsert"] {
        if let Some(Value::Object(part)) = map.get_mut(key) {
            part.remove(META_FIELD);
        }
    }
}

/// Removes any transaction mark left in the stamp of `source` (a document read under the lock,
/// its mark decided), so that an update built on it does not carry one over.
pub fn unmark(source: &mut Value) {
    if let Some(Value::Object(stamp)) = source.get_mut(META_FIELD) {
        stamp.remove("txn");
    }
}

/// Whether `body` may name the field: its name, or an escape that could spell it.
fn may_hold_meta(body: &[u8]) -> bool {
    let name = META_FIELD.as_bytes();
    body.windows(name.len()).any(|w| w == name) || body.windows(2).any(|w| w == b"\\u")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn client_sources_lose_zkguard_only() {
        let sent = Bytes::from_static(br#"{"a":1,"zkguard":{"token":5,"op":"x","txn":"t"}}"#);
        let kept: Value = serde_json::from_slice(&client_source(&sent)).unwrap();
        assert_eq!(kept, json!({"a": 1}));
        let escaped = Bytes::from_static(br#"{"a":1,"zk\u0067uard":{"txn":"t"}}"#);
        let kept: Value = serde_json::from_slice(&client_source(&escaped)).unwrap();
        assert_eq!(kept, json!({"a": 1}));
        for same in [
            &br#"{"a":"zkguard"}"#[..],
            br#"{"nested":{"zkguard":1}}"#,
            b"not json",
        ] {
            let b = Bytes::copy_from_slice(same);
            assert_eq!(client_source(&b), b);
        }
    }

    #[test]
    fn updates_and_stored_documents_lose_the_mark() {
        let mut body = json!({"doc": {"a": 1, "zkguard": {"txn": "t"}}, "upsert": {"zkguard": {}}});
        strip_update(body.as_object_mut().unwrap());
        assert_eq!(body, json!({"doc": {"a": 1}, "upsert": {}}));
        let mut source = json!({"a": 1, "zkguard": {"token": 5, "op": "x", "txn": "t"}});
        unmark(&mut source);
        assert_eq!(source, json!({"a": 1, "zkguard": {"token": 5, "op": "x"}}));
    }
}
