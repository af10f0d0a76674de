//! The document's frame (title, tags, security, schemas) and what every `/v1` route shares
//! (the answers of the access, load and body checks that run before any handler).

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{OpenApi, Ref, RefOr};

/// The frame the routes are added to.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "zkguard",
        description = "Elasticsearch writes under ZooKeeper priority locks: at most one writer per object at a time, foreground before background, every write fenced with its lock's token, background work retried and parked in a dead-letter sink, never lost.\n\nErrors are `{\"error\": KIND, \"message\": TEXT}`: the kind is stable and machine-readable, the message says what was wrong and what to do. With `server.auth.tokens.file` set, every `/v1` route (and `/openapi.json`, `/docs`) needs `Authorization: Bearer <token>`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "writes", description = "Document writes under the document's lock, and their outcomes."),
        (name = "locks", description = "Explicit locks held for the caller, and the lock table."),
        (name = "deadletters", description = "Background operations that could not be applied."),
        (name = "transfers", description = "Two-phase-commit transfers between account documents."),
        (name = "transactions", description = "Several document writes, in any indices, applied all or nothing."),
        (name = "operations", description = "Health, readiness and metrics for operators."),
    ),
    components(schemas(
        super::Error, super::Written, super::WriteResult, super::Accepted, super::OpStatus,
        super::Operation, super::BulkAccepted, super::Lock, super::LockTypeName, super::Released,
        super::MonitorState, super::Contender, super::DeadLetter, super::ReplayRequest,
        super::ReplayReport, super::ReplayResult, super::Discarded, super::TransferRequest,
        super::TxnBody, super::TxnOperation, super::TxnOutcome, super::TxnDocument, super::TxnStatus,
        super::Transaction, super::RolledBack, super::Status,
    ))
)]
struct Frame;

/// The document before the routes are added.
pub fn base() -> OpenApi {
    let mut api = <Frame as utoipa::OpenApi>::openapi();
    api.info.version = env!("CARGO_PKG_VERSION").to_string();
    let components = api.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token from server.auth.tokens.file, when the service has one; without it the API is open (on loopback only, unless told otherwise).",
                ))
                .build(),
        ),
    );
    api
}

/// An error answer with `description`, and `Retry-After` when `retry`.
fn error(description: &str, retry: bool) -> Response {
    let mut r = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Error")))
            .build(),
    );
    if retry {
        r = r.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::Integer))
                .description(Some("Seconds to wait before sending the request again."))
                .build(),
        );
    }
    r.build()
}

/// Adds what every `/v1` route answers before (or beside) its handler: bearer tokens, the body
/// checks, the load limits and the request timeout.
pub fn finish(mut api: OpenApi) -> OpenApi {
    let shared: [(&str, Response); 5] = [
        ("400", error("A malformed request: `error` names what (`bad_parameter`, `bad_path`, `malformed_json`, `bad_body`, ...) and the message how to fix it.", false)),
        ("401", error("`unauthorized`: the service requires a bearer token (server.auth.tokens.file) and none, or an unknown one, was sent.", false)),
        ("408", error("`body_timeout`: the request's body did not arrive within server.body.timeout; the connection is closed.", false)),
        ("413", error("`body_too_large`: the body is larger than server.max.body.", false)),
        ("503", error("`overloaded` (server.max.concurrent requests at once), `too_many_waiters` (server.wait.max), `shutting_down`, `request_timeout` (longer than server.request.timeout: a write may or may not have been applied, send it again with the same op_id, a transaction with the same id), or the route's own (see the route).", true)),
    ];
    let secured = vec![
        SecurityRequirement::new("bearer", Vec::<String>::new()),
        SecurityRequirement::default(),
    ];
    for (path, item) in api.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            op.security = Some(secured.clone());
            for (status, answer) in &shared {
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| RefOr::T(answer.clone()));
            }
        }
    }
    api
}
