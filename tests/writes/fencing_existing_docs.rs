//! Fencing meets documents that were written before zkguard, or beside it: their versions come
//! from Elasticsearch's internal counter or from another tool's external versions, not from a
//! lock. Real ZooKeeper (standalone, where transaction ids start small) and osmem-server.

use crate::guarded_support;

use serde_json::json;
use zkguard::es::{Refresh, WriteCondition};
use zkguard::write::guarded::{FencedBy, GuardedError, GuardedWriter};
use zkguard::write::ops::{DeleteMode, OpError, Operation, Stamp};
use zkguard::write::stamping::IndexPatterns;
use zkguard::LockRequest;

use guarded_support::{locks, settings_for, shared, store, tag};

/// The first tokens of a standalone ZooKeeper are transaction ids such as 7, 11, 15. A document
/// that a sync tool versioned with a millisecond timestamp (about 1.7 x 10^12), or one that was
/// rewritten many times without zkguard, must still accept the first guarded write: tokens are
/// above every such version, on every ZooKeeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_versioned_before_zkguard_accepts_the_first_guarded_write() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("legacy-{}", tag());
    let millis = 1_763_900_000_000u64;
    es.index(
        &index,
        "ts",
        &json!({"title": "versioned by a sync tool"}),
        WriteCondition::External(millis),
        Refresh::No,
    )
    .await
    .unwrap();
    for _ in 0..3 {
        es.index(
            &index,
            "counted",
            &json!({"title": "written without zkguard"}),
            WriteCondition::Always,
            Refresh::No,
        )
        .await
        .unwrap();
    }

    let (_session, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l, es.clone());
    for id in ["ts", "counted"] {
        let written = writer
            .run(&Operation::index(
                format!("legacy-{id}"),
                &index,
                id,
                json!({"title": "guarded"}),
            ))
            .await
            .unwrap_or_else(|e| panic!("the first guarded write of {id} failed: {e}"));
        assert!(
            written.token > millis,
            "token {} is not above a millisecond timestamp",
            written.token
        );
        let doc = es.get(&index, id).await.unwrap().unwrap();
        assert_eq!(doc.source["title"], json!("guarded"));
        assert_eq!(doc.meta.version as u64, written.token);
    }
}

/// A conflict says who set the version that won: a newer zkguard holder (its stamp carries the
/// version), or a writer outside zkguard (no stamp, or a stamp with another token); and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_names_whether_zkguard_or_an_outside_writer_set_the_version() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let index = format!("fenced-{}", tag());
    let (_session, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l.clone(), es.clone());

    // An older holder (monitor m1) and a newer one (monitor m2) held at once; the newer one writes
    // the document first.
    let older = l.acquire(LockRequest::new("m1", "older")).await.unwrap();
    let newer = l.acquire(LockRequest::new("m2", "newer")).await.unwrap();
    assert!(newer.fencing_token() > older.fencing_token());
    writer
        .write_under(
            newer.as_ref(),
            &Operation::index("m2", &index, "d", json!({"by": "newer"})),
        )
        .await
        .unwrap();
    let e = writer
        .write_under(
            older.as_ref(),
            &Operation::index("m1", &index, "d", json!({"by": "older"})),
        )
        .await
        .unwrap_err();
    match &e {
        GuardedError::Fenced { by, .. } => assert_eq!(
            *by,
            FencedBy::Holder {
                version: newer.fencing_token()
            },
            "{e}"
        ),
        other => panic!("expected fenced, got {other}"),
    }
    assert!(e.to_string().contains("newer zkguard lock holder"), "{e}");

    // A version set outside zkguard, above every token (nanoseconds, say): the stamp does not
    // carry it.
    let outside = 1_763_900_000_000_000_000u64;
    let doc = es.get(&index, "d").await.unwrap().unwrap();
    assert!(Stamp::of(&doc.source).is_some());
    es.index(
        &index,
        "d",
        &doc.source,
        WriteCondition::External(outside),
        Refresh::No,
    )
    .await
    .unwrap();
    let e = writer
        .write_under(
            newer.as_ref(),
            &Operation::index("m2", &index, "d", json!({"by": "newer again"})),
        )
        .await
        .unwrap_err();
    match &e {
        GuardedError::Fenced { by, .. } => {
            assert_eq!(*by, FencedBy::Outside { version: outside }, "{e}")
        }
        other => panic!("expected fenced, got {other}"),
    }
    let message = e.to_string();
    assert!(message.contains("outside zkguard"), "{message}");
    assert!(message.contains(&outside.to_string()), "{message}");
    older.release().await.detach("test");
    newer.release().await.detach("test");
}

/// An index that opts out of the `zkguard` object (`elastic.stamp.off`): documents are written
/// without it, still fenced, and a fence by a newer holder is still told from an outside version
/// (zkguard's tokens lie between 2^52 and 2^53); a tombstone, which is that object, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_without_stamps_is_fenced_and_names_the_newer_holder() {
    let servers = shared();
    let dir = tempfile::tempdir().unwrap();
    let settings = settings_for(servers, dir.path());
    let es = store(&settings);
    let plain = format!("plain-{}", tag());
    let (_session, l) = locks(&settings).await;
    let writer = GuardedWriter::new(l.clone(), es.clone())
        .without_stamp(IndexPatterns::parse("plain-*").unwrap());

    let older = l.acquire(LockRequest::new("p1", "older")).await.unwrap();
    let newer = l.acquire(LockRequest::new("p2", "newer")).await.unwrap();
    let written = writer
        .write_under(
            newer.as_ref(),
            &Operation::index("p2", &plain, "d", json!({"by": "newer"})),
        )
        .await
        .unwrap();
    let doc = es.get(&plain, "d").await.unwrap().unwrap();
    assert_eq!(doc.source, json!({"by": "newer"}), "no zkguard object");
    assert_eq!(doc.meta.version as u64, written.token);

    let e = writer
        .write_under(
            older.as_ref(),
            &Operation::index("p1", &plain, "d", json!({"by": "older"})),
        )
        .await
        .unwrap_err();
    match &e {
        GuardedError::Fenced { by, .. } => assert_eq!(
            *by,
            FencedBy::Holder {
                version: newer.fencing_token()
            },
            "{e}"
        ),
        other => panic!("expected fenced, got {other}"),
    }
    let doc = es.get(&plain, "d").await.unwrap().unwrap();
    assert_eq!(doc.source, json!({"by": "newer"}));

    let e = writer
        .write_under(
            newer.as_ref(),
            &Operation::delete("p2", &plain, "d").with_delete_mode(DeleteMode::Tombstone),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, GuardedError::Invalid(OpError::TombstoneUnstamped { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("elastic.stamp.off"), "{e}");

    // Other indices keep their stamp.
    let stamped = format!("stamped-{}", tag());
    writer
        .write_under(
            newer.as_ref(),
            &Operation::index("p2", &stamped, "d", json!({"by": "newer"})),
        )
        .await
        .unwrap();
    let doc = es.get(&stamped, "d").await.unwrap().unwrap();
    assert!(Stamp::of(&doc.source).is_some());
}
