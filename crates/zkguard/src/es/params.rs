//! What a write asks of Elasticsearch besides its document: its [`WriteCondition`] as query
//! parameters or `_bulk` action fields, and its [`Refresh`].

use elasticsearch::params::{Refresh as EsRefresh, VersionType};
use serde_json::{json, Map, Value};

use super::{EsError, Refresh, WriteCondition};

pub(super) fn es_refresh(r: Refresh) -> Option<EsRefresh> {
    match r {
        Refresh::No => None,
        Refresh::Now => Some(EsRefresh::True),
        Refresh::WaitFor => Some(EsRefresh::WaitFor),
    }
}

/// An external version as Elasticsearch takes it (a signed 64-bit number).
pub(super) fn external_version(v: u64) -> Result<i64, EsError> {
    i64::try_from(v).map_err(|_| EsError::BadRequest {
        status: 0,
        reason: format!(
            "external version {v} is larger than Elasticsearch accepts ({})",
            i64::MAX
        ),
    })
}

/// The query parameters a condition turns into.
#[derive(Default)]
pub(super) struct Cond {
    pub(super) op_create: bool,
    pub(super) if_seq_no: Option<(i64, i64)>,
    pub(super) version: Option<(i64, VersionType)>,
}

impl Cond {
    pub(super) fn of(c: WriteCondition) -> Result<Self, EsError> {
        Ok(match c {
            WriteCondition::Always => Self::default(),
            WriteCondition::Create => Self {
                op_create: true,
                ..Self::default()
            },
            WriteCondition::IfMatch {
                seq_no,
                primary_term,
            } => Self {
                if_seq_no: Some((seq_no, primary_term)),
                ..Self::default()
            },
            WriteCondition::ExternalGte(v) => Self {
                version: Some((external_version(v)?, VersionType::ExternalGte)),
                ..Self::default()
            },
            WriteCondition::External(v) => Self {
                version: Some((external_version(v)?, VersionType::External)),
                ..Self::default()
            },
        })
    }

    /// The same condition as fields of a `_bulk` action line.
    pub(super) fn bulk_fields(&self, meta: &mut Map<String, Value>) {
        if let Some((s, p)) = self.if_seq_no {
            meta.insert("if_seq_no".into(), json!(s));
            meta.insert("if_primary_term".into(), json!(p));
        }
        if let Some((v, t)) = self.version {
            meta.insert("version".into(), json!(v));
            meta.insert(
                "version_type".into(),
                json!(if t == VersionType::ExternalGte {
                    "external_gte"
                } else {
                    "external"
                }),
            );
        }
    }
}

/// The fields (and URL query parameters) a condition other than [`WriteCondition::Create`]
/// turns into: `if_seq_no` and `if_primary_term`, or `version` and `version_type`. A `Create` is
/// the `_bulk` action itself (or `op_type=create`), so it adds no field.
///
/// # Errors
/// [`EsError::BadRequest`] for an external version larger than Elasticsearch accepts.
pub(crate) fn condition_fields(c: WriteCondition) -> Result<Map<String, Value>, EsError> {
    let mut fields = Map::new();
    Cond::of(c)?.bulk_fields(&mut fields);
    Ok(fields)
}

pub(super) fn create_on_delete() -> EsError {
    EsError::BadRequest {
        status: 0,
        reason: "WriteCondition::Create does not apply to a delete; use Always, IfMatch, External or ExternalGte"
            .into(),
    }
}
