//! Reading a `_bulk` as strictly as Elasticsearch does (its `RestBulkAction`, `BulkRequestParser`
//! and the `validate()` of each item request): the URL parameters, every action line and
//! update source line, and the validation of the whole request. Whatever Elasticsearch refuses
//! as a whole is refused here, with its status and `error.type`, before anything is locked or
//! written; every key it accepts is read as it reads it (numbers given as strings included).

use std::fmt;

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::reply::GateError;
use super::route::DocOp;
use super::single::UpdateBody;

/// Elasticsearch's `Versions.MATCH_ANY`: no version given.
const MATCH_ANY: i64 = -3;
/// Elasticsearch's `Versions.MATCH_DELETED`.
const MATCH_DELETED: i64 = -4;
/// Elasticsearch's `SequenceNumbers.UNASSIGNED_SEQ_NO`.
const UNASSIGNED_SEQ_NO: i64 = -2;
/// The longest `_id` Elasticsearch accepts, in bytes.
const MAX_ID_BYTES: usize = 512;

/// What an update's answer carries of the new document (`_source`, `_source_includes`,
/// `_source_excludes`): Elasticsearch's `FetchSourceContext`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FetchSource {
    /// Whether the source is returned (`get._source`).
    pub fetch: bool,
    /// Paths to keep (wildcards allowed); empty: all.
    pub includes: Vec<String>,
    /// Paths to drop (wildcards allowed).
    pub excludes: Vec<String>,
}

/// The URL parameters of a `_bulk`, checked as Elasticsearch checks them.
#[derive(Debug, Clone, Default)]
pub struct BulkParams {
    /// `routing`: the default of items without their own.
    pub routing: Option<String>,
    /// `pipeline`: the default of items without their own.
    pub pipeline: Option<String>,
    /// `require_alias`.
    pub require_alias: Option<bool>,
    /// `require_data_stream`.
    pub require_data_stream: Option<bool>,
    /// `list_executed_pipelines`.
    pub list_executed_pipelines: Option<bool>,
    /// `_source`, `_source_includes`, `_source_excludes`.
    pub source: Option<FetchSource>,
    /// `pretty`: the answer indented.
    pub pretty: bool,
    /// `filter_path`.
    pub filter_path: Option<String>,
    /// `refresh`, `timeout`, `wait_for_active_shards`, `include_source_on_error`: sent on with
    /// every `_bulk` the gate makes for the request.
    pub forward: Vec<(String, String)>,
}

/// One item of the request.
#[derive(Debug)]
pub struct Item {
    /// The operation (`index` with `op_type: create` is a create, as Elasticsearch runs it).
    pub op: DocOp,
    /// `_index`, or the path's index.
    pub index: String,
    /// `_id`.
    pub id: Option<String>,
    /// `routing`, or the URL's.
    pub routing: Option<String>,
    /// `if_seq_no` and `if_primary_term`, when given.
    pub if_match: Option<(i64, i64)>,
    /// Whether the action names a `version` or `version_type` (refused on guarded indices).
    pub versioned: bool,
    /// `pipeline`, or the URL's.
    pub pipeline: Option<String>,
    /// `require_alias`, or the URL's.
    pub require_alias: bool,
    /// `require_data_stream`, or the URL's.
    pub require_data_stream: bool,
    /// `list_executed_pipelines`, or the URL's.
    pub list_executed_pipelines: bool,
    /// `dynamic_templates` (index and create).
    pub dynamic_templates: Option<Value>,
    /// What an update answers of the new document (action line, else URL, else update body).
    pub fetch: Option<FetchSource>,
    /// The action line and the source line, as sent (for items passed through).
    pub raw: Vec<Bytes>,
    /// The source line (without a trailing `\r`).
    pub source: Option<Bytes>,
    /// The update body, once the gate parsed it for its own rules.
    pub update: Option<UpdateBody>,
    /// The failure Elasticsearch answers for this item alone (an empty `_id`).
    pub failed: Option<GateError>,
}

fn illegal(reason: impl Into<String>) -> GateError {
    GateError::new(
        StatusCode::BAD_REQUEST,
        "illegal_argument_exception",
        reason,
    )
}

fn parse_error(reason: impl Into<String>) -> GateError {
    GateError::new(StatusCode::BAD_REQUEST, "x_content_parse_exception", reason)
}

/// Checks the URL parameters of a `_bulk` on `path`.
///
/// # Errors
/// A parameter Elasticsearch does not know on `_bulk` (400, as it answers), a value it cannot
/// read, or `source` (the gate reads the body from the request body only).
pub fn params(path: &str, given: &[(String, String)]) -> Result<BulkParams, GateError> {
    let mut p = BulkParams::default();
    let mut unknown = Vec::new();
    let mut source: Option<&str> = None;
    let (mut includes, mut excludes) = (None, None);
    for (k, v) in given {
        match k.as_str() {
            "refresh" => {
                if !matches!(v.as_str(), "" | "true" | "false" | "wait_for") {
                    return Err(illegal(format!("Unknown value for refresh: [{v}].")));
                }
                p.forward.push((k.clone(), v.clone()));
            }
            "timeout" => {
                time_value(k, v)?;
                p.forward.push((k.clone(), v.clone()));
            }
            "wait_for_active_shards" => {
                if !(v == "all" || v == "index-setting" || v.parse::<u32>().is_ok()) {
                    return Err(illegal(format!(
                        "could not parse ActiveShardCount from [{v}]: give `all` or a number of shard copies"
                    )));
                }
                p.forward.push((k.clone(), v.clone()));
            }
            "include_source_on_error" => {
                flag(v)?;
                p.forward.push((k.clone(), v.clone()));
            }
            "routing" => p.routing = Some(v.clone()),
            "pipeline" => p.pipeline = Some(v.clone()),
            "require_alias" => p.require_alias = Some(flag(v)?),
            "require_data_stream" => p.require_data_stream = Some(flag(v)?),
            "list_executed_pipelines" => p.list_executed_pipelines = Some(flag(v)?),
            "_source" => source = Some(v),
            "_source_includes" => includes = Some(v),
            "_source_excludes" => excludes = Some(v),
            "filter_path" => p.filter_path = Some(v.clone()),
            "pretty" => p.pretty = v != "false",
            "human" | "error_trace" => {}
            "source" | "source_content_type" => {
                return Err(illegal(format!(
                    "zkguard: the gate reads a _bulk from the request body; send it there instead of the [{k}] parameter"
                )))
            }
            _ => unknown.push(k.clone()),
        }
    }
    if !unknown.is_empty() {
        let names: Vec<String> = unknown.iter().map(|k| format!("[{k}]")).collect();
        let s = if unknown.len() == 1 { "" } else { "s" };
        return Err(illegal(format!(
            "request [{path}] contains unrecognized parameter{s}: {}",
            names.join(", ")
        )));
    }
    if source.is_some() || includes.is_some() || excludes.is_some() {
        let list = |v: Option<&String>| -> Vec<String> {
            v.map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
        };
        let mut f = FetchSource {
            fetch: true,
            includes: list(includes),
            excludes: list(excludes),
        };
        match source {
            Some("true") | Some("") | None => {}
            Some("false") => f.fetch = false,
            Some(fields) => f.includes = list(Some(&fields.to_string())),
        }
        p.source = Some(f);
    }
    Ok(p)
}

/// A boolean URL parameter as Elasticsearch reads it (`true`, `false`, or empty for false).
fn flag(v: &str) -> Result<bool, GateError> {
    match v {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        _ => Err(illegal(format!(
            "Failed to parse value [{v}] as only [true] or [false] are allowed."
        ))),
    }
}

/// Checks a time value (`30s`, `1m`, `500ms`, `-1`, `0`).
fn time_value(key: &str, v: &str) -> Result<(), GateError> {
    let v = v.trim();
    if v == "-1" || v == "0" {
        return Ok(());
    }
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let ok = matches!(unit, "nanos" | "micros" | "ms" | "s" | "m" | "h" | "d")
        && !digits.is_empty()
        && digits.parse::<f64>().is_ok_and(|n| n >= 0.0);
    if ok {
        Ok(())
    } else {
        Err(GateError::new(
            StatusCode::BAD_REQUEST,
            "parse_exception",
            format!("failed to parse setting [{key}] with value [{v}] as a time value: unit is missing or unrecognized"),
        ))
    }
}

/// A JSON value keeping its object keys in order, duplicates refused (as Elasticsearch's
/// parser refuses them).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("not a finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out: Vec<(String, Json)> = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.iter().any(|(seen, _)| *seen == k) {
                return Err(de::Error::custom(format!("Duplicate field '{k}'")));
            }
            let v = map.next_value()?;
            out.push((k, v));
        }
        Ok(Json::Object(out))
    }
}

impl Json {
    /// The token Elasticsearch's parser names for this value.
    fn token(&self) -> &'static str {
        match self {
            Json::Null => "VALUE_NULL",
            Json::Bool(_) => "VALUE_BOOLEAN",
            Json::Number(_) => "VALUE_NUMBER",
            Json::String(_) => "VALUE_STRING",
            Json::Array(_) => "START_ARRAY",
            Json::Object(_) => "START_OBJECT",
        }
    }

    /// `parser.text()`: a string, a number's or a boolean's text.
    fn text(&self) -> String {
        match self {
            Json::String(s) => s.clone(),
            Json::Number(n) => n.to_string(),
            Json::Bool(b) => b.to_string(),
            _ => String::new(),
        }
    }

    /// `parser.longValue()` (coercing): a number (a fraction truncated) or a numeric string.
    fn long(&self) -> Result<i64, GateError> {
        self.integer(i64::MIN as f64, i64::MAX as f64, "a long")
    }

    /// `parser.intValue()` (coercing).
    fn int(&self) -> Result<i64, GateError> {
        self.integer(i32::MIN as f64, i32::MAX as f64, "an integer")
    }

    fn integer(&self, min: f64, max: f64, what: &str) -> Result<i64, GateError> {
        let out_of_range = |t: &str| illegal(format!("Value [{t}] is out of range for {what}"));
        match self {
            Json::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) if (i as f64) >= min && (i as f64) <= max => Ok(i),
                (None, Some(f)) if f.is_finite() && f.trunc() >= min && f.trunc() <= max => {
                    Ok(f.trunc() as i64)
                }
                _ => Err(parse_error(format!(
                    "Numeric value ({n}) out of range of {what}"
                ))),
            },
            Json::String(s) => {
                if let Ok(i) = s.parse::<i64>() {
                    return if (i as f64) >= min && (i as f64) <= max {
                        Ok(i)
                    } else {
                        Err(out_of_range(s))
                    };
                }
                match decimal(s) {
                    Some(f) if f.trunc() >= min && f.trunc() <= max => Ok(f.trunc() as i64),
                    Some(_) => Err(out_of_range(s)),
                    None => Err(illegal(format!("For input string: \"{s}\""))),
                }
            }
            other => Err(parse_error(format!(
                "Current token ({}) not numeric, can not use numeric value accessors",
                other.token()
            ))),
        }
    }

    /// `parser.booleanValue()`: a boolean, or the string `true` or `false`.
    fn boolean(&self) -> Result<bool, GateError> {
        match self {
            Json::Bool(b) => Ok(*b),
            Json::String(s) if s == "true" => Ok(true),
            Json::String(s) if s == "false" => Ok(false),
            Json::String(s) => Err(illegal(format!(
                "Failed to parse value [{s}] as only [true] or [false] are allowed."
            ))),
            other => Err(parse_error(format!(
                "Current token ({}) not of boolean type",
                other.token()
            ))),
        }
    }

    fn into_value(self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(b),
            Json::Number(n) => Value::Number(n),
            Json::String(s) => Value::String(s),
            Json::Array(a) => Value::Array(a.into_iter().map(Json::into_value).collect()),
            Json::Object(o) => Value::Object(
                o.into_iter()
                    .map(|(k, v)| (k, v.into_value()))
                    .collect::<Map<String, Value>>(),
            ),
        }
    }
}

/// A decimal number in Java's `BigDecimal` syntax (`1.5`, `-2e3`), as `f64`.
fn decimal(s: &str) -> Option<f64> {
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let ok = !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
        && t.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if ok {
        s.parse::<f64>().ok().filter(|f| f.is_finite())
    } else {
        None
    }
}

/// Parses one JSON document of a line; `what` names it in the error.
fn json_of(line: &[u8], what: &str) -> Result<(Json, Result<(), String>), GateError> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let value = Json::deserialize(&mut de)
        .map_err(|e| parse_error(format!("Failed to parse {what}: {e}")))?;
    let rest = de.end().map_err(|e| e.to_string());
    Ok((value, rest))
}

/// `_source` in an action line or update body: Elasticsearch's `FetchSourceContext.fromXContent`.
fn fetch_of(v: &Json) -> Result<FetchSource, GateError> {
    let list = |v: &Json| -> Result<Vec<String>, GateError> {
        match v {
            Json::String(s) => Ok(vec![s.clone()]),
            Json::Array(a) => a
                .iter()
                .map(|x| match x {
                    Json::String(s) => Ok(s.clone()),
                    other => Err(parsing(format!(
                        "Unknown key for a {} in [_source].",
                        other.token()
                    ))),
                })
                .collect(),
            other => Err(parsing(format!(
                "Unknown key for a {} in [_source].",
                other.token()
            ))),
        }
    };
    match v {
        Json::Bool(b) => Ok(FetchSource {
            fetch: *b,
            ..FetchSource::default()
        }),
        Json::String(_) | Json::Array(_) => Ok(FetchSource {
            fetch: true,
            includes: list(v)?,
            excludes: Vec::new(),
        }),
        Json::Object(o) => {
            let mut f = FetchSource {
                fetch: true,
                ..FetchSource::default()
            };
            for (k, v) in o {
                match k.as_str() {
                    "includes" | "include" => f.includes = list(v)?,
                    "excludes" | "exclude" => f.excludes = list(v)?,
                    _ => {
                        return Err(parsing(format!(
                            "Unknown key for a {} in [{k}].",
                            v.token()
                        )))
                    }
                }
            }
            Ok(f)
        }
        other => Err(parsing(format!(
            "Expected one of [VALUE_BOOLEAN, START_OBJECT] but found [{}]",
            other.token()
        ))),
    }
}

fn parsing(reason: String) -> GateError {
    GateError::new(StatusCode::BAD_REQUEST, "parsing_exception", reason)
}

/// What an action line says, before the item is made.
#[derive(Debug, Default)]
struct Meta {
    index: Option<String>,
    id: Option<String>,
    routing: Option<String>,
    op_type: Option<String>,
    version: Option<i64>,
    version_type: Option<String>,
    if_seq_no: Option<i64>,
    if_primary_term: Option<i64>,
    retry_on_conflict: i64,
    pipeline: Option<String>,
    fetch: Option<FetchSource>,
    require_alias: Option<bool>,
    require_data_stream: Option<bool>,
    list_executed_pipelines: Option<bool>,
    dynamic_templates: Option<Value>,
}

impl Meta {
    fn versioned(&self) -> bool {
        self.version.is_some() || self.version_type.is_some()
    }

    /// The version as Elasticsearch holds it (`MATCH_ANY` when none).
    fn version(&self) -> i64 {
        self.version.unwrap_or(MATCH_ANY)
    }

    fn internal(&self) -> bool {
        self.version_type.as_deref().unwrap_or("internal") == "internal"
    }

    fn seq_no(&self) -> i64 {
        self.if_seq_no.unwrap_or(UNASSIGNED_SEQ_NO)
    }

    fn term(&self) -> i64 {
        self.if_primary_term.unwrap_or(0)
    }
}

/// Reads the keys of action line `line` (its object after the action name).
fn meta_of(line: usize, entries: Vec<(String, Json)>) -> Result<Meta, GateError> {
    let mut m = Meta::default();
    for (k, v) in entries {
        match v {
            Json::Null => continue,
            Json::Array(_) => {
                return Err(illegal(format!(
                    "Malformed action/metadata line [{line}], expected a simple value for field [{k}] but found [START_ARRAY]"
                )))
            }
            Json::Object(_) if k == "dynamic_templates" => {
                m.dynamic_templates = Some(v.into_value())
            }
            Json::Object(_) if k == "_source" => m.fetch = Some(fetch_of(&v)?),
            Json::Object(_) => {
                return Err(illegal(format!(
                    "Malformed action/metadata line [{line}], expected a simple value for field [{k}] but found [START_OBJECT]"
                )))
            }
            _ => match k.as_str() {
                "_index" => m.index = Some(v.text()),
                "_id" => m.id = Some(v.text()),
                "routing" => m.routing = Some(v.text()),
                "op_type" => m.op_type = Some(v.text()),
                "version" => m.version = Some(v.long()?),
                "version_type" => {
                    let t = v.text();
                    if !matches!(
                        t.as_str(),
                        "internal" | "external" | "external_gt" | "external_gte"
                    ) {
                        return Err(illegal(format!("No version type match [{t}]")));
                    }
                    m.version_type = Some(t);
                }
                "if_seq_no" => {
                    let s = v.long()?;
                    if s < 0 && s != UNASSIGNED_SEQ_NO {
                        return Err(illegal(format!(
                            "sequence numbers must be non negative. got [{s}]."
                        )));
                    }
                    m.if_seq_no = Some(s);
                }
                "if_primary_term" => {
                    let t = v.long()?;
                    if t < 0 {
                        return Err(illegal(format!(
                            "primary term must be non negative. got [{t}]"
                        )));
                    }
                    m.if_primary_term = Some(t);
                }
                "retry_on_conflict" => m.retry_on_conflict = v.int()?,
                "pipeline" => m.pipeline = Some(v.text()),
                "_source" => m.fetch = Some(fetch_of(&v)?),
                "require_alias" => m.require_alias = Some(v.boolean()?),
                "require_data_stream" => m.require_data_stream = Some(v.boolean()?),
                "list_executed_pipelines" => m.list_executed_pipelines = Some(v.boolean()?),
                _ => {
                    return Err(illegal(format!(
                        "Action/metadata line [{line}] contains an unknown parameter [{k}]"
                    )))
                }
            },
        }
    }
    Ok(m)
}

/// Reads action line `line`: its operation and keys.
fn action_of(line: usize, bytes: &[u8]) -> Result<(DocOp, Meta), GateError> {
    let (value, rest) = json_of(bytes, &format!("action/metadata line [{line}]"))?;
    let malformed =
        |what: String| illegal(format!("Malformed action/metadata line [{line}], {what}"));
    let Json::Object(mut top) = value else {
        return Err(malformed(format!(
            "expected START_OBJECT but found [{}]",
            value.token()
        )));
    };
    if top.is_empty() {
        return Err(malformed(
            "expected FIELD_NAME but found [END_OBJECT]".into(),
        ));
    }
    let extra = top.len() > 1;
    let (name, inner) = top.swap_remove(0);
    let op = match name.as_str() {
        "index" => DocOp::Index,
        "create" => DocOp::Create,
        "update" => DocOp::Update,
        "delete" => DocOp::Delete,
        _ => {
            return Err(malformed(format!(
                "expected field [create], [delete], [index] or [update] but found [{name}]"
            )))
        }
    };
    let Json::Object(entries) = inner else {
        return Err(malformed(format!(
            "expected START_OBJECT or END_OBJECT but found [{}]",
            inner.token()
        )));
    };
    let meta = meta_of(line, entries)?;
    if extra {
        return Err(malformed(
            "expected END_OBJECT but found [FIELD_NAME]".into(),
        ));
    }
    if rest.is_err() {
        return Err(malformed("unexpected data after the closing brace".into()));
    }
    let op = match (op, meta.op_type.as_deref()) {
        (DocOp::Index, Some("create")) => DocOp::Create,
        (op, _) => op,
    };
    Ok((op, meta))
}

/// An update source line, read as Elasticsearch's `UpdateRequest` parser reads it.
#[derive(Debug, Default)]
struct UpdateLine {
    script: bool,
    doc: bool,
    upsert: bool,
    doc_as_upsert: bool,
    fetch: Option<FetchSource>,
}

fn update_of(line: usize, bytes: &[u8]) -> Result<UpdateLine, GateError> {
    let mut u = UpdateLine::default();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(u);
    }
    let (value, rest) = json_of(bytes, &format!("the update on line [{line}]"))?;
    if let Err(e) = rest {
        return Err(parse_error(format!(
            "Failed to parse the update on line [{line}]: {e}"
        )));
    }
    let Json::Object(entries) = value else {
        return Err(parse_error(format!(
            "[{line}] [UpdateRequest] expected START_OBJECT but found [{}]",
            value.token()
        )));
    };
    for (k, v) in entries {
        let unknown = || parse_error(format!("[{line}] [UpdateRequest] unknown field [{k}]"));
        match k.as_str() {
            "script" => u.script = !matches!(v, Json::Null),
            "scripted_upsert" | "detect_noop" => {
                if !matches!(v, Json::Null) {
                    v.boolean()?;
                }
            }
            "upsert" => u.upsert = !matches!(v, Json::Null),
            "doc" => match v {
                Json::Object(_) => u.doc = true,
                Json::Null => {}
                other => {
                    return Err(parse_error(format!(
                        "[{line}] [UpdateRequest] failed to parse field [doc]: expected an object, found [{}]",
                        other.token()
                    )))
                }
            },
            "doc_as_upsert" => u.doc_as_upsert = !matches!(v, Json::Null) && v.boolean()?,
            "_source" => u.fetch = Some(fetch_of(&v)?),
            _ => return Err(unknown()),
        }
    }
    Ok(u)
}

/// Elasticsearch's `DocWriteRequest.validateSeqNoBasedCASParams` and `validateDocIdLength`.
fn check_cas_and_id(m: &Meta, errors: &mut Vec<String>) {
    let version = m.version();
    let internal = m.internal();
    let valid = if internal {
        version > 0 || version == MATCH_ANY || version == MATCH_DELETED
    } else {
        version >= 0
    };
    if !valid {
        let t = m
            .version_type
            .as_deref()
            .unwrap_or("internal")
            .to_uppercase();
        errors.push(format!(
            "illegal version value [{version}] for version type [{t}]"
        ));
    }
    if internal && version != MATCH_ANY && version != MATCH_DELETED {
        errors.push("internal versioning can not be used for optimistic concurrency control. Please use `if_seq_no` and `if_primary_term` instead".into());
    }
    if m.seq_no() != UNASSIGNED_SEQ_NO && (!internal || version != MATCH_ANY) {
        errors.push("compare and write operations can not use versioning".into());
    }
    if m.term() == 0 && m.seq_no() != UNASSIGNED_SEQ_NO {
        errors.push("ifSeqNo is set, but primary term is [0]".into());
    }
    if m.term() != 0 && m.seq_no() == UNASSIGNED_SEQ_NO {
        errors.push(format!(
            "ifSeqNo is unassigned, but primary term is [{}]",
            m.term()
        ));
    }
    if let Some(id) = &m.id {
        if id.len() > MAX_ID_BYTES {
            errors.push(format!(
                "id [{id}] is too long, must be no longer than {MAX_ID_BYTES} bytes but was: {}",
                id.len()
            ));
        }
    }
}

/// Elasticsearch's `validate()` of an item: the errors it adds to the request's.
fn validate(op: DocOp, m: &Meta, index: Option<&str>, u: &UpdateLine, errors: &mut Vec<String>) {
    if index.is_none() {
        errors.push("index is missing".into());
    }
    match op {
        DocOp::Index | DocOp::Create => {
            if op == DocOp::Create {
                let explicit = m
                    .version
                    .is_some_and(|v| v != MATCH_ANY && v != MATCH_DELETED);
                if !m.internal() {
                    errors.push(
                        "create operations only support internal versioning. use index instead"
                            .into(),
                    );
                    return;
                }
                if explicit {
                    errors.push(
                        "create operations do not support explicit versions. use index instead"
                            .into(),
                    );
                    return;
                }
                if m.if_seq_no.is_some_and(|s| s != UNASSIGNED_SEQ_NO)
                    || m.if_primary_term.is_some_and(|t| t != 0)
                {
                    errors.push(
                        "create operations do not support compare and set. use index instead"
                            .into(),
                    );
                    return;
                }
            }
            let versioned = m
                .version
                .is_some_and(|v| v != MATCH_ANY && v != MATCH_DELETED);
            if m.id.is_none() && (!m.internal() || versioned) {
                errors.push("an id must be provided if version type or value are set".into());
            }
            check_cas_and_id(m, errors);
            if m.pipeline.as_deref() == Some("") {
                errors.push("pipeline cannot be an empty string".into());
            }
        }
        DocOp::Delete => {
            if m.id.as_deref().unwrap_or_default().is_empty() {
                errors.push("id is missing".into());
            }
            check_cas_and_id(m, errors);
        }
        DocOp::Update => {
            if m.id.as_deref().unwrap_or_default().is_empty() {
                errors.push("id is missing".into());
            }
            check_cas_and_id(m, errors);
            if m.seq_no() != UNASSIGNED_SEQ_NO {
                if m.retry_on_conflict > 0 {
                    errors.push("compare and write operations can not be retried".into());
                }
                if u.doc_as_upsert {
                    errors.push("compare and write operations can not be used with upsert".into());
                }
                if u.upsert {
                    errors.push(
                        "upsert requests don't support `if_seq_no` and `if_primary_term`".into(),
                    );
                }
            }
            if !u.script && !u.doc {
                errors.push("script or doc is missing".into());
            }
            if u.script && u.doc {
                errors.push("can't provide both script and doc".into());
            }
            if !u.doc && u.doc_as_upsert {
                errors.push("doc must be specified if doc_as_upsert is enabled".into());
            }
        }
    }
}

/// The refusals Elasticsearch makes of an action once its keys are read.
fn check_action(line: usize, op: DocOp, m: &Meta, p: &BulkParams) -> Result<(), GateError> {
    let templates = m
        .dynamic_templates
        .as_ref()
        .and_then(Value::as_object)
        .is_some_and(|t| !t.is_empty());
    match op {
        DocOp::Delete if templates => Err(illegal(format!(
            "Delete request in line [{line}] does not accept dynamic_templates"
        ))),
        DocOp::Update => {
            if m.version() != MATCH_ANY || !m.internal() {
                return Err(illegal("Update requests do not support versioning. Please use `if_seq_no` and `if_primary_term` instead"));
            }
            if m.require_data_stream.or(p.require_data_stream) == Some(true) {
                return Err(illegal("Update requests do not support the `require_data_stream` flag, as data streams do not support update operations"));
            }
            if templates {
                return Err(illegal(format!(
                    "Update request in line [{line}] does not accept dynamic_templates"
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The lines of `body`, split at `\n` as Elasticsearch splits them, one at a time (a body of
/// millions of empty lines costs no memory).
///
/// # Errors
/// A body whose last line has no newline.
fn lines(body: &Bytes) -> Result<impl Iterator<Item = Bytes> + '_, GateError> {
    if body.last().is_some_and(|b| *b != b'\n') {
        return Err(illegal(
            "The bulk request must be terminated by a newline [\\n]",
        ));
    }
    let mut start = 0;
    Ok(std::iter::from_fn(move || {
        let at = body.get(start..)?.iter().position(|b| *b == b'\n')?;
        let line = body.slice(start..start + at);
        start += at + 1;
        Some(line)
    }))
}

/// 413 for a `_bulk` of more than `max` items (`server.gateway.bulk.max.items`).
fn too_many(max: usize) -> GateError {
    GateError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "content_too_long_exception",
        format!("zkguard: this _bulk has more than {max} items, the most the gate takes in one request (server.gateway.bulk.max.items); nothing was locked or written: send at most {max} items per _bulk (the official bulk helpers send 500 by default)"),
    )
}

/// Splits and reads the NDJSON body into items, refusing as a whole what Elasticsearch
/// refuses as a whole (with its status, `error.type` and wording).
///
/// # Errors
/// An empty body, a line Elasticsearch cannot read, a key it does not know, or the
/// validation errors of the items (`action_request_validation_exception`).
pub fn parse(
    body: &Bytes,
    default_index: Option<&str>,
    p: &BulkParams,
    max_items: usize,
) -> Result<Vec<Item>, GateError> {
    if body.is_empty() {
        return Err(GateError::new(
            StatusCode::BAD_REQUEST,
            "parse_exception",
            "request body is required",
        ));
    }
    let mut lines = lines(body)?;
    let mut items = Vec::new();
    let mut errors = Vec::new();
    let mut n = 0;
    while let Some(line) = lines.next() {
        n += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if items.len() == max_items {
            return Err(too_many(max_items));
        }
        let (op, meta) = action_of(n, &line)?;
        check_action(n, op, &meta, p)?;
        let mut raw = vec![line.clone()];
        let mut update = UpdateLine::default();
        let source = if op == DocOp::Delete {
            None
        } else {
            let Some(s) = lines.next() else {
                return Err(illegal(format!(
                    "the {} action on line [{n}] has no source line after it; end every index, create and update action with its source line",
                    op.name()
                )));
            };
            n += 1;
            raw.push(s.clone());
            let s = s
                .strip_suffix(b"\r")
                .map_or_else(|| s.clone(), |t| s.slice(..t.len()));
            if op == DocOp::Update {
                update = update_of(n, &s)?;
                Some(s)
            } else {
                Some(super::meta::client_source(&s))
            }
        };
        let index = meta
            .index
            .clone()
            .or_else(|| default_index.map(str::to_string));
        validate(op, &meta, index.as_deref(), &update, &mut errors);
        items.push(item_of(op, meta, index, raw, source, update, p));
    }
    if items.is_empty() {
        errors.push("no requests added".into());
    }
    if !errors.is_empty() {
        let listed: String = errors
            .iter()
            .enumerate()
            .map(|(k, e)| format!("{}: {e};", k + 1))
            .collect();
        return Err(GateError::new(
            StatusCode::BAD_REQUEST,
            "action_request_validation_exception",
            format!("Validation Failed: {listed}"),
        ));
    }
    Ok(items)
}

/// The item of a read and checked action.
fn item_of(
    op: DocOp,
    m: Meta,
    index: Option<String>,
    raw: Vec<Bytes>,
    source: Option<Bytes>,
    update: UpdateLine,
    p: &BulkParams,
) -> Item {
    let failed = (matches!(op, DocOp::Index | DocOp::Create) && m.id.as_deref() == Some(""))
        .then(|| illegal("if _id is specified it must not be empty"));
    let if_match = match (m.if_seq_no, m.if_primary_term) {
        (Some(s), Some(t)) if s != UNASSIGNED_SEQ_NO => Some((s, t)),
        _ => None,
    };
    let pipeline = match op {
        DocOp::Delete => None,
        _ => m.pipeline.clone().or_else(|| p.pipeline.clone()),
    };
    Item {
        op,
        index: index.unwrap_or_default(),
        versioned: m.versioned(),
        routing: m.routing.clone().or_else(|| p.routing.clone()),
        if_match,
        pipeline,
        require_alias: m.require_alias.or(p.require_alias).unwrap_or(false),
        require_data_stream: m
            .require_data_stream
            .or(p.require_data_stream)
            .unwrap_or(false),
        list_executed_pipelines: m
            .list_executed_pipelines
            .or(p.list_executed_pipelines)
            .unwrap_or(false),
        dynamic_templates: m.dynamic_templates,
        fetch: match op {
            DocOp::Update => m.fetch.or_else(|| p.source.clone()).or(update.fetch),
            _ => None,
        },
        id: m.id,
        raw,
        source,
        update: None,
        failed,
    }
}

/// `source` filtered as Elasticsearch filters a fetched `_source`: the paths matching
/// `includes` (all when empty), without those matching `excludes`.
pub fn filter_source(source: &Value, f: &FetchSource) -> Value {
    filter_at(source, "", f).unwrap_or_else(|| Value::Object(Map::new()))
}

fn filter_at(v: &Value, path: &str, f: &FetchSource) -> Option<Value> {
    let Value::Object(o) = v else {
        return Some(v.clone());
    };
    let mut out = Map::new();
    for (k, child) in o {
        let p = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if f.excludes.iter().any(|e| glob(e, &p)) {
            continue;
        }
        let included = f.includes.is_empty() || f.includes.iter().any(|i| glob(i, &p));
        if included {
            let inner = FetchSource {
                fetch: true,
                includes: Vec::new(),
                excludes: f.excludes.clone(),
            };
            if let Some(c) = filter_at(child, &p, &inner) {
                out.insert(k.clone(), c);
            }
        } else if child.is_object() && f.includes.iter().any(|i| could_match_below(i, &p)) {
            if let Some(c) =
                filter_at(child, &p, f).filter(|c| c.as_object().is_some_and(|o| !o.is_empty()))
            {
                out.insert(k.clone(), c);
            }
        }
    }
    Some(Value::Object(out))
}

/// Whether `pattern` may match a path below `path`.
fn could_match_below(pattern: &str, path: &str) -> bool {
    pattern.contains('*') || pattern.starts_with(&format!("{path}."))
}

/// Simple wildcard matching (`*` for any run of characters).
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            text.starts_with(head)
                && (0..=text.len() - head.len())
                    .filter(|&k| text.is_char_boundary(head.len() + k))
                    .any(|k| glob(tail, &text[head.len() + k..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: &str) -> Result<Vec<Item>, GateError> {
        parse(
            &Bytes::from(body.to_string()),
            None,
            &BulkParams::default(),
            usize::MAX,
        )
    }

    #[test]
    fn a_bulk_of_more_items_than_the_limit_is_refused_whole_with_413() {
        let body = Bytes::from_static(b"{\"delete\":{\"_index\":\"a\",\"_id\":\"1\"}}\n\n\n{\"delete\":{\"_index\":\"a\",\"_id\":\"2\"}}\n");
        let p = BulkParams::default();
        assert_eq!(parse(&body, None, &p, 2).unwrap().len(), 2);
        let e = parse(&body, None, &p, 1).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.kind),
            (413, "content_too_long_exception")
        );
        assert!(
            e.reason.contains("server.gateway.bulk.max.items"),
            "{}",
            e.reason
        );
    }

    fn refused(body: &str) -> (u16, &'static str, String) {
        let e = parsed(body).expect_err(body);
        (e.status.as_u16(), e.kind, e.reason)
    }

    #[test]
    fn conditions_are_read_as_elasticsearch_reads_them() {
        let items = parsed(
            "{\"index\":{\"_index\":\"a\",\"_id\":1,\"if_seq_no\":\"7\",\"if_primary_term\":\"2\"}}\n{}\n\
             {\"index\":{\"_index\":\"a\",\"_id\":\"x\",\"op_type\":\"create\",\"_routing\":null}}\n{}\n",
        )
        .unwrap();
        assert_eq!(items[0].if_match, Some((7, 2)));
        assert_eq!(items[0].id.as_deref(), Some("1"));
        assert_eq!(items[1].op, DocOp::Create);
        let (status, kind, reason) =
            refused("{\"index\":{\"_index\":\"a\",\"_id\":\"x\",\"if_seq_no\":3}}\n{}\n");
        assert_eq!((status, kind), (400, "action_request_validation_exception"));
        assert!(
            reason.contains("ifSeqNo is set, but primary term is [0]"),
            "{reason}"
        );
    }

    #[test]
    fn what_elasticsearch_refuses_whole_is_refused_whole() {
        for (body, kind, says) in [
            (
                "{\"index\":{\"_index\":\"a\",\"_routing\":\"r\"}}\n{}\n",
                "illegal_argument_exception",
                "unknown parameter [_routing]",
            ),
            (
                "{\"index\":{\"_index\":\"a\",\"_type\":\"t\"}}\n{}\n",
                "illegal_argument_exception",
                "unknown parameter [_type]",
            ),
            (
                "{\"upsert\":{}}\n{}\n",
                "illegal_argument_exception",
                "but found [upsert]",
            ),
            (
                "{\"index\":{}} x\n{}\n",
                "illegal_argument_exception",
                "unexpected data after the closing brace",
            ),
            (
                "{\"index\":{},\"delete\":{}}\n{}\n",
                "illegal_argument_exception",
                "expected END_OBJECT but found [FIELD_NAME]",
            ),
            (
                "{\"index\":{\"_id\":\"a\",\"_id\":\"b\"}}\n{}\n",
                "x_content_parse_exception",
                "Duplicate field '_id'",
            ),
            (
                "{\"delete\":{\"_index\":\"a\",\"_id\":\"\"}}\n",
                "action_request_validation_exception",
                "id is missing",
            ),
            (
                "{\"index\":{\"_index\":\"a\"}}\n{}",
                "illegal_argument_exception",
                "terminated by a newline",
            ),
            (
                "\n\n",
                "action_request_validation_exception",
                "no requests added",
            ),
            (
                "{\"update\":{\"_index\":\"a\",\"_id\":\"1\"}}\n{\"doc\":{},\"dco\":1}\n",
                "x_content_parse_exception",
                "unknown field [dco]",
            ),
            (
                "{\"update\":{\"_index\":\"a\",\"_id\":\"1\",\"version\":2}}\n{\"doc\":{}}\n",
                "illegal_argument_exception",
                "do not support versioning",
            ),
            (
                "{\"index\":{\"_index\":\"a\",\"if_seq_no\":\"x\",\"if_primary_term\":1}}\n{}\n",
                "illegal_argument_exception",
                "For input string: \"x\"",
            ),
            (
                "{\"index\":{\"_index\":\"a\",\"require_alias\":\"yes\"}}\n{}\n",
                "illegal_argument_exception",
                "only [true] or [false]",
            ),
        ] {
            let (status, k, reason) = refused(body);
            assert_eq!((status, k), (400, kind), "{body}: {reason}");
            assert!(reason.contains(says), "{body}: {reason}");
        }
    }

    #[test]
    fn url_parameters_are_checked_and_defaults_reach_the_items() {
        let e = params("/_bulk", &[("pipline".into(), "x".into())]).unwrap_err();
        assert_eq!(
            e.reason,
            "request [/_bulk] contains unrecognized parameter: [pipline]"
        );
        let p = params(
            "/_bulk",
            &[
                ("routing".into(), "r".into()),
                ("pipeline".into(), "p".into()),
                ("_source_includes".into(), "a".into()),
                ("refresh".into(), "wait_for".into()),
            ],
        )
        .unwrap();
        assert_eq!(
            p.forward,
            vec![("refresh".to_string(), "wait_for".to_string())]
        );
        let items = parse(
            &Bytes::from_static(b"{\"index\":{\"_index\":\"a\",\"_id\":\"1\"}}\n{}\n{\"update\":{\"_index\":\"a\",\"_id\":\"1\"}}\n{\"doc\":{}}\n"),
            None,
            &p,
            usize::MAX,
        )
        .unwrap();
        assert_eq!(items[0].routing.as_deref(), Some("r"));
        assert_eq!(items[0].pipeline.as_deref(), Some("p"));
        assert_eq!(
            items[1].fetch.as_ref().map(|f| f.includes.clone()),
            Some(vec!["a".to_string()])
        );
    }

    #[test]
    fn sources_are_filtered_as_fetched() {
        let doc = serde_json::json!({"a": 1, "o": {"b": 2, "c": 3}, "z": 4});
        let f = |i: &[&str], e: &[&str]| FetchSource {
            fetch: true,
            includes: i.iter().map(|s| s.to_string()).collect(),
            excludes: e.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(filter_source(&doc, &f(&[], &[])), doc);
        assert_eq!(
            filter_source(&doc, &f(&["o.b"], &[])),
            serde_json::json!({"o": {"b": 2}})
        );
        assert_eq!(
            filter_source(&doc, &f(&["o"], &["o.c"])),
            serde_json::json!({"o": {"b": 2}})
        );
        assert_eq!(
            filter_source(&doc, &f(&["*"], &["a", "z"])),
            serde_json::json!({"o": {"b": 2, "c": 3}})
        );
    }
}
