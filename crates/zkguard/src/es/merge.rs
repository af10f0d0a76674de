//! How Elasticsearch's `_update` merges a partial document, reproduced so that zkguard can
//! compute a document's new source itself (no script runs on the cluster).

use serde_json::{Map, Value};

/// Merges `changes` into `target` as Elasticsearch's `_update` merges a partial `doc`: objects
/// are merged key by key, recursively; anything else (arrays, scalars, `null`) replaces the
/// stored value. Returns whether anything changed (what `detect_noop` looks at).
///
/// ```
/// use serde_json::json;
/// let mut stored = json!({"a": 1, "o": {"x": 1, "y": 2}, "l": [1, 2]});
/// let changed = zkguard::es::merge_partial(
///     stored.as_object_mut().unwrap(),
///     json!({"o": {"y": 3}, "l": [9], "n": null}).as_object().unwrap(),
/// );
/// assert!(changed);
/// assert_eq!(stored, json!({"a": 1, "o": {"x": 1, "y": 3}, "l": [9], "n": null}));
/// ```
pub fn merge_partial(target: &mut Map<String, Value>, changes: &Map<String, Value>) -> bool {
    let mut changed = false;
    for (key, new) in changes {
        match (target.get_mut(key), new) {
            (Some(Value::Object(old)), Value::Object(new)) => changed |= merge_partial(old, new),
            (Some(old), new) => {
                if old != new {
                    *old = new.clone();
                    changed = true;
                }
            }
            (None, new) => {
                target.insert(key.clone(), new.clone());
                changed = true;
            }
        }
    }
    changed
}
