//! Which Elasticsearch API a request calls, as far as the gate cares: the document writes it
//! guards, the writes by query it refuses on guarded indices, and everything else.

use axum::http::Method;

/// A single-document write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocOp {
    /// `PUT|POST /{index}/_doc/{id}`.
    Index,
    /// `PUT|POST /{index}/_create/{id}`, or `_doc/{id}?op_type=create`.
    Create,
    /// `POST /{index}/_update/{id}`.
    Update,
    /// `DELETE /{index}/_doc/{id}`.
    Delete,
}

impl DocOp {
    /// The name Elasticsearch gives the operation (`_bulk` action, metrics label).
    pub fn name(self) -> &'static str {
        match self {
            DocOp::Index => "index",
            DocOp::Create => "create",
            DocOp::Update => "update",
            DocOp::Delete => "delete",
        }
    }
}

/// What a request is, to the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A single-document write.
    Doc {
        /// Which.
        op: DocOp,
        /// The target as given (an index, alias or data stream).
        index: String,
        /// Document id, decoded.
        id: String,
    },
    /// `POST /{index}/_doc` (or `PUT`): a new document with an id Elasticsearch picks.
    AutoId {
        /// The target as given.
        index: String,
    },
    /// `/_bulk` or `/{index}/_bulk`.
    Bulk {
        /// The path's default index.
        index: Option<String>,
    },
    /// `_update_by_query` or `_delete_by_query` on `targets` (comma-separated, as given).
    ByQuery {
        /// `_update_by_query` or `_delete_by_query`.
        api: &'static str,
        /// The targets.
        targets: String,
    },
    /// `POST /_reindex`: its destination is in the body.
    Reindex,
    /// Everything else: passed through.
    Pass,
}

/// Percent-decodes one path segment.
fn decode(segment: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", segment.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The query string's parameters, decoded.
pub fn params(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// Classifies a request by method, path and query parameters.
pub fn classify(method: &Method, path: &str, params: &[(String, String)]) -> Route {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let write = matches!(*method, Method::PUT | Method::POST);
    let op_type_create = params
        .iter()
        .any(|(k, v)| k == "op_type" && v.eq_ignore_ascii_case("create"));
    match segments.as_slice() {
        ["_bulk"] if write => Route::Bulk { index: None },
        ["_reindex"] if *method == Method::POST => Route::Reindex,
        [index, "_bulk"] if write && !index.starts_with('_') => Route::Bulk {
            index: Some(decode(index)),
        },
        [index, api @ ("_update_by_query" | "_delete_by_query")]
            if *method == Method::POST && !index.starts_with('_') =>
        {
            Route::ByQuery {
                api: if *api == "_update_by_query" {
                    "_update_by_query"
                } else {
                    "_delete_by_query"
                },
                targets: decode(index),
            }
        }
        [index, "_doc"] if write && !index.starts_with('_') => Route::AutoId {
            index: decode(index),
        },
        [index, kind @ ("_doc" | "_create" | "_update"), id]
            if !index.starts_with('_') && !id.is_empty() =>
        {
            let op = match (*kind, method) {
                ("_doc", &Method::PUT | &Method::POST) if op_type_create => DocOp::Create,
                ("_doc", &Method::PUT | &Method::POST) => DocOp::Index,
                ("_doc", &Method::DELETE) => DocOp::Delete,
                ("_create", &Method::PUT | &Method::POST) => DocOp::Create,
                ("_update", &Method::POST) => DocOp::Update,
                _ => return Route::Pass,
            };
            Route::Doc {
                op,
                index: decode(index),
                id: decode(id),
            }
        }
        _ => Route::Pass,
    }
}

/// Whether `path` has a `.` or `..` segment (percent-encoded or not): the gate's HTTP client
/// resolves such a segment, so the request cannot be passed on unchanged.
pub fn has_dot_segment(path: &str) -> bool {
    path.split('/')
        .any(|s| matches!(decode(s).as_str(), "." | ".."))
}

/// Whether a target names several indices or a pattern (`a,b`, `logs-*`, `_all`).
pub fn is_multi_target(target: &str) -> bool {
    target.contains(',') || target.contains('*') || target == "_all"
}

/// Whether a passed-through request may change which indices aliases point to: the alias
/// APIs, creating or deleting an index (a new index can name aliases), rollover, clone, split,
/// shrink, snapshot restore and data streams.
pub fn may_change_aliases(method: &Method, path: &str) -> bool {
    if matches!(*method, Method::GET | Method::HEAD) {
        return false;
    }
    let segments: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segments.as_slice() {
        [one] => !one.starts_with('_') || *one == "_aliases",
        _ => segments.iter().any(|s| {
            matches!(
                *s,
                "_alias"
                    | "_aliases"
                    | "_rollover"
                    | "_clone"
                    | "_split"
                    | "_shrink"
                    | "_restore"
                    | "_data_stream"
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: Method, path: &str, query: &str) -> Route {
        classify(&method, path, &params(Some(query)))
    }

    #[test]
    fn document_writes_are_told_apart() {
        let doc = |op, index: &str, id: &str| Route::Doc {
            op,
            index: index.into(),
            id: id.into(),
        };
        assert_eq!(
            route(Method::PUT, "/a/_doc/1", ""),
            doc(DocOp::Index, "a", "1")
        );
        assert_eq!(
            route(Method::POST, "/a/_doc/1", ""),
            doc(DocOp::Index, "a", "1")
        );
        assert_eq!(
            route(Method::PUT, "/a/_doc/1", "op_type=create&refresh=true"),
            doc(DocOp::Create, "a", "1")
        );
        assert_eq!(
            route(Method::PUT, "/a/_doc/1", "op_type=CREATE"),
            doc(DocOp::Create, "a", "1"),
            "op_type is read in any case, as Elasticsearch reads it"
        );
        assert_eq!(
            route(Method::PUT, "/a/_create/1", ""),
            doc(DocOp::Create, "a", "1")
        );
        assert_eq!(
            route(Method::POST, "/a/_update/1", ""),
            doc(DocOp::Update, "a", "1")
        );
        assert_eq!(
            route(Method::DELETE, "/a/_doc/1", ""),
            doc(DocOp::Delete, "a", "1")
        );
        assert_eq!(
            route(Method::PUT, "/a/_doc/docs%2Fx%20y", ""),
            doc(DocOp::Index, "a", "docs/x y")
        );
        assert_eq!(
            route(Method::POST, "/a/_doc", ""),
            Route::AutoId { index: "a".into() }
        );
    }

    #[test]
    fn dot_segments_are_found_in_every_spelling() {
        for p in [
            "/a/_doc/.",
            "/a/_doc/..",
            "/a/_doc/%2e",
            "/a/_doc/%2E%2e",
            "/./a",
        ] {
            assert!(has_dot_segment(p), "{p}");
        }
        for p in [
            "/a/_doc/...",
            "/a/_doc/.x",
            "/a/_doc/x.",
            "/.kibana/_doc/1",
            "/",
        ] {
            assert!(!has_dot_segment(p), "{p}");
        }
    }

    #[test]
    fn reads_and_cluster_apis_pass() {
        for (m, p) in [
            (Method::GET, "/a/_doc/1"),
            (Method::HEAD, "/a/_doc/1"),
            (Method::GET, "/a/_search"),
            (Method::POST, "/a/_search"),
            (Method::GET, "/_cat/indices"),
            (Method::PUT, "/a"),
            (Method::PUT, "/a/_mapping"),
            (Method::GET, "/_mget"),
            (Method::GET, "/"),
            (Method::GET, "/a/_update/1"),
        ] {
            assert_eq!(route(m.clone(), p, ""), Route::Pass, "{m} {p}");
        }
    }

    #[test]
    fn bulk_and_writes_by_query_are_found() {
        assert_eq!(
            route(Method::POST, "/_bulk", ""),
            Route::Bulk { index: None }
        );
        assert_eq!(
            route(Method::PUT, "/a/_bulk", ""),
            Route::Bulk {
                index: Some("a".into())
            }
        );
        assert_eq!(
            route(Method::POST, "/a,b/_update_by_query", ""),
            Route::ByQuery {
                api: "_update_by_query",
                targets: "a,b".into()
            }
        );
        assert_eq!(route(Method::POST, "/_reindex", ""), Route::Reindex);
        assert!(is_multi_target("a,b") && is_multi_target("a*") && !is_multi_target("a"));
    }

    #[test]
    fn alias_changes_are_told_from_other_requests() {
        for (m, p) in [
            (Method::POST, "/_aliases"),
            (Method::PUT, "/a"),
            (Method::DELETE, "/a"),
            (Method::PUT, "/a/_alias/b"),
            (Method::DELETE, "/a/_aliases/b"),
            (Method::POST, "/a/_rollover"),
            (Method::POST, "/_snapshot/r/s/_restore"),
        ] {
            assert!(may_change_aliases(&m, p), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, "/_aliases"),
            (Method::PUT, "/a/_mapping"),
            (Method::POST, "/a/_search"),
            (Method::POST, "/_bulk"),
            (Method::POST, "/a/_doc"),
        ] {
            assert!(!may_change_aliases(&m, p), "{m} {p}");
        }
    }
}
