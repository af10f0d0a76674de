//! The URL parameters of the guarded single-document routes (index, create, update, delete):
//! which ones Elasticsearch takes on each route (its rest-api-spec, `_common.json` included),
//! what the gate does with each (honours it itself, passes it on to the fenced write, or
//! refuses it), and the errors Elasticsearch answers for a bad one. `docs/gateway.md` has the
//! same table for users.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value};

use super::merge::filter_path;
use super::reply::{Dress, GateError};
use super::route::DocOp;

/// Parameters every Elasticsearch API takes (`_common.json`).
const COMMON: &[&str] = &[
    "pretty",
    "human",
    "error_trace",
    "filter_path",
    "source",
    "source_content_type",
];
/// `index.json` (and `create.json`: the `_create` route is the index handler with
/// `op_type=create`, so it takes the same parameters).
const INDEX: &[&str] = &[
    "if_seq_no",
    "if_primary_term",
    "include_source_on_error",
    "op_type",
    "pipeline",
    "refresh",
    "require_alias",
    "require_data_stream",
    "routing",
    "timeout",
    "version",
    "version_type",
    "wait_for_active_shards",
];
/// `update.json`.
const UPDATE: &[&str] = &[
    "if_seq_no",
    "if_primary_term",
    "include_source_on_error",
    "lang",
    "refresh",
    "require_alias",
    "retry_on_conflict",
    "routing",
    "timeout",
    "wait_for_active_shards",
    "_source",
    "_source_excludes",
    "_source_includes",
];
/// `delete.json`.
const DELETE: &[&str] = &[
    "if_seq_no",
    "if_primary_term",
    "refresh",
    "routing",
    "timeout",
    "version",
    "version_type",
    "wait_for_active_shards",
];
/// Passed on to the fenced write as given: Elasticsearch applies them there.
const FORWARD: &[&str] = &[
    "human",
    "error_trace",
    "include_source_on_error",
    "pipeline",
    "refresh",
    "routing",
    "timeout",
    "wait_for_active_shards",
];

/// The parameters Elasticsearch takes on `op`'s route.
pub fn accepted(op: DocOp) -> impl Iterator<Item = &'static str> {
    let own = match op {
        DocOp::Index | DocOp::Create => INDEX,
        DocOp::Update => UPDATE,
        DocOp::Delete => DELETE,
    };
    COMMON.iter().chain(own).copied()
}

/// How an answer the gate makes itself is shaped: `pretty` and `filter_path`.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    pretty: bool,
    filter_path: Option<String>,
}

impl Shape {
    /// The shape `params` ask for.
    pub fn of(params: &[(String, String)]) -> Self {
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        Self {
            pretty: get("pretty").is_some_and(|v| v != "false"),
            filter_path: get("filter_path")
                .filter(|f| !f.trim().is_empty())
                .map(str::to_string),
        }
    }

    /// A JSON answer, filtered and printed as asked.
    pub fn json(&self, dress: &Dress, status: StatusCode, body: &Value) -> Response {
        let body = match &self.filter_path {
            Some(f) => filter_path(body.clone(), f),
            None => body.clone(),
        };
        let bytes = if self.pretty {
            serde_json::to_vec_pretty(&body)
        } else {
            serde_json::to_vec(&body)
        };
        dress.bytes(status, bytes.unwrap_or_default())
    }

    /// An error in Elasticsearch's shape, printed as asked (Elasticsearch never filters an
    /// error with `filter_path`).
    pub fn error(&self, dress: &Dress, e: &GateError) -> Response {
        let whole = Self {
            pretty: self.pretty,
            filter_path: None,
        };
        let mut response = whole.json(dress, e.status, &e.body());
        if let Some(s) = e.retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        response
    }
}

/// Which part of a stored document an `_update` answer returns under `get` (Elasticsearch's
/// `FetchSourceContext`): none (`fetch` false), or `_source` filtered by `includes` and
/// `excludes` (dotted field paths, `*` wildcards).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SourceFilter {
    /// Whether the source is returned at all.
    pub fetch: bool,
    /// Fields to keep (all when empty).
    pub includes: Vec<String>,
    /// Fields to drop.
    pub excludes: Vec<String>,
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl SourceFilter {
    /// The whole source.
    pub fn all() -> Self {
        Self {
            fetch: true,
            ..Self::default()
        }
    }

    /// From `_source`, `_source_includes` and `_source_excludes`; `None` when none is given.
    pub fn from_params(params: &[(String, String)]) -> Option<Self> {
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let (source, includes, excludes) = (
            get("_source"),
            get("_source_includes"),
            get("_source_excludes"),
        );
        if source.is_none() && includes.is_none() && excludes.is_none() {
            return None;
        }
        let mut filter = Self::all();
        match source {
            Some("false") => filter.fetch = false,
            Some("true") | None => {}
            Some(fields) => filter.includes = list(fields),
        }
        if let Some(i) = includes {
            filter.includes = list(i);
        }
        if let Some(e) = excludes {
            filter.excludes = list(e);
        }
        Some(filter)
    }

    /// From an `_update` body's `_source`: a boolean, a field, a list of fields, or an object
    /// with `includes`/`excludes` (or `include`/`exclude`).
    ///
    /// # Errors
    /// 400 `x_content_parse_exception` for anything else.
    pub fn from_body(value: &Value) -> Result<Self, GateError> {
        let bad = || {
            GateError::new(
                StatusCode::BAD_REQUEST,
                "x_content_parse_exception",
                "[UpdateRequest] failed to parse field [_source]: a boolean, a field name, a list of field names, or an object with `includes` and `excludes` is expected",
            )
        };
        let names = |v: &Value| -> Result<Vec<String>, GateError> {
            match v {
                Value::String(s) => Ok(vec![s.clone()]),
                Value::Array(items) => items
                    .iter()
                    .map(|i| i.as_str().map(str::to_string).ok_or_else(bad))
                    .collect(),
                _ => Err(bad()),
            }
        };
        let mut filter = Self::all();
        match value {
            Value::Bool(b) => filter.fetch = *b,
            Value::String(_) | Value::Array(_) => filter.includes = names(value)?,
            Value::Object(m) => {
                for (k, v) in m {
                    match k.as_str() {
                        "includes" | "include" => filter.includes = names(v)?,
                        "excludes" | "exclude" => filter.excludes = names(v)?,
                        _ => return Err(bad()),
                    }
                }
            }
            _ => return Err(bad()),
        }
        Ok(filter)
    }

    /// `source` filtered.
    pub fn apply(&self, source: &Value) -> Value {
        match source {
            Value::Object(m) if !self.includes.is_empty() || !self.excludes.is_empty() => {
                Value::Object(self.object(m, ""))
            }
            other => other.clone(),
        }
    }

    fn object(&self, map: &Map<String, Value>, prefix: &str) -> Map<String, Value> {
        let mut out = Map::new();
        for (key, value) in map {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if self.excludes.iter().any(|p| glob(p, &path)) {
                continue;
            }
            let whole = self.includes.is_empty() || self.includes.iter().any(|p| glob(p, &path));
            let below = whole || self.includes.iter().any(|p| may_match_below(p, &path));
            if let Some(v) = self.value(value, &path, whole, below) {
                out.insert(key.clone(), v);
            }
        }
        out
    }

    fn value(&self, value: &Value, path: &str, whole: bool, below: bool) -> Option<Value> {
        let narrowed = Self {
            fetch: true,
            includes: if whole {
                Vec::new()
            } else {
                self.includes.clone()
            },
            excludes: self.excludes.clone(),
        };
        match value {
            Value::Object(m) if below => {
                let kept = narrowed.object(m, path);
                (whole || !kept.is_empty()).then_some(Value::Object(kept))
            }
            Value::Array(items) if below => {
                let kept: Vec<Value> = items
                    .iter()
                    .filter_map(|i| narrowed.value(i, path, whole, below))
                    .collect();
                (whole || !kept.is_empty()).then_some(Value::Array(kept))
            }
            _ => whole.then(|| value.clone()),
        }
    }
}

/// Whether `pattern` (`*` for any run of characters) matches all of `text`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len())
                .filter(|i| tail.is_char_boundary(*i))
                .any(|i| glob(rest, &tail[i..]))
        }
    }
}

/// Whether `pattern` can match a field below the object at `path`.
fn may_match_below(pattern: &str, path: &str) -> bool {
    let inner = format!("{path}.");
    match pattern.split_once('*') {
        None => pattern.starts_with(&inner),
        Some((head, _)) => head.starts_with(&inner) || inner.starts_with(head),
    }
}

/// The parameters of a guarded single-document write, checked as Elasticsearch checks them.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// `if_seq_no`, when given (and not Elasticsearch's "unassigned", -2).
    pub if_seq_no: Option<i64>,
    /// `if_primary_term`, when given (and not 0, "unassigned").
    pub if_primary_term: Option<i64>,
    /// What the fenced write carries, as given.
    pub forward: Vec<(String, String)>,
    /// `_source`, `_source_includes`, `_source_excludes` of an update.
    pub source: Option<SourceFilter>,
    /// `require_alias=true`.
    pub require_alias: bool,
    /// `require_data_stream=true`.
    pub require_data_stream: bool,
    /// `retry_on_conflict`.
    pub retry_on_conflict: i64,
    /// `source`: the body, given in the query string.
    pub body: Option<String>,
}

/// Elasticsearch's 400 `illegal_argument_exception` for parameters its handler does not take.
fn unrecognized(path: &str, names: &[&str]) -> GateError {
    let listed: Vec<String> = names.iter().map(|n| format!("[{n}]")).collect();
    GateError::refused(format!(
        "request [{path}] contains unrecognized parameter{}: {}",
        if names.len() > 1 { "s" } else { "" },
        listed.join(", ")
    ))
}

/// Elasticsearch's 400 `action_request_validation_exception` listing `errors`.
pub fn validation(errors: &[String]) -> GateError {
    let listed: String = errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}: {e};", i + 1))
        .collect();
    GateError::new(
        StatusCode::BAD_REQUEST,
        "action_request_validation_exception",
        format!("Validation Failed: {listed}"),
    )
}

fn long(key: &str, value: &str) -> Result<i64, GateError> {
    value.trim().parse().map_err(|_| {
        GateError::refused(format!(
            "Failed to parse long parameter [{key}] with value [{value}]"
        ))
    })
}

fn boolean(value: &str) -> Result<bool, GateError> {
    match value {
        "" | "false" => Ok(false),
        "true" => Ok(true),
        other => Err(GateError::refused(format!(
            "Failed to parse value [{other}] as only [true] or [false] are allowed."
        ))),
    }
}

/// The path Elasticsearch names in its errors about the request.
fn path_of(op: DocOp, index: &str, id: &str, params: &[(String, String)]) -> String {
    let kind = match op {
        DocOp::Update => "_update",
        DocOp::Create if !params.iter().any(|(k, _)| k == "op_type") => "_create",
        _ => "_doc",
    };
    format!("/{index}/{kind}/{id}")
}

/// Checks `params` of `op` on `index`/`id` as Elasticsearch's REST handler and request
/// validation do, and sorts them: what the gate honours itself, what the fenced write
/// carries.
///
/// # Errors
/// Elasticsearch's error for a parameter it does not take on the route or a value it cannot
/// parse; the gate's refusal of `version`/`version_type` (the version is the lock's token).
pub fn check(
    op: DocOp,
    index: &str,
    id: &str,
    params: &[(String, String)],
) -> Result<Checked, GateError> {
    if op == DocOp::Update {
        if let Some((k, _)) = params
            .iter()
            .find(|(k, _)| k == "version" || k == "version_type")
        {
            return Err(version_refused(op, k));
        }
    }
    let unknown: Vec<&str> = params
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !accepted(op).any(|a| a == *k))
        .collect();
    if !unknown.is_empty() {
        return Err(unrecognized(&path_of(op, index, id, params), &unknown));
    }
    let mut c = Checked::default();
    for (k, v) in params {
        match k.as_str() {
            "version" | "version_type" => return Err(version_refused(op, k)),
            "if_seq_no" => c.if_seq_no = seq_no(v)?,
            "if_primary_term" => c.if_primary_term = primary_term(v)?,
            "op_type" => op_type(op, v)?,
            "refresh" => refresh(v)?,
            "require_alias" => c.require_alias = boolean(v)?,
            "require_data_stream" => c.require_data_stream = boolean(v)?,
            "retry_on_conflict" => {
                c.retry_on_conflict = v.trim().parse().map_err(|_| {
                    GateError::refused(format!(
                        "Failed to parse int parameter [retry_on_conflict] with value [{v}]"
                    ))
                })?
            }
            "source" => c.body = Some(v.clone()),
            "source_content_type" if op == DocOp::Update => json_media_type(v)?,
            _ => {}
        }
        let forwarded = FORWARD.contains(&k.as_str())
            || (op != DocOp::Update && matches!(k.as_str(), "pretty" | "filter_path"));
        if forwarded {
            c.forward.push((k.clone(), v.clone()));
        }
    }
    if op == DocOp::Update {
        c.source = SourceFilter::from_params(params);
    } else if op == DocOp::Create && (c.if_seq_no.is_some() || c.if_primary_term.is_some()) {
        return Err(validation(&[
            "create operations do not support compare and set. use index instead".into(),
        ]));
    } else {
        let errors = cas_errors(c.if_seq_no, c.if_primary_term);
        if !errors.is_empty() {
            return Err(validation(&errors));
        }
    }
    Ok(c)
}

/// `version`/`version_type` on `op`: the gate refuses them where Elasticsearch takes them
/// (index, create, delete); `_update` never takes them, and is answered as Elasticsearch does.
fn version_refused(op: DocOp, key: &str) -> GateError {
    if op == DocOp::Update {
        return validation(&["internal versioning can not be used for optimistic concurrency control. Please use `if_seq_no` and `if_primary_term` instead".into()]);
    }
    GateError::refused(format!(
        "zkguard: [{key}] is refused on a guarded index: the document's version is the fencing token of the writer's lock; drop {key} (use if_seq_no and if_primary_term for optimistic concurrency)"
    ))
}

fn seq_no(v: &str) -> Result<Option<i64>, GateError> {
    match long("if_seq_no", v)? {
        -2 => Ok(None),
        n if n < 0 => Err(GateError::refused(format!(
            "sequence numbers must be non negative. got [{n}]."
        ))),
        n => Ok(Some(n)),
    }
}

fn primary_term(v: &str) -> Result<Option<i64>, GateError> {
    match long("if_primary_term", v)? {
        0 => Ok(None),
        n if n < 0 => Err(GateError::refused(format!(
            "primary term must be non negative. got [{n}]"
        ))),
        n => Ok(Some(n)),
    }
}

fn op_type(op: DocOp, v: &str) -> Result<(), GateError> {
    let lower = v.to_ascii_lowercase();
    match op {
        DocOp::Create if lower != "create" => Err(GateError::refused(format!(
            "opType must be 'create', found: [{v}]"
        ))),
        _ if lower != "create" && lower != "index" => Err(GateError::refused(format!(
            "opType must be 'create' or 'index', found: [{v}]"
        ))),
        _ => Ok(()),
    }
}

fn refresh(v: &str) -> Result<(), GateError> {
    match v {
        "" | "true" | "false" | "wait_for" => Ok(()),
        other => Err(GateError::refused(format!(
            "Unknown value for refresh: [{other}]."
        ))),
    }
}

fn json_media_type(v: &str) -> Result<(), GateError> {
    let essence = v.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json") {
        return Ok(());
    }
    Err(GateError::refused(format!(
        "zkguard: [source_content_type] [{v}] is refused on a guarded write: the gate reads JSON bodies only; send the body as application/json"
    )))
}

/// Elasticsearch's validation of `if_seq_no` and `if_primary_term` given apart.
pub fn cas_errors(seq: Option<i64>, term: Option<i64>) -> Vec<String> {
    match (seq, term) {
        (Some(_), None) => vec!["ifSeqNo is set, but primary term is [0]".into()],
        (None, Some(t)) => vec![format!("ifSeqNo is unassigned, but primary term is [{t}]")],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn source_filters_keep_and_drop_dotted_paths_as_elasticsearch_does() {
        let doc = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [{"f": 1, "g": 2}], "h": {"i": 1}});
        let filter = |i: &[&str], e: &[&str]| SourceFilter {
            fetch: true,
            includes: i.iter().map(|s| s.to_string()).collect(),
            excludes: e.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            filter(&["a", "b.c"], &[]).apply(&doc),
            json!({"a": 1, "b": {"c": 2}})
        );
        assert_eq!(filter(&["b"], &["b.d"]).apply(&doc), json!({"b": {"c": 2}}));
        assert_eq!(filter(&["e.f"], &[]).apply(&doc), json!({"e": [{"f": 1}]}));
        assert_eq!(
            filter(&["b.*"], &[]).apply(&doc),
            json!({"b": {"c": 2, "d": 3}})
        );
        assert_eq!(filter(&["*"], &["h.i"]).apply(&doc)["h"], json!({}));
        assert_eq!(filter(&["x"], &[]).apply(&doc), json!({}));
        assert_eq!(SourceFilter::all().apply(&doc), doc);
    }

    #[test]
    fn source_parameters_and_body_source_are_read_as_elasticsearch_reads_them() {
        assert_eq!(SourceFilter::from_params(&p(&[("refresh", "true")])), None);
        assert_eq!(
            SourceFilter::from_params(&p(&[("_source", "a,b")]))
                .unwrap()
                .includes,
            vec!["a", "b"]
        );
        assert!(
            !SourceFilter::from_params(&p(&[("_source", "false")]))
                .unwrap()
                .fetch
        );
        let f = SourceFilter::from_body(&json!({"includes": ["a"], "exclude": "b"})).unwrap();
        assert_eq!(
            (f.includes, f.excludes),
            (vec!["a".to_string()], vec!["b".to_string()])
        );
        assert!(SourceFilter::from_body(&json!(7)).is_err());
    }

    #[test]
    fn parameters_are_sorted_or_refused_as_elasticsearch_does() {
        let e = check(
            DocOp::Update,
            "i",
            "1",
            &p(&[("pipeline", "x"), ("foo", "")]),
        )
        .unwrap_err();
        assert_eq!(
            e.reason,
            "request [/i/_update/1] contains unrecognized parameters: [pipeline], [foo]"
        );
        let c = check(
            DocOp::Index,
            "i",
            "1",
            &p(&[
                ("refresh", "true"),
                ("pipeline", "p"),
                ("filter_path", "result"),
                ("require_alias", "true"),
            ]),
        )
        .unwrap();
        assert!(c.require_alias);
        assert_eq!(
            c.forward,
            p(&[
                ("refresh", "true"),
                ("pipeline", "p"),
                ("filter_path", "result")
            ])
        );
        let e = check(
            DocOp::Create,
            "i",
            "1",
            &p(&[("if_seq_no", "1"), ("if_primary_term", "1")]),
        )
        .unwrap_err();
        assert_eq!(e.kind, "action_request_validation_exception");
        let e = check(DocOp::Create, "i", "1", &p(&[("op_type", "index")])).unwrap_err();
        assert_eq!(e.reason, "opType must be 'create', found: [index]");
        let e = check(DocOp::Delete, "i", "1", &p(&[("if_seq_no", "1")])).unwrap_err();
        assert!(
            e.reason.contains("ifSeqNo is set, but primary term is [0]"),
            "{}",
            e.reason
        );
        assert!(check(DocOp::Update, "i", "1", &p(&[("refresh", "bogus")])).is_err());
    }
}
