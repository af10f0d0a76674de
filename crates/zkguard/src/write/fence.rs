//! The fencing rule, written once: a write made under a lock carries the lock's fencing token
//! as the document's external version, with `version_type=external_gte`, so that Elasticsearch
//! refuses it (409) once the document holds a newer holder's token. An equal version passes:
//! one holder may write its document several times. The library's guarded writes, its
//! transactions and the gate of `zkguard serve` all take the condition or its parameters from
//! here (`docs/fencing.md` explains the rule).

use serde_json::{Map, Value};

use crate::es::{EsError, WriteCondition};

/// The condition of a write fenced by `token`: [`WriteCondition::ExternalGte`] of the token.
pub fn condition(token: u64) -> WriteCondition {
    WriteCondition::ExternalGte(token)
}

/// The parameters of a write fenced by `token` as Elasticsearch reads them, as URL query
/// parameters or as the fields of a `_bulk` action line: `version` (the token) and
/// `version_type` (`external_gte`). The same translation as the library's own `_bulk` writes.
///
/// # Errors
/// [`EsError::BadRequest`] when the token is larger than Elasticsearch's largest version.
pub fn params(token: u64) -> Result<Map<String, Value>, EsError> {
    crate::es::condition_fields(condition(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_write_carries_its_token_as_an_external_gte_version() {
        let token = crate::zk::TOKEN_BASE + 7;
        assert_eq!(condition(token), WriteCondition::ExternalGte(token));
        let p = params(token).unwrap();
        assert_eq!(p["version"], serde_json::json!(token));
        assert_eq!(p["version_type"], "external_gte");
        assert_eq!(p.len(), 2);
        assert!(params(u64::MAX).is_err());
    }
}
