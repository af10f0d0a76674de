//! The service's process controls (limits, arguments, signals, kills) and the checks of parked
//! operations and of stored documents that only the service's tests use; the service binary
//! declares this file beside `mod.rs`.

use std::collections::{HashMap, HashSet};

use reqwest::{Client, Method, StatusCode};

use crate::serve_support::{call, es_doc, wait_finished, Env, Service};

impl Env {
    /// Runs the service under a file-size limit of `n` bytes (`ulimit -f`): a journal that
    /// reaches it cannot be appended to, as on a full disk.
    pub fn file_size(mut self, n: Option<u64>) -> Self {
        self.file_size = n;
        self
    }

    /// Runs the service under an open-files limit of `n` (`ulimit -n`).
    pub fn open_files(mut self, n: u64) -> Self {
        self.open_files = Some(n);
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }
}

impl Service {
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parks one background operation on `index`: a patch of a document that does not exist,
/// which can never apply. Returns its operation id once the service says it is parked.
pub async fn park_one(c: &Client, s: &Service, index: &str) -> String {
    let (status, v) = call(
        c,
        Method::PATCH,
        &s.url(&format!("/v1/indices/{index}/docs/gone?type=background")),
        Some(serde_json::json!({"views": 1}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["operation_id"].as_str().unwrap().to_string();
    let done = wait_finished(c, s, std::slice::from_ref(&id)).await;
    assert_eq!(done[&id]["status"], "parked", "{:?}", done[&id]);
    id
}

/// The fencing token an `applied` outcome (`GET /v1/operations/{id}`, or a foreground answer)
/// reports: the token of the write that applied the operation. `None` only for one found
/// already applied in a document that no longer tells which write applied it, which the
/// outcome says (`already_applied`).
pub fn outcome_token(v: &serde_json::Value) -> Option<u64> {
    let token = v["token"].as_u64();
    assert!(
        token.is_some() || v["already_applied"] == true,
        "an applied outcome without a token says it was found already applied: {v}"
    );
    token
}

/// Checks one document against the writes that were answered as done (with the tokens their
/// outcomes report, [`outcome_token`]): every one of them is recorded in the document exactly
/// once (none lost, none applied twice) and, in the order they were applied, their fencing
/// tokens never decrease; the stored version is the token of the last one. A token names one
/// lock acquisition: several operations share one when the service applied them one after
/// another under one background acquisition, and then they sit next to each other in the order
/// applied (no other holder wrote in between), which a sequence that never decreases
/// guarantees. Two acquisitions' writes interleaving would show as a decrease. An outcome
/// reports the token of the write that applied its operation, also when a later lock found it
/// applied (a write before a kill, its outcome not recorded): the document's last operation's
/// token is always known, and is the document's version.
pub async fn check_doc(c: &Client, index: &str, id: &str, tokens: &HashMap<String, Option<u64>>) {
    let doc = es_doc(c, index, id).await;
    let ops: Vec<String> =
        serde_json::from_value(doc["_source"]["zkguard"]["ops"].clone()).unwrap();
    let unique: HashSet<&String> = ops.iter().collect();
    assert_eq!(
        unique.len(),
        ops.len(),
        "an operation was applied twice: {ops:?}"
    );
    for op in tokens.keys() {
        assert!(
            ops.contains(op),
            "operation {op} answered as done is missing from {index}/{id}: {ops:?}"
        );
    }
    let applied: Vec<u64> = ops
        .iter()
        .filter_map(|o| tokens.get(o).copied().flatten())
        .collect();
    assert!(
        applied.windows(2).all(|w| w[0] <= w[1]),
        "tokens of {index}/{id} in the order applied decrease: {applied:?}"
    );
    let last = ops.iter().rev().find_map(|o| tokens.get(o));
    assert_eq!(
        doc["_version"].as_u64(),
        last.copied().flatten(),
        "the last operation's outcome reports the token of the write that applied it: {doc}"
    );
}
