//! Tests of the journal: its lock, damage, compaction and group commit.

use super::*;
use serde_json::json;

/// A second service whose journal path is a symbolic link to a journal in use is refused,
/// as one naming the file itself: the lock is taken on the resolved file.
#[test]
fn a_journal_reached_through_a_symbolic_link_is_in_use_too() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("journal.jsonl");
    let (_first, _) = Journal::open(&real, false).unwrap();
    let link = dir.path().join("other-name.jsonl");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    match Journal::open(&link, false) {
        Err(JournalError::InUse { path, .. }) => assert_eq!(path, real),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second journal over the same file was opened"),
    }
    let linked_dir = dir.path().join("linked-dir");
    std::os::unix::fs::symlink(dir.path(), &linked_dir).unwrap();
    assert!(matches!(
        Journal::open(&linked_dir.join("journal.jsonl"), false),
        Err(JournalError::InUse { .. })
    ));
}

fn op(n: u32) -> Operation {
    Operation::index("m", "idx", format!("d{n}"), json!({"n": n}))
}

/// Only the last line can be cut short by a crash: a line that cannot be read before other
/// lines is corruption. The journal then refuses to open, naming the line and a copy of the
/// file it kept, unless told to skip such lines; a torn last line is skipped as before.
#[test]
fn a_bad_line_before_others_is_corruption_and_a_torn_last_line_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let accepted =
        |o: Operation| serde_json::to_string(&Record::Accepted { ops: vec![o] }).unwrap();
    let (a, b) = (op(1), op(2));
    let text = format!(
        "{}\n{{\"r\":\"acc\n{}\n",
        accepted(a.clone()),
        accepted(b.clone())
    );
    std::fs::write(&path, &text).unwrap();
    // (A journal's lock lasts as long as the process: each open below uses a file of its own.)
    let message = match Journal::open(&path, false) {
        Err(e @ JournalError::Corrupt { .. }) => {
            let JournalError::Corrupt { line, copy, .. } = &e else {
                unreachable!()
            };
            assert_eq!(*line, 2);
            assert_eq!(
                std::fs::read_to_string(copy).unwrap(),
                text,
                "the copy kept"
            );
            e.to_string()
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a journal with a bad line in its middle was opened"),
    };
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "left as it was"
    );
    assert!(
        message.contains("line 2") && message.contains("server.journal.skip.corrupt"),
        "{message}"
    );
    let skipping = dir.path().join("skipping.jsonl");
    std::fs::write(&skipping, &text).unwrap();
    let (_, pending) = Journal::open(&skipping, true).unwrap();
    assert_eq!(
        pending.iter().map(|o| o.id).collect::<Vec<_>>(),
        [a.id, b.id]
    );

    let torn = dir.path().join("torn.jsonl");
    std::fs::write(&torn, format!("{}\n{{\"r\":\"acc", accepted(op(3)))).unwrap();
    let (_, pending) = Journal::open(&torn, false).unwrap();
    assert_eq!(pending.len(), 1, "a torn last line is skipped");
}

#[tokio::test]
async fn unfinished_operations_come_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (a, b, c) = (op(1), op(2), op(3));
    {
        let (j, pending) = Journal::open(&path, false).unwrap();
        assert!(pending.is_empty());
        let fresh = j.accept(vec![a.clone(), b.clone()]).await.unwrap();
        assert_eq!(fresh.len(), 2);
        // The same id again is not journaled twice.
        assert!(j.accept(vec![a.clone()]).await.unwrap().is_empty());
        j.accept(vec![c.clone()]).await.unwrap();
        j.finish(Finished {
            id: b.id,
            status: OpState::Applied,
            reason: None,
            token: Some(7),
            already_applied: false,
            attempts: Some(1),
            fingerprint: None,
            key: None,
        })
        .await
        .unwrap();
        assert_eq!(j.depth(), 2);
        // A second service cannot open the same journal.
        assert!(matches!(
            Journal::open(&path, false),
            Err(JournalError::InUse { .. })
        ));
    }
    // A torn line at the end (a crash in the middle of a write) is skipped.
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    // (cut inside the two bytes of `é`)
    f.write_all(b"{\"r\":\"accepted\",\"ops\":[{\"info\":\"caf\xc3")
        .unwrap();
    drop(f);
    // The lock of the first journal is held by this process for good; test reopening
    // through a copy, as a restarted process would see the file.
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&path, &copy).unwrap();
    let (j, pending) = Journal::open(&copy, false).unwrap();
    assert_eq!(
        pending.iter().map(|o| o.id).collect::<Vec<_>>(),
        vec![a.id, c.id]
    );
    assert_eq!(j.get(&b.id).unwrap().state(), OpState::Applied);
    assert_eq!(j.get(&a.id).unwrap().state(), OpState::Queued);
    // Compacted at open: one outcome line and one batch line.
    let text = std::fs::read_to_string(&copy).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
}

#[tokio::test]
async fn the_journal_is_compacted_while_it_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (j, _) = Journal::open(&path, false).unwrap();
    let mut j = Arc::try_unwrap(j).unwrap();
    j.compact_every = 10;
    let j = Arc::new(j);
    let queued = op(0);
    j.accept(vec![queued.clone()]).await.unwrap();
    let mut done = Vec::new();
    for n in 1..=25 {
        let o = op(n);
        done.push(o.id);
        j.accept(vec![o.clone()]).await.unwrap();
        j.finish(Finished {
            id: o.id,
            status: OpState::Applied,
            reason: None,
            token: Some(u64::from(n)),
            already_applied: false,
            attempts: Some(1),
            fingerprint: None,
            key: None,
        })
        .await
        .unwrap();
    }
    let lines = std::fs::read_to_string(&path).unwrap().lines().count();
    // 51 lines were appended; compactions keep outcomes plus one batch of the queued one.
    assert!(lines < 51, "{lines} lines");
    drop(j);
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&path, &copy).unwrap();
    let (j, pending) = Journal::open(&copy, false).unwrap();
    assert_eq!(
        pending.iter().map(|o| o.id).collect::<Vec<_>>(),
        vec![queued.id]
    );
    assert_eq!(j.depth(), 1);
    assert_eq!(j.get(&queued.id).unwrap().state(), OpState::Queued);
    for id in &done {
        assert_eq!(j.get(id).unwrap().state(), OpState::Applied);
    }
}

/// One `fsync` covers every line written before it: requests whose lines it covered return
/// without one of their own, and each line is durable (found again after a restart).
#[tokio::test]
async fn an_fsync_covers_every_line_written_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (j, _) = Journal::open(&path, false).unwrap();
    let ops: Vec<Operation> = (0..8).map(op).collect();
    // Eight lines written while no fsync ran (as by requests that arrive together).
    let seqs: Vec<u64> = {
        let mut inner = j.lock();
        ops.iter()
            .map(|o| {
                let line = serde_json::to_string(&Record::Accepted {
                    ops: vec![o.clone()],
                })
                .unwrap();
                j.append(&mut inner, &line).unwrap()
            })
            .collect()
    };
    // The last request's fsync covers all eight; the others need none.
    j.sync_through(*seqs.last().unwrap()).unwrap();
    for seq in &seqs {
        j.sync_through(*seq).unwrap();
    }
    assert_eq!(j.fsyncs(), 1);
    // A line written later needs an fsync of its own.
    j.accept(vec![op(8)]).await.unwrap();
    assert_eq!(j.fsyncs(), 2);
    drop(j);
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&path, &copy).unwrap();
    let (_, pending) = Journal::open(&copy, false).unwrap();
    assert_eq!(pending.len(), 9);
}

/// The journal file's bound: an acceptance that would pass it compacts the journal first (the
/// finished operations' lines go), and is refused only when the queued operations alone fill it.
#[tokio::test]
async fn an_acceptance_beyond_the_file_bound_compacts_first_and_is_refused_when_still_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (j, _) = Journal::open(&path, false).unwrap();
    let line = serde_json::to_string(&op(0)).unwrap().len() as u64;
    // Room for the twelve outcomes below (about 120 bytes each, kept by compaction) and about
    // eight operations' lines: without compaction the twelve lines of each would not fit.
    let bound = 8 * line + 1600;
    j.set_limits(Limits {
        file_bytes: bound,
        ..Limits::default()
    });
    // Accept and finish twelve: compactions make room.
    for n in 0..12 {
        let o = op(n);
        j.accept(vec![o.clone()]).await.unwrap();
        j.finish(Finished {
            id: o.id,
            status: OpState::Parked,
            reason: Some("x".into()),
            token: None,
            already_applied: false,
            attempts: Some(1),
            fingerprint: None,
            key: None,
        })
        .await
        .unwrap();
    }
    // Queued operations that are not finished fill it: then it refuses, naming the bound.
    let mut refused = None;
    for n in 100..120 {
        match j.accept(vec![op(n)]).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("the bound was never reached");
    assert!(matches!(e, JournalError::Full { .. }), "{e}");
    assert!(e.to_string().contains("server.journal.max.bytes"), "{e}");
    assert!(std::fs::metadata(&path).unwrap().len() <= bound);
}

/// A compaction while the service runs holds the table only at its start and end: an accept
/// and an outcome made while it writes the new file go through at once, and land in the new
/// file (written to the old one meanwhile, which stays the durable one until the rename).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_go_on_while_the_journal_is_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.jsonl");
    let (j, _) = Journal::open(&path, false).unwrap();
    let mut j = Arc::try_unwrap(j).unwrap();
    j.compact_every = 4;
    // The compaction stops after writing its snapshot until the test lets it go on.
    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    *j.compaction_hook.lock().unwrap() = Some(Box::new(move || {
        reached_tx.send(()).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
    }));
    let j = Arc::new(j);
    let applied = |o: &Operation| Finished {
        id: o.id,
        status: OpState::Applied,
        reason: None,
        token: Some(7),
        already_applied: false,
        attempts: Some(1),
        fingerprint: None,
        key: None,
    };
    let (a, b) = (op(1), op(2));
    j.accept(vec![a.clone()]).await.unwrap();
    j.accept(vec![b.clone()]).await.unwrap();
    j.finish(applied(&a)).await.unwrap();
    // The fourth line makes a compaction due: the finishing thread runs it.
    let compacting = {
        let (j, b) = (j.clone(), b.clone());
        std::thread::spawn(move || j.finish_blocking(applied(&b), true))
    };
    reached_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the compaction reached its hook");
    // Meanwhile: an accept and an outcome, answered while the compaction waits.
    let (c, d) = (op(3), op(4));
    j.accept(vec![c.clone(), d.clone()]).await.unwrap();
    j.finish(applied(&c)).await.unwrap();
    go_tx.send(()).unwrap();
    compacting.join().unwrap().unwrap();

    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&path, &copy).unwrap();
    let (again, pending) = Journal::open(&copy, false).unwrap();
    assert_eq!(pending.iter().map(|o| o.id).collect::<Vec<_>>(), vec![d.id]);
    for o in [&a, &b, &c] {
        assert_eq!(again.get(&o.id).unwrap().state(), OpState::Applied);
    }
    // Compacted: the first three lines became outcomes; the accept made meanwhile follows.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().count() <= 5, "{text}");
}

/// The age of the oldest queued operation (the service's `zkguard_journal_oldest_seconds`) is
/// that of the first one accepted and not finished: it moves on to the next when the first
/// finishes, whatever the order of outcomes, and is gone once none is queued.
#[tokio::test]
async fn the_oldest_queued_operation_is_the_first_not_finished() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&dir.path().join("j.jsonl"), false).unwrap();
    assert_eq!(j.oldest_queued(), None);
    let (a, b, c) = (op(1), op(2), op(3));
    j.accept(vec![a.clone()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    j.accept(vec![b.clone()]).await.unwrap();
    let first = j.oldest_queued().unwrap();
    assert!(first >= Duration::from_millis(300), "{first:?}");
    let done = |id| Finished {
        id,
        status: OpState::Applied,
        reason: None,
        token: Some(7),
        already_applied: false,
        attempts: Some(1),
        fingerprint: None,
        key: None,
    };
    // The newer one finishing first changes nothing.
    j.finish(done(b.id)).await.unwrap();
    assert!(j.oldest_queued().unwrap() >= first);
    let before_c = Instant::now();
    j.accept(vec![c.clone()]).await.unwrap();
    j.finish(done(a.id)).await.unwrap();
    // Now `c`'s age: no more than the time since just before it was accepted.
    let next = j.oldest_queued().unwrap();
    assert!(next <= before_c.elapsed(), "{next:?}");
    j.finish(done(c.id)).await.unwrap();
    assert_eq!(j.oldest_queued(), None);
}
