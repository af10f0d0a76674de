//! The checker on hand-made histories: a correct one passes, and each kind of violation is
//! found (the checker can fail).

use super::checker::check;
use super::history::{Class, Ev, Event, FaultKind, Outcome, Target};
use super::ms;

/// Builds histories; instants in milliseconds.
#[derive(Default)]
struct H {
    events: Vec<Event>,
    next_write: u64,
}

impl H {
    fn ev(&mut self, at_ms: u64, ev: Ev) -> &mut Self {
        self.events.push(Event { at: ms(at_ms), ev });
        self
    }

    /// A whole operation: called at `call`, granted `token` at `acq`, ends at `end` and is
    /// released normally.
    fn hold(
        &mut self,
        op: u64,
        client: &str,
        class: Class,
        (call, acq, end): (u64, u64, u64),
        token: u64,
    ) -> &mut Self {
        self.ev(
            call,
            Ev::Call {
                op,
                client: client.into(),
                monitor: "m".into(),
                class,
                queued_by: Some(ms(call)),
            },
        )
        .ev(acq, Ev::Acquired { op, token })
        .ev(end, Ev::HoldEnd { op })
        .ev(end + 1, Ev::Released { op, ok: true })
    }

    fn write(
        &mut self,
        op: u64,
        token: u64,
        (sent, done): (u64, u64),
        outcome: Outcome,
    ) -> &mut Self {
        self.next_write += 1;
        let w = 1000 + self.next_write;
        self.ev(
            sent,
            Ev::WriteSent {
                w,
                op,
                doc: "m".into(),
                token,
            },
        )
        .ev(done, Ev::WriteDone { w, outcome })
    }

    fn fault(&mut self, fault: u64, client: &str, (start, heal): (u64, u64)) -> &mut Self {
        self.ev(
            start,
            Ev::FaultStart {
                fault,
                kind: FaultKind::PausedProcess,
                target: Target::Client(client.into()),
            },
        )
        .ev(
            heal,
            Ev::FaultEnd {
                fault,
                injected: true,
            },
        )
    }

    /// The end of the run: nothing left, the document at `version`.
    fn finish(&mut self, version: Option<u64>) -> Vec<Event> {
        self.ev(
            100_000,
            Ev::Leftovers {
                stage: "after the run".into(),
                nodes: vec![],
            },
        )
        .ev(
            100_001,
            Ev::FinalVersion {
                doc: "m".into(),
                version,
            },
        );
        self.events.clone()
    }
}

fn violations(events: &[Event]) -> Vec<String> {
    check(events).violations
}

fn assert_one(events: &[Event], prefix: &str) {
    let v = violations(events);
    assert!(
        v.iter().any(|m| m.starts_with(prefix)),
        "expected a `{prefix}` violation, got {v:#?}"
    );
}

/// Two holders one after the other, the foreground one first, the background one queued behind.
fn sound() -> H {
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 10, 100), 10)
        .write(1, 10, (20, 30), Outcome::Accepted)
        .hold(2, "s1", Class::Background, (50, 110, 200), 12)
        .write(2, 12, (120, 130), Outcome::Accepted);
    h
}

#[test]
fn a_sound_history_passes() {
    let events = sound().finish(Some(12));
    let r = check(&events);
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.counts.acquisitions_foreground, 1);
    assert_eq!(r.counts.acquisitions_background, 1);
    assert_eq!(r.counts.writes_accepted, 2);
}

#[test]
fn overlapping_holds_without_a_fault_are_found() {
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 10, 300), 10).hold(
        2,
        "s1",
        Class::Foreground,
        (50, 200, 400),
        12,
    );
    assert_one(&h.finish(None), "exclusion");
}

#[test]
fn an_overlap_under_the_stale_holders_fault_passes_only_if_it_was_fenced() {
    // s0 holds from 10 to 3000 (paused from 100 to 2900); s1 gets the lock at 2200.
    let base = || {
        let mut h = H::default();
        h.hold(1, "c0", Class::Foreground, (0, 10, 3000), 10)
            .fault(7, "c0", (100, 2900))
            .hold(2, "s1", Class::Foreground, (50, 2200, 2400), 12)
            .write(2, 12, (2210, 2220), Outcome::Accepted);
        h
    };
    let mut fenced = base();
    fenced.write(1, 10, (2950, 2960), Outcome::Rejected);
    let r = check(&fenced.finish(Some(12)));
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.counts.overlaps_under_faults, 1);
    assert_eq!(r.counts.stale_writes_fenced, 1);

    let mut not_fenced = base();
    not_fenced.write(1, 10, (2950, 2960), Outcome::Accepted);
    let v = violations(&not_fenced.finish(Some(12)));
    assert!(
        v.iter().any(|m| m.contains("stale holder")),
        "expected the stale write to be named: {v:#?}"
    );

    // The fault on the newer holder does not excuse the overlap.
    let mut h = H::default();
    h.hold(1, "c0", Class::Foreground, (0, 10, 3000), 10)
        .fault(7, "s1", (100, 2900))
        .hold(2, "s1", Class::Foreground, (50, 2200, 2400), 12);
    assert_one(&h.finish(None), "exclusion");
}

#[test]
fn a_lower_token_accepted_after_a_higher_one_is_found() {
    let mut h = sound();
    // Token 10 accepted at 150, after 12 had been accepted at 130.
    h.write(1, 10, (140, 150), Outcome::Accepted);
    assert_one(&h.finish(Some(12)), "elasticsearch");
}

#[test]
fn a_final_version_other_than_the_highest_accepted_token_is_found() {
    assert_one(&sound().finish(Some(10)), "elasticsearch");
    assert_one(&sound().finish(None), "elasticsearch");
}

#[test]
fn a_rejection_with_no_higher_token_is_found() {
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 10, 100), 10)
        .write(1, 10, (20, 30), Outcome::Rejected);
    assert_one(&h.finish(None), "elasticsearch");
}

#[test]
fn a_background_hold_overtaking_a_waiting_foreground_contender_in_a_quiet_window_is_found() {
    // s0 holds until 100 and releases; the foreground contender queued at 20, the background
    // one at 30: the background one takes the lock at 110 with a lower token.
    let overtaking = || {
        let mut h = H::default();
        h.hold(1, "s0", Class::Foreground, (0, 5, 400), 10)
            .hold(2, "s1", Class::Foreground, (20, 700, 800), 14)
            .hold(3, "s2", Class::Background, (30, 410, 600), 12);
        h
    };
    assert_one(&overtaking().finish(None), "priority");

    // The same with a fault on the foreground contender while it waited: not judged.
    let mut h = overtaking();
    h.fault(9, "s1", (100, 200));
    let v = violations(&h.finish(None));
    assert!(v.is_empty(), "{v:#?}");

    // Granted late, but it may have taken the lock within the margin after the foreground
    // contender's call (the earlier holder released at 100): not judged either.
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 5, 100), 10)
        .hold(2, "s1", Class::Foreground, (20, 700, 800), 14)
        .hold(3, "s2", Class::Background, (30, 300, 600), 12);
    let r = check(&h.finish(None));
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.counts.priority_undecided, 1);
}

#[test]
fn a_token_lower_than_an_earlier_grant_is_found() {
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 10, 100), 12).hold(
        2,
        "s1",
        Class::Foreground,
        (150, 160, 200),
        10,
    );
    assert_one(&h.finish(None), "tokens");
    let mut h = H::default();
    h.hold(1, "s0", Class::Foreground, (0, 10, 100), 12).hold(
        2,
        "s1",
        Class::Foreground,
        (150, 160, 200),
        12,
    );
    assert_one(&h.finish(None), "tokens");
}

/// A bulk acquisition takes several monitors' locks in one multi: they share its zxid, hence
/// their token. Only a token issued twice on one monitor is a violation (above).
#[test]
fn locks_of_two_monitors_taken_by_one_multi_may_share_a_token() {
    let mut h = H::default();
    h.hold(1, "s0", Class::Background, (0, 10, 100), 12)
        .ev(
            1,
            Ev::Call {
                op: 2,
                client: "s0".into(),
                monitor: "n".into(),
                class: Class::Background,
                queued_by: Some(ms(1)),
            },
        )
        .ev(10, Ev::Acquired { op: 2, token: 12 })
        .ev(100, Ev::HoldEnd { op: 2 })
        .ev(101, Ev::Released { op: 2, ok: true });
    let v = violations(&h.finish(None));
    assert!(v.is_empty(), "{v:#?}");
}

#[test]
fn a_node_left_behind_is_found() {
    let mut events = sound().finish(Some(12));
    events.push(Event {
        at: ms(100_002),
        ev: Ev::Leftovers {
            stage: "after every session closed".into(),
            nodes: vec!["/zkguard/locks/m/B-0000000003".into()],
        },
    });
    assert_one(&events, "leftovers");
    let mut h = sound();
    let unlisted: Vec<Event> = h
        .finish(Some(12))
        .into_iter()
        .filter(|e| !matches!(e.ev, Ev::Leftovers { .. }))
        .collect();
    assert_one(&unlisted, "leftovers");
}

#[test]
fn a_background_hold_taken_after_a_foreground_queue_node_was_created_is_found() {
    // The foreground contender's queue node was created at zxid 11, the background one took
    // the mutex at 12 (after the holder before released at 400), the foreground one got it at
    // 14. The foreground contender called at `fg_call`.
    let taken_after = |queued: u64, fg_call: u64| {
        let mut h = H::default();
        h.hold(1, "s0", Class::Foreground, (0, 5, 400), 10)
            .hold(2, "s1", Class::Foreground, (fg_call, 700, 800), 14)
            .ev(
                700,
                Ev::Queued {
                    op: 2,
                    node: "A-0000000003".into(),
                    token: queued,
                },
            )
            .hold(3, "s2", Class::Background, (50, 410, 600), 12);
        h
    };
    // Called long before the take: a violation, by the zxids alone.
    assert_one(&taken_after(11, 60).finish(None), "priority");
    // Queued after the take: rightly behind it.
    let v = violations(&taken_after(13, 60).finish(None));
    assert!(v.is_empty(), "{v:#?}");
    // Called within the margin before the take, its node in place before the take: an overtake
    // too (a background contender verifies the queue when it takes the mutex).
    let r = check(&taken_after(11, 300).finish(None));
    assert!(r.violations.iter().any(|m| m.starts_with("priority")));
}
