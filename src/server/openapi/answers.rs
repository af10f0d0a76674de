//! The answers of the write routes, shared by `PUT`, `PATCH` and `DELETE`.

use utoipa::IntoResponses;

use super::{Accepted, Error, Written};

/// What a document write answers.
#[derive(IntoResponses)]
pub enum WriteAnswers {
    /// Foreground: the write is applied (lock, fenced write, release: one attempt).
    #[response(status = 200)]
    Written(Written),
    /// Background (`type=background`): the operation is journaled (fsynced) and queued; follow
    /// it with `GET /v1/operations/{id}?wait=10s`.
    #[response(status = 202)]
    Accepted(Accepted),
    /// `protected_index`: one of zkguard's own indices or a system index, not named in
    /// server.index.allow; nothing was done.
    #[response(status = 403)]
    Protected(Error),
    /// `unknown_lock`: no such explicit lock (`lock_id`) is held here; `not_found`: a `PATCH`
    /// without `upsert=true` found no document.
    #[response(status = 404)]
    NotFound(Error),
    /// `fenced`: the document's version is above the write's token (a newer lock holder wrote
    /// it, or a writer outside zkguard); `op_id_reused`: the `op_id` names another operation;
    /// `wrong_lock`: the `lock_id` guards another monitor. Nothing was written.
    #[response(status = 409)]
    Conflict(Error),
    /// `cannot_apply`: the change cannot be applied to the stored document.
    #[response(status = 422)]
    Unprocessable(Error),
    /// `lock_timeout`: the lock was not acquired within the timeout; nothing was written.
    #[response(status = 423, headers(("Retry-After" = u64, description = "Seconds to wait before sending the request again.")))]
    Locked(Error),
    /// `lock_unavailable`, `lock_lost`, `es_unavailable`, `es_overloaded` (foreground),
    /// `queue_full`, `journal_unavailable` (background), or one every route shares
    /// (`overloaded`, `request_timeout`, ...). Send it again, with the same `op_id`, after
    /// `Retry-After`.
    #[response(status = 503, headers(("Retry-After" = u64, description = "Seconds to wait before sending the request again.")))]
    Unavailable(Error),
}
