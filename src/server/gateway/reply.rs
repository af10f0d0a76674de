//! The answers the gate makes itself: Elasticsearch's shapes, content type and product header.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::backend::PRODUCT;

/// How the gate's own answers are dressed: the backend's product header, and the caller's
/// media type (plain JSON, or Elasticsearch's versioned `vnd` type when the caller asked for it).
#[derive(Debug, Clone)]
pub struct Dress {
    product: Option<HeaderValue>,
    content_type: HeaderValue,
}

impl Dress {
    /// For a request with `headers`, answered with the backend's `product` header.
    pub fn new(product: Option<HeaderValue>, headers: &HeaderMap) -> Self {
        let asked = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let content_type = match asked.find("compatible-with=") {
            Some(at) if asked.contains("application/vnd.elasticsearch+json") => {
                let version: String = asked[at + "compatible-with=".len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                HeaderValue::from_str(&format!(
                    "application/vnd.elasticsearch+json;compatible-with={version}"
                ))
                .unwrap_or(HeaderValue::from_static("application/json"))
            }
            _ => HeaderValue::from_static("application/json; charset=UTF-8"),
        };
        Self {
            product,
            content_type,
        }
    }

    /// A JSON answer.
    pub fn json(&self, status: StatusCode, body: &Value) -> Response {
        self.bytes(status, serde_json::to_vec(body).unwrap_or_default())
    }

    /// An answer with a JSON body already serialized.
    pub fn bytes(&self, status: StatusCode, body: Vec<u8>) -> Response {
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, self.content_type.clone());
        if let Some(p) = &self.product {
            h.insert(PRODUCT, p.clone());
        }
        response
    }

    /// An error in Elasticsearch's shape: `{"error": {"root_cause": [..], "type", "reason"},
    /// "status"}`.
    pub fn error(&self, e: &GateError) -> Response {
        let mut response = self.json(e.status, &e.body());
        if let Some(s) = e.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// A refusal or failure the gate answers itself, in Elasticsearch's error shape.
#[derive(Debug, Clone)]
pub struct GateError {
    /// Status.
    pub status: StatusCode,
    /// `error.type`.
    pub kind: &'static str,
    /// `error.reason`: what was wrong and what to do.
    pub reason: String,
    /// `error.index` and `error.shard`-like details, merged into `error`.
    pub extra: Value,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u32>,
    /// Nothing was written and sending the request again is safe: a `_bulk` item failed so
    /// answers 429, the status the official bulk helpers retry ([`GateError::item_status`]).
    pub unwritten: bool,
}

impl GateError {
    /// An error of `status` and `kind`.
    pub fn new(status: StatusCode, kind: &'static str, reason: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            reason: reason.into(),
            extra: Value::Null,
            retry_after: None,
            unwritten: false,
        }
    }

    /// 400 `illegal_argument_exception`: something the gate does not accept on a guarded index.
    pub fn refused(reason: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "illegal_argument_exception",
            reason,
        )
    }

    /// 409 `version_conflict_engine_exception` about `index`/`id`.
    pub fn conflict(index: &str, id: &str, reason: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "version_conflict_engine_exception",
            reason,
        )
        .about(index, id)
    }

    /// Names the document (`index`, `_id` in the error, as Elasticsearch does).
    pub fn about(mut self, index: &str, id: &str) -> Self {
        self.extra = json!({"index": index, "shard": "0", "index_uuid": "_na_", "_id": id});
        self
    }

    /// With `Retry-After`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Marks a refusal after which nothing was written and a retry is safe (see
    /// [`GateError::item_status`]).
    pub fn unwritten(mut self) -> Self {
        self.unwritten = true;
        self
    }

    /// The status of a `_bulk` item that failed so: 429 when nothing was written and a retry
    /// is safe (the official bulk helpers send again the items answered 429, and no others),
    /// the error's own status otherwise. A single-document request answers [`GateError::status`]
    /// (its 503s are retried by the clients' transports).
    pub fn item_status(&self) -> StatusCode {
        if self.unwritten {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            self.status
        }
    }

    /// The `error` object.
    pub fn error_object(&self) -> Value {
        let mut cause = json!({"type": self.kind, "reason": self.reason});
        if let (Some(c), Some(extra)) = (cause.as_object_mut(), self.extra.as_object()) {
            for (k, v) in extra {
                c.insert(k.clone(), v.clone());
            }
        }
        let mut error = cause.clone();
        error["root_cause"] = json!([cause]);
        error
    }

    /// The whole body.
    pub fn body(&self) -> Value {
        json!({"error": self.error_object(), "status": self.status.as_u16()})
    }
}
