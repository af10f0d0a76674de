//! Elasticsearch's semantics the gate reproduces on its own: how `_update` merges a partial
//! document, and how `filter_path` trims an answer.

use serde_json::{Map, Value};

pub use zkguard::es::merge_partial as merge;

/// Applies Elasticsearch's `filter_path` (comma-separated dotted paths, `*` for any one key,
/// `**` for any depth, a leading `-` to exclude) to an answer.
pub fn filter_path(value: Value, filter: &str) -> Value {
    let (exclude, include): (Vec<&str>, Vec<&str>) = filter
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .partition(|p| p.starts_with('-'));
    let split = |p: &str| -> Vec<String> {
        p.trim_start_matches('-')
            .split('.')
            .map(str::to_string)
            .collect()
    };
    let mut value = value;
    if !include.is_empty() {
        let patterns: Vec<Vec<String>> = include.iter().map(|p| split(p)).collect();
        let refs: Vec<&[String]> = patterns.iter().map(Vec::as_slice).collect();
        value = keep(&value, &refs).unwrap_or_else(|| Value::Object(Map::new()));
    }
    for p in exclude {
        let pattern = split(p);
        drop_matching(&mut value, &pattern);
    }
    value
}

fn matches(pattern: &str, key: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == key,
        Some((head, tail)) => {
            key.len() >= head.len() + tail.len() && key.starts_with(head) && key.ends_with(tail)
        }
    }
}

/// The part of `value` that the patterns (each the rest of a path) select.
fn keep(value: &Value, patterns: &[&[String]]) -> Option<Value> {
    match value {
        Value::Array(items) => {
            let kept: Vec<Value> = items.iter().filter_map(|v| keep(v, patterns)).collect();
            (!kept.is_empty()).then_some(Value::Array(kept))
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, child) in map {
                let mut next: Vec<&[String]> = Vec::new();
                let mut whole = false;
                for p in patterns {
                    let Some((first, rest)) = p.split_first() else {
                        continue;
                    };
                    if first == "**" {
                        // `**` matches this key and keeps applying below it.
                        next.push(p);
                        if let Some((after, rest_after)) = rest.split_first() {
                            if matches(after, key) {
                                if rest_after.is_empty() {
                                    whole = true;
                                } else {
                                    next.push(rest_after);
                                }
                            }
                        } else {
                            whole = true;
                        }
                    } else if matches(first, key) {
                        if rest.is_empty() {
                            whole = true;
                        } else {
                            next.push(rest);
                        }
                    }
                }
                if whole {
                    out.insert(key.clone(), child.clone());
                } else if !next.is_empty() {
                    if let Some(v) = keep(child, &next) {
                        out.insert(key.clone(), v);
                    }
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => None,
    }
}

fn drop_matching(value: &mut Value, pattern: &[String]) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|v| drop_matching(v, pattern)),
        Value::Object(map) => {
            let Some((first, rest)) = pattern.split_first() else {
                return;
            };
            let keys: Vec<String> = map.keys().filter(|k| matches(first, k)).cloned().collect();
            for k in keys {
                if rest.is_empty() {
                    map.remove(&k);
                } else if let Some(child) = map.get_mut(&k) {
                    drop_matching(child, rest);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_partial_doc_merges_objects_and_replaces_the_rest() {
        let mut stored = json!({"a": 1, "o": {"x": 1, "y": 2}, "l": [1, 2], "k": "v"});
        let changes = json!({"o": {"x": 5}, "l": [3], "n": null, "k": "v"});
        let changed = merge(
            stored.as_object_mut().unwrap(),
            changes.as_object().unwrap(),
        );
        assert!(changed);
        assert_eq!(
            stored,
            json!({"a": 1, "o": {"x": 5, "y": 2}, "l": [3], "k": "v", "n": null})
        );
        let again = merge(
            stored.as_object_mut().unwrap(),
            changes.as_object().unwrap(),
        );
        assert!(!again, "the same change twice is a noop");
    }

    #[test]
    fn filter_path_keeps_and_drops_as_elasticsearch_does() {
        let answer = json!({"took": 3, "errors": true, "items": [
            {"index": {"_id": "1", "status": 201}},
            {"index": {"_id": "2", "status": 429, "error": {"type": "x"}}}
        ]});
        assert_eq!(
            filter_path(answer.clone(), "items.*.error"),
            json!({"items": [{"index": {"error": {"type": "x"}}}]})
        );
        assert_eq!(
            filter_path(answer.clone(), "errors,items.*._id"),
            json!({"errors": true, "items": [{"index": {"_id": "1"}}, {"index": {"_id": "2"}}]})
        );
        assert_eq!(
            filter_path(answer.clone(), "**.status"),
            json!({"items": [{"index": {"status": 201}}, {"index": {"status": 429}}]})
        );
        let without = filter_path(answer.clone(), "-took,-items");
        assert_eq!(without, json!({"errors": true}));
        assert_eq!(filter_path(answer, "nothing"), json!({}));
    }
}
