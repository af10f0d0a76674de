//! A journal that cannot record outcomes (its file at the file-size limit, as on a full disk)
//! stops the service from applying background operations: an operation applied without a
//! recorded outcome runs again at the next start, and once more than the document's 100
//! remembered ids were written after it, it would go over newer data with a newer token.

use crate::common;
use crate::serve_support;

use std::time::Duration;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use serve_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_that_cannot_be_journaled_stop_background_work_and_nothing_stale_is_replayed() {
    let env = Env::new(&shared_zk().connect_string(), "journal-full").file_size(Some(96 * 1024));
    let s = env.start("journal-full");
    let c = client();
    let index = format!("full-{}", uuid_tag());
    let monitor = format!("full-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    // Background writes of one document queue behind the held lock until the journal is full.
    let mut accepted = Vec::new();
    let refused = loop {
        let n = accepted.len();
        let op_id = uuid::Uuid::new_v4().to_string();
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}&op_id={op_id}"),
            &json!({"n": n}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            break v;
        }
        accepted.push(op_id);
        assert!(n < 2000, "the journal never filled up");
    };
    assert_eq!(refused["error"], "journal_unavailable", "{refused}");
    let last = accepted.len() - 1;
    assert!(
        last > 150,
        "only {last} operations fit: too few to pass the document's memory of 100 ids"
    );

    // The lock is free: the first batch is applied, its outcomes cannot be recorded, and the
    // service stops there, saying so on /readyz and in its log, until it manages to rewrite
    // the journal (compaction frees room: on a fast machine within milliseconds, so /readyz
    // is read until either shows it).
    guard.unlock().await.unwrap();
    eventually(
        Duration::from_secs(30),
        "/readyz or the log reports the journal",
        || async {
            let (status, v) = call(&client(), Method::GET, &s.url("/readyz"), None).await;
            let readyz = status == StatusCode::SERVICE_UNAVAILABLE
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("journal cannot record outcomes"));
            readyz || s.log().contains("cannot record outcomes in the journal")
        },
    )
    .await;
    // A crash now: what was applied without a recorded outcome runs again at the next start.
    s.kill();

    // Restarted with room: every operation ends applied once, in order, and the document holds
    // the last one.
    let roomy = env.clone().file_size(None);
    let s = roomy.start("journal-full");
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(last), "{doc}");
}

/// A small file system of its own (a 192 KiB tmpfs), mounted for the test.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root (as make test runs in CI): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir.to_path_buf())
    }

    fn grow(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The journal on a real, small file system: once the disk is full, background writes are
/// refused with 503 and nothing acknowledged is lost; the journal's age and depth show the
/// stuck work; when the disk has room again, the running service rewrites its journal and
/// applies every acknowledged operation, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_background_writes_and_loses_nothing() {
    let base = Env::new(&shared_zk().connect_string(), "small-disk");
    let disk = SmallFs::mount(&base.dir.path().join("disk"), "192k");
    let env = base.with(
        "ZKGUARD_SERVER_JOURNAL_PATH",
        disk.0.join("journal.jsonl").to_str().unwrap(),
    );
    let s = env.start("small-disk");
    let c = client();
    let index = format!("disk-{}", uuid_tag());
    let monitor = format!("disk-{}", uuid_tag());
    let (_holder, guard) = hold_lock(&env, &monitor).await;

    let mut accepted = Vec::new();
    let refused = loop {
        let n = accepted.len();
        let (status, v) = put(
            &c,
            &s,
            &format!("/v1/indices/{index}/docs/d?type=background&monitor={monitor}"),
            &json!({"n": n, "pad": "x".repeat(512)}),
        )
        .await;
        if status != StatusCode::ACCEPTED {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
            break v;
        }
        accepted.push(v["operation_id"].as_str().unwrap().to_string());
        assert!(n < 5000, "the disk never filled up");
    };
    assert_eq!(refused["error"], "journal_unavailable", "{refused}");
    assert!(accepted.len() > 20, "{} operations fit", accepted.len());
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_journal_depth"], accepted.len() as f64, "{m:?}");
    assert!(m["zkguard_journal_oldest_seconds"] > 0.0, "{m:?}");

    // Room again, and the lock free: the service rewrites its journal and applies everything
    // it acknowledged, in order, without a restart.
    disk.grow("8m");
    guard.unlock().await.unwrap();
    let done = wait_finished(&c, &s, &accepted).await;
    assert!(done.values().all(|v| v["status"] == "applied"), "{done:?}");
    let doc = es_doc(&c, &index, "d").await;
    assert_eq!(doc["_source"]["n"], json!(accepted.len() - 1), "{doc}");
    eventually(
        Duration::from_secs(30),
        "/readyz is ready again",
        || async {
            call(&client(), Method::GET, &s.url("/readyz"), None)
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    let m = scrape(&c, &s).await;
    assert_eq!(m["zkguard_journal_depth"], 0.0, "{m:?}");
    assert_eq!(m["zkguard_journal_oldest_seconds"], 0.0, "{m:?}");
}
