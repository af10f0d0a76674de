//! JSON error answers: `{"error": "<kind>", "message": "<what was wrong and what to do>"}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use zkguard::es::EsError;
use zkguard::write::guarded::GuardedError;
use zkguard::LockError;

/// An error answer: a status, a stable kind and one message.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable, machine-readable kind (`bad_request`, `fenced`, `lock_timeout`, ...).
    pub error: &'static str,
    /// What was wrong and what to do.
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error answer.
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            error,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with a kind.
    pub fn bad(error: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, message)
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(error: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, error, message).retry_after(1)
    }

    /// 500: a fault of the service itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// Adds a `Retry-After` header.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.error, "message": self.message});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// The message of a lock refusal for a request that tried once (`asked` zero): it was not meant
/// to wait, so it is not told to wait longer ([`LockError::try_once_message`]).
pub fn tried_once(asked: Option<std::time::Duration>, e: &LockError) -> Option<String> {
    asked
        .filter(|t| t.is_zero())
        .and_then(|_| e.try_once_message())
}

/// The answer to a failed foreground write. Nothing is retried behind the caller's back.
///
/// - lock not acquired within the request's timeout: **423 Locked** `lock_timeout`, with
///   `Retry-After` (the write was not attempted; retrying later is safe);
/// - fencing rejected the write: **409** `fenced`;
/// - ZooKeeper or Elasticsearch unreachable, the lock lost before the write was sent,
///   Elasticsearch overloaded: **503** with `Retry-After`;
/// - the operation is malformed or Elasticsearch rejected it as a bad request: **400**;
/// - the change cannot be applied to the stored document: **422**.
pub fn from_guarded(e: GuardedError) -> ApiError {
    let message = e.to_string();
    match &e {
        GuardedError::Lock(LockError::Timeout { .. }) => {
            ApiError::new(StatusCode::LOCKED, "lock_timeout", message).retry_after(1)
        }
        GuardedError::Lock(LockError::InvalidMonitor { .. } | LockError::InfoTooLong { .. })
        | GuardedError::Invalid(_) => ApiError::bad("invalid_operation", message),
        GuardedError::Lock(_) => ApiError::unavailable("lock_unavailable", message),
        GuardedError::LockLost { .. } | GuardedError::LostDuringWrite { .. } => {
            ApiError::unavailable("lock_lost", message)
        }
        GuardedError::Fenced { .. } => ApiError::new(StatusCode::CONFLICT, "fenced", message),
        GuardedError::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, "not_found", message),
        GuardedError::CannotApply { .. } => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "cannot_apply", message)
        }
        GuardedError::WrongGuard { .. } => ApiError::internal(message),
        GuardedError::Store(EsError::TooManyRequests { .. }) => {
            ApiError::unavailable("es_overloaded", message)
        }
        GuardedError::Store(EsError::Server { .. } | EsError::Transport { .. }) => {
            ApiError::unavailable("es_unavailable", message)
        }
        GuardedError::Store(EsError::BadRequest { .. } | EsError::NotFound { .. }) => {
            ApiError::bad("es_rejected", message)
        }
        GuardedError::Store(_) => ApiError::unavailable("es_unavailable", message),
        _ => ApiError::internal(message),
    }
}
