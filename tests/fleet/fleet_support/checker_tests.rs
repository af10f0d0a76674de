//! The checker's own tests: a clean history passes, and each kind of violation (lost,
//! doubled, out of order, wrong body, foreign, decreasing tokens, not applied, slow takeover,
//! a journal not drained or short of records) is caught, and a takeover is told by its lock's
//! token (a paused instance that takes its partition back under a new lock counts, one going
//! on under its old lock does not).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use super::checker::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Operation `id` on document `d`, sent at `sent` ms and accepted at `acked` ms.
fn op(id: &str, d: &str, sent: u64, acked: u64) -> Sent {
    Sent {
        id: id.into(),
        doc: d.into(),
        payload: json!({"op": id}),
        via: 0,
        request: sent,
        line: 0,
        sent: ms(sent),
        answer: Answer::Accepted(ms(acked)),
    }
}

fn doc(d: &str, applied: &[&str]) -> FinalDoc {
    FinalDoc {
        doc: d.into(),
        body: applied.last().map(|id| json!({"op": id})),
        applied: applied.iter().map(|s| s.to_string()).collect(),
    }
}

fn applied(ids: &[(&str, u64)]) -> HashMap<String, Outcome> {
    ids.iter()
        .map(|(id, token)| {
            (
                id.to_string(),
                Outcome {
                    status: "applied".into(),
                    token: Some(*token),
                    asked: 0,
                },
            )
        })
        .collect()
}

fn check(sent: &[Sent], docs: &[FinalDoc], outcomes: &HashMap<String, Outcome>) -> Vec<Violation> {
    check_documents(sent, docs, outcomes, 100).violations
}

#[test]
fn a_clean_history_passes() {
    // b and c overlap (either order is fine); d is sent after both were acknowledged.
    let sent = [
        op("a", "x", 0, 5),
        op("b", "x", 10, 30),
        op("c", "x", 12, 20),
        op("d", "x", 40, 45),
    ];
    let outcomes = applied(&[("a", 1), ("b", 2), ("c", 2), ("d", 3)]);
    let docs = [doc("x", &["a", "c", "b", "d"])];
    let report = check_documents(&sent, &docs, &outcomes, 100);
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.accepted, 4);
}

#[test]
fn a_lost_operation_is_caught() {
    let sent = [op("a", "x", 0, 5), op("b", "x", 10, 15)];
    let outcomes = applied(&[("a", 1), ("b", 2)]);
    let v = check(&sent, &[doc("x", &["b"])], &outcomes);
    assert!(v.contains(&Violation::Lost {
        op: "a".into(),
        doc: "x".into()
    }));
}

#[test]
fn a_doubled_operation_is_caught() {
    let sent = [op("a", "x", 0, 5), op("b", "x", 10, 15)];
    let outcomes = applied(&[("a", 1), ("b", 2)]);
    let v = check(&sent, &[doc("x", &["a", "b", "a"])], &outcomes);
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::Doubled { op, times: 2, .. } if op == "a")),
        "{v:?}"
    );
}

#[test]
fn operations_out_of_acceptance_order_are_caught() {
    // b was sent after a's 202, yet applied first.
    let sent = [op("a", "x", 0, 5), op("b", "x", 10, 15)];
    let outcomes = applied(&[("a", 1), ("b", 1)]);
    let v = check(&sent, &[doc("x", &["b", "a"])], &outcomes);
    assert!(v.contains(&Violation::OutOfOrder {
        doc: "x".into(),
        earlier: "a".into(),
        later: "b".into()
    }));
}

#[test]
fn bulk_lines_out_of_line_order_are_caught() {
    let mut a = op("a", "x", 0, 5);
    let mut b = op("b", "x", 0, 5);
    (a.request, a.line) = (7, 0);
    (b.request, b.line) = (7, 1);
    let outcomes = applied(&[("a", 1), ("b", 1)]);
    assert_eq!(
        check(&[a.clone(), b.clone()], &[doc("x", &["a", "b"])], &outcomes),
        vec![]
    );
    let v = check(&[a, b], &[doc("x", &["b", "a"])], &outcomes);
    assert!(
        v.iter().any(|v| matches!(v, Violation::OutOfOrder { .. })),
        "{v:?}"
    );
}

#[test]
fn a_document_not_holding_its_last_write_is_caught() {
    let sent = [op("a", "x", 0, 5), op("b", "x", 10, 15)];
    let outcomes = applied(&[("a", 1), ("b", 2)]);
    let mut d = doc("x", &["a", "b"]);
    d.body = Some(json!({"op": "a"}));
    let v = check(&sent, &[d], &outcomes);
    assert!(
        v.iter().any(|v| matches!(v, Violation::WrongBody { .. })),
        "{v:?}"
    );
}

#[test]
fn refused_and_unsent_operations_in_a_document_are_caught() {
    let mut r = op("r", "x", 0, 5);
    r.answer = Answer::Refused;
    let outcomes = applied(&[]);
    let v = check(&[r], &[doc("x", &["r", "ghost"])], &outcomes);
    assert!(v.contains(&Violation::Foreign {
        op: "r".into(),
        doc: "x".into()
    }));
    assert!(v.contains(&Violation::Foreign {
        op: "ghost".into(),
        doc: "x".into()
    }));
}

#[test]
fn an_unknown_outcome_may_be_applied_once_or_not_at_all() {
    let mut u = op("u", "x", 0, 5);
    u.answer = Answer::Unknown;
    let a = op("a", "x", 1, 3);
    let outcomes = applied(&[("a", 1), ("u", 1)]);
    assert_eq!(
        check(&[u.clone(), a.clone()], &[doc("x", &["a"])], &outcomes),
        vec![]
    );
    let report = check_documents(
        &[u.clone(), a.clone()],
        &[doc("x", &["a", "u"])],
        &outcomes,
        100,
    );
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.unknown_applied, 1);
    let v = check(&[u, a], &[doc("x", &["u", "a", "u"])], &outcomes);
    assert!(
        v.iter().any(|v| matches!(v, Violation::Doubled { .. })),
        "{v:?}"
    );
}

#[test]
fn a_write_refused_while_the_broker_was_down_may_be_applied_once_or_not_at_all() {
    // u got 503 journal_unavailable: not lost when missing, yet its record may have been
    // appended (its produce timed out at the instance): applied once is fine, twice is not.
    let mut u = op("u", "x", 0, 5);
    u.answer = Answer::Unavailable;
    let a = op("a", "x", 10, 12);
    let outcomes = applied(&[("a", 1), ("u", 1)]);
    let report = check_documents(&[u.clone(), a.clone()], &[doc("x", &["a"])], &outcomes, 100);
    assert_eq!(report.violations, vec![]);
    assert_eq!((report.unavailable, report.unavailable_applied), (1, 0));
    let report = check_documents(
        &[u.clone(), a.clone()],
        &[doc("x", &["u", "a"])],
        &outcomes,
        100,
    );
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.unavailable_applied, 1);
    let v = check(
        &[u.clone(), a.clone()],
        &[doc("x", &["u", "a", "u"])],
        &outcomes,
    );
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::Doubled { op, .. } if op == "u")),
        "{v:?}"
    );
    // Its record came after a's (sent after a was acknowledged): applied before a is out of
    // order.
    u.sent = ms(20);
    let v = check(&[u, a], &[doc("x", &["u", "a"])], &outcomes);
    assert!(
        v.iter().any(|v| matches!(v, Violation::OutOfOrder { .. })),
        "{v:?}"
    );
}

#[test]
fn a_decreasing_token_is_caught() {
    // A deposed owner's write after its successor's: its token is the older one.
    let sent = [op("a", "x", 0, 5), op("b", "x", 1, 6)];
    let outcomes = applied(&[("a", 9), ("b", 4)]);
    let v = check(&sent, &[doc("x", &["a", "b"])], &outcomes);
    assert!(
        v.iter().any(|v| matches!(
            v,
            Violation::TokenDecrease {
                token: 4,
                after: 9,
                ..
            }
        )),
        "{v:?}"
    );
}

#[test]
fn an_acknowledged_operation_not_applied_by_its_outcome_is_caught() {
    let sent = [op("a", "x", 0, 5)];
    let mut outcomes = applied(&[("a", 1)]);
    outcomes.get_mut("a").unwrap().status = "parked".into();
    let v = check(&sent, &[doc("x", &["a"])], &outcomes);
    assert!(v.contains(&Violation::NotApplied {
        op: "a".into(),
        status: "parked".into()
    }));
}

#[test]
fn a_document_beyond_its_record_window_is_reported() {
    let sent: Vec<Sent> = (0..5)
        .map(|i| op(&format!("o{i}"), "x", i, i + 1))
        .collect();
    let v = check_documents(&sent, &[doc("x", &["o3", "o4"])], &applied(&[]), 2).violations;
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::WindowExceeded { .. })),
        "{v:?}"
    );
}

fn seen(at: u64, instance: usize, partition: u32, owned_here: bool, committed: i64) -> Seen {
    Seen {
        at: ms(at),
        instance,
        partition,
        owned_here,
        committed,
        token: None,
    }
}

/// A report of partition 0 by `instance`, naming the owner's `token`.
fn seen_t(at: u64, instance: usize, owned_here: bool, committed: i64, token: u64) -> Seen {
    Seen {
        token: Some(token),
        ..seen(at, instance, 0, owned_here, committed)
    }
}

fn pause_of_0_at_500() -> Fault {
    Fault {
        instance: 0,
        at: ms(500),
        kind: "pause",
    }
}

#[test]
fn takeovers_are_measured_from_the_fault_to_the_new_owners_first_commit() {
    let observed = [
        seen(100, 0, 0, true, 10),
        seen(100, 0, 1, false, 3),
        seen(100, 1, 1, true, 3),
        // Instance 1 claims partition 0 before applying anything: not a takeover yet.
        seen(2_000, 1, 0, true, 10),
        seen(3_500, 1, 0, true, 12),
    ];
    let fault = Fault {
        instance: 0,
        at: ms(500),
        kind: "kill",
    };
    let t = takeovers(&observed, std::slice::from_ref(&fault));
    assert_eq!(
        t,
        vec![Takeover {
            fault: fault.clone(),
            partition: 0,
            by: Some((1, ms(3_000)))
        }]
    );
    assert_eq!(slow_takeovers(&t, ms(5_000)), vec![]);
    assert_eq!(slow_takeovers(&t, ms(2_000)).len(), 1);
}

#[test]
fn a_partition_never_taken_over_is_caught() {
    let observed = [seen(100, 0, 2, true, 10), seen(900, 1, 2, false, 10)];
    let fault = Fault {
        instance: 0,
        at: ms(500),
        kind: "pause",
    };
    let t = takeovers(&observed, &[fault]);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].by, None);
    assert!(matches!(
        slow_takeovers(&t, ms(11_000))[..],
        [Violation::SlowTakeover {
            partition: 2,
            instance: 0,
            took: None,
            ..
        }]
    ));
}

#[test]
fn a_paused_instance_that_takes_its_partition_back_under_a_new_lock_is_a_takeover() {
    let observed = [
        seen_t(100, 0, true, 10, 5),
        seen_t(100, 1, false, 10, 5),
        // Instance 1 claims it once the session expired, with nothing to apply yet.
        seen_t(7_000, 1, true, 10, 8),
        // Instance 0 woke with a new session and took it back under a new lock: applied.
        seen_t(11_000, 0, true, 14, 9),
        seen_t(14_000, 1, true, 20, 11),
    ];
    let fault = pause_of_0_at_500();
    let t = takeovers(&observed, std::slice::from_ref(&fault));
    assert_eq!(
        t,
        vec![Takeover {
            fault,
            partition: 0,
            by: Some((0, ms(10_500)))
        }]
    );
    assert_eq!(slow_takeovers(&t, ms(12_200)), vec![]);
}

#[test]
fn a_woken_instance_still_on_its_old_lock_is_no_takeover() {
    let observed = [
        seen_t(100, 0, true, 10, 5),
        // Woken, its session expired without it knowing yet: it applies under its old lock.
        seen_t(9_000, 0, true, 12, 5),
        // A report that names no token tells no new lock either.
        seen(9_200, 0, 0, true, 13),
        seen_t(9_400, 0, false, 13, 5),
        seen_t(12_000, 2, true, 14, 7),
    ];
    let fault = pause_of_0_at_500();
    let t = takeovers(&observed, std::slice::from_ref(&fault));
    assert_eq!(t[0].by, Some((2, ms(11_500))));
    // Without instance 2, the partition was never taken over.
    let t = takeovers(&observed[..4], std::slice::from_ref(&fault));
    assert_eq!(t[0].by, None);
    assert_eq!(slow_takeovers(&t, ms(12_200)).len(), 1);
}

#[test]
fn only_an_owner_whose_lock_came_after_the_faulted_instances_takes_over() {
    // Instance 1 was deposed by instance 0 (token 5 over its 3) and has not noticed: its
    // reports after the fault are not a takeover; instance 2's lock (9) is.
    let observed = [
        seen_t(50, 1, true, 8, 3),
        seen_t(100, 0, true, 10, 5),
        seen_t(1_000, 1, true, 12, 3),
        seen_t(8_000, 2, true, 13, 9),
    ];
    let fault = pause_of_0_at_500();
    let t = takeovers(&observed, std::slice::from_ref(&fault));
    assert_eq!(t[0].by, Some((2, ms(7_500))));
    // Instance 0 had already given the partition to instance 1 (its own report a little old):
    // instance 1's lock predates the fault, and the partition is applied under it.
    let observed = [
        seen_t(100, 0, true, 10, 5),
        seen_t(300, 1, true, 10, 6),
        seen_t(800, 1, true, 11, 6),
    ];
    let t = takeovers(&observed, std::slice::from_ref(&fault));
    assert_eq!(t[0].by, Some((1, ms(300))));
}

fn part(partition: u32, committed: i64, end: i64) -> PartitionEnd {
    PartitionEnd {
        partition,
        committed,
        end,
    }
}

#[test]
fn a_drained_journal_with_its_records_passes() {
    let observed = [seen(100, 0, 0, true, 4), seen(100, 1, 1, true, 7)];
    let parts = [part(0, 5, 5), part(1, 9, 8)];
    assert_eq!(journal_violations(&parts, &observed, 13), vec![]);
}

#[test]
fn a_partition_not_applied_to_its_end_is_caught() {
    // An applier stuck after the broker came back: records left behind its committed offset.
    let v = journal_violations(&[part(0, 5, 5), part(1, 3, 8)], &[], 8);
    assert_eq!(
        v,
        vec![Violation::NotDrained {
            partition: 1,
            committed: 3,
            end: 8
        }]
    );
}

#[test]
fn a_broker_that_lost_records_is_caught() {
    // Offset 12 was committed during the run; after the restart the partition ends at 2.
    let observed = [seen(100, 0, 0, true, 12)];
    let v = journal_violations(&[part(0, 2, 2)], &observed, 2);
    assert_eq!(
        v,
        vec![Violation::EndBelowCommitted {
            partition: 0,
            end: 2,
            committed: 12
        }]
    );
    let v = journal_violations(&[part(0, 2, 2)], &[], 3);
    assert_eq!(
        v,
        vec![Violation::TooFewRecords {
            records: 2,
            applied: 3
        }]
    );
}
