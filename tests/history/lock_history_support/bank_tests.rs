//! The bank checker catches each kind of violation, on hand-made histories.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::bank::{check_bank, BankHistory, Outcome, Via, Write, INITIAL};
use super::bank_run::Reply;

fn write(via: Via, key: &str, parts: &[(&str, i64)], outcome: Outcome) -> Write {
    Write {
        via,
        key: key.into(),
        parts: parts.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        tokens: parts.iter().map(|_| None).collect(),
        outcome,
        answer: "test".into(),
    }
}

/// Two accounts after: a deposit `d1` of 5 on `a`, a transfer `t1` of 3 from `a` to `b`, a
/// read-modify-write `r1` of 2 on `b`.
fn good() -> (BankHistory, HashMap<String, Value>) {
    let h = BankHistory {
        writes: vec![
            with_tokens(
                write(Via::GateUpdate, "d1", &[("a", 5)], Outcome::Acked),
                &[10],
            ),
            with_tokens(
                write(Via::V1Txn, "t1", &[("a", -3), ("b", 3)], Outcome::Acked),
                &[11, 12],
            ),
            with_tokens(
                write(Via::GateRmw, "r1", &[("b", 2)], Outcome::Acked),
                &[13],
            ),
            write(Via::GateUpdate, "d2", &[("b", 4)], Outcome::Failed),
            write(
                Via::AtomicBulk,
                "t2",
                &[("a", -1), ("b", 1)],
                Outcome::Unknown,
            ),
        ],
        ..Default::default()
    };
    let finals = HashMap::from([
        (
            "a".to_string(),
            json!({"balance": INITIAL, "credits": {"d1": 5, "t1": -3}, "rmw": {}, "last": "t1"}),
        ),
        (
            "b".to_string(),
            json!({"balance": INITIAL + 2, "credits": {"t1": 3}, "rmw": {"r1": 2}, "last": "r1"}),
        ),
    ]);
    (h, finals)
}

/// `w` acknowledged with these tokens.
fn with_tokens(mut w: Write, tokens: &[u64]) -> Write {
    w.tokens = tokens.iter().map(|t| Some(*t)).collect();
    w
}

fn violations(h: &BankHistory, finals: &HashMap<String, Value>) -> Vec<String> {
    check_bank(h, finals).violations
}

#[test]
fn a_consistent_history_passes() {
    let (h, finals) = good();
    let r = check_bank(&h, &finals);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.total, 2 * INITIAL + 5 + 2);
    assert_eq!(r.unknown_absent, 1);
}

#[test]
fn a_lost_acknowledged_deposit_is_caught() {
    let (h, mut finals) = good();
    finals.get_mut("a").unwrap()["credits"] = json!({"t1": -3});
    let v = violations(&h, &finals);
    assert!(
        v.iter().any(|e| e.contains("d1") && e.contains("lost")),
        "{v:?}"
    );
}

#[test]
fn a_failed_write_found_applied_is_caught() {
    let (h, mut finals) = good();
    finals.get_mut("b").unwrap()["credits"]["d2"] = json!(4);
    let v = violations(&h, &finals);
    assert!(
        v.iter()
            .any(|e| e.contains("d2") && e.contains("not applied")),
        "{v:?}"
    );
}

#[test]
fn a_half_applied_transfer_is_caught() {
    let (h, mut finals) = good();
    finals.get_mut("a").unwrap()["credits"]["t2"] = json!(-1);
    let v = violations(&h, &finals);
    assert!(
        v.iter()
            .any(|e| e.contains("t2") && e.contains("half applied")),
        "{v:?}"
    );
    assert!(v.iter().any(|e| e.contains("conserve")), "{v:?}");
}

#[test]
fn a_doubled_or_lost_read_modify_write_is_caught_by_the_balance() {
    let (h, mut finals) = good();
    finals.get_mut("b").unwrap()["balance"] = json!(INITIAL + 4);
    let v = violations(&h, &finals);
    assert!(v.iter().any(|e| e.contains("b: balance")), "{v:?}");
}

#[test]
fn a_mark_left_on_a_settled_account_is_caught() {
    let (h, mut finals) = good();
    finals.get_mut("a").unwrap()["zkguard"] = json!({"token": 1, "txn": "t1"});
    let v = violations(&h, &finals);
    assert!(v.iter().any(|e| e.contains("mark of transaction")), "{v:?}");
}

#[test]
fn an_unknown_transaction_must_match_its_logged_decision() {
    let (mut h, finals) = good();
    h.decisions.insert("t2".into(), "committed".into());
    let v = violations(&h, &finals);
    assert!(
        v.iter().any(|e| e.contains("t2") && e.contains("lost")),
        "{v:?}"
    );
    h.decisions.insert("t1".into(), "rolled-back".into());
    let v = violations(&h, &finals);
    assert!(
        v.iter()
            .any(|e| e.contains("t1") && e.contains("rolled-back")),
        "{v:?}"
    );
}

#[test]
fn a_background_operation_neither_applied_nor_parked_is_caught() {
    let (mut h, mut finals) = good();
    h.writes
        .push(write(Via::V1Background, "b1", &[("a", 7)], Outcome::Acked));
    h.writes
        .push(write(Via::V1Background, "b2", &[("a", 6)], Outcome::Acked));
    h.writes
        .push(write(Via::V1Background, "b3", &[("b", 1)], Outcome::Acked));
    h.background.insert("b1".into(), "applied".into());
    h.background.insert("b2".into(), "parked".into());
    h.background.insert("b3".into(), "unknown".into());
    finals.get_mut("a").unwrap()["credits"]["b1"] = json!(7);
    let v = violations(&h, &finals);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("b3") && v[0].contains("neither applied nor parked"),
        "{v:?}"
    );
    // Applied, but not in the document: lost.
    finals.get_mut("a").unwrap()["credits"] = json!({"d1": 5, "t1": -3});
    let v = violations(&h, &finals);
    assert!(
        v.iter().any(|e| e.contains("b1") && e.contains("lost")),
        "{v:?}"
    );
}

#[test]
fn a_key_no_client_wrote_is_caught() {
    let (h, mut finals) = good();
    finals.get_mut("b").unwrap()["credits"]["zz"] = json!(0);
    let v = violations(&h, &finals);
    assert!(v.iter().any(|e| e.contains("written by no one")), "{v:?}");
}

#[test]
fn an_older_write_over_a_newer_one_is_caught_by_token_order() {
    let (h, mut finals) = good();
    // d1 (token 10) shown last although t1 (token 11) was acknowledged after it on a.
    finals.get_mut("a").unwrap()["last"] = json!("d1");
    let v = violations(&h, &finals);
    assert!(v.iter().any(|e| e.contains("a: the last write")), "{v:?}");
    // A write whose answer was lost may be the last one; a failed one may not.
    finals.get_mut("a").unwrap()["last"] = json!("t2");
    finals.get_mut("a").unwrap()["credits"]["t2"] = json!(-1);
    finals.get_mut("b").unwrap()["credits"]["t2"] = json!(1);
    assert!(violations(&h, &finals).is_empty());
    finals.get_mut("b").unwrap()["last"] = json!("d2");
    let v = violations(&h, &finals);
    assert!(v.iter().any(|e| e.contains("b: the last write")), "{v:?}");
}

/// A lost lock's 503 says nothing was written only when the lock was lost before the write was
/// sent; lost while the write was under way (the gate's and `/v1`'s same error type), the
/// cluster took the write and it may be in the document: its outcome is unknown.
#[test]
fn a_lock_lost_while_the_write_was_under_way_is_an_unknown_outcome() {
    use reqwest::StatusCode;
    let unavailable = |v: Value| Reply::Answered(StatusCode::SERVICE_UNAVAILABLE, v).outcome();
    let gate = |reason: &str| json!({"error": {"type": "zkguard_lock_lost_exception", "reason": reason}, "status": 503});
    assert_eq!(
        unavailable(gate("zkguard: the lock on `m` was lost before the write was sent (x); nothing was written, send it again")),
        Outcome::Failed
    );
    assert_eq!(
        unavailable(gate("zkguard: the lock on `m` was lost while the write was on its way to the cluster (x); the cluster took it, ...")),
        Outcome::Unknown
    );
    let v1 = |message: &str| json!({"error": "lock_lost", "message": message});
    assert_eq!(
        unavailable(v1(
            "the lock on `m` was lost before the write to i/1 was sent (x); nothing was written"
        )),
        Outcome::Failed
    );
    assert_eq!(
        unavailable(v1("the lock on `m` was lost while the write to i/1 was under way (x); Elasticsearch took it, ...")),
        Outcome::Unknown
    );
    assert_eq!(
        unavailable(
            json!({"error": {"type": "zkguard_lock_unavailable_exception", "reason": "r"}})
        ),
        Outcome::Failed
    );
}
