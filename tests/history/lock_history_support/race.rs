//! The priority race the history test found, pinned down: a background contender that read the
//! queue (itself first, the mutex free) took the mutex without reading the queue again, so a
//! foreground contender that queued between that read and the take was overtaken, although its
//! queue node was created before the take. A background contender now verifies the queue in the
//! round trip of its take there, as `docs/zookeeper-lock.md`'s `TakeMutex` says.

use std::time::Duration;

use zkguard::zk::TOKEN_BASE;
use zkguard::{LockType, ZkBlockingWriteLock};

use crate::common::{children, eventually, session, zk_server, zk_settings};
use crate::logs::init_tracing;
use crate::queue::queued;
use zkguard::testkit::proxy::{ZkProxy, OP_GET_CHILDREN2, OP_GET_DATA};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_contender_queued_between_a_background_ones_read_and_take_goes_first() {
    init_tracing();
    // Not beside a history run: its load would stretch the waits below.
    let _turn = crate::TURN.lock().await;
    let zk = zk_server();
    let direct = zk.connect_string();
    let (bg_proxy, fg_proxy) = (ZkProxy::start(&direct), ZkProxy::start(&direct));
    let mut settings = zk_settings(&bg_proxy.connect_string(), "race");
    settings.session_timeout = Duration::from_secs(20);
    let monitor = format!("{}/r", settings.lock_root);
    let mut other = settings.clone();
    other.servers = direct.clone();
    let mut fg_settings = settings.clone();
    fg_settings.servers = fg_proxy.connect_string();
    let (bg, holder, fg) = (
        session(&settings).await,
        session(&other).await,
        session(&fg_settings).await,
    );
    let background = || {
        ZkBlockingWriteLock::new("background", &bg, "r")
            .unwrap()
            .with_type(LockType::Background)
            .with_timeout(Duration::from_secs(30))
    };
    let a_nodes = |prefix: &'static str, n: usize| {
        let (direct, monitor) = (direct.clone(), monitor.clone());
        move || {
            let (direct, monitor) = (direct.clone(), monitor.clone());
            async move { queued(&direct, &monitor, prefix).await == n }
        }
    };
    // The background session meets contention on the monitor: its acquisitions then queue with
    // a plain create and the queue read pipelined behind it.
    for _ in 0..3 {
        let held = ZkBlockingWriteLock::new("holder", &holder, "r")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        let sent_before = bg_proxy.requests().len();
        let lock = background();
        let waiter = tokio::spawn(async move { lock.lock_with_timeout().await.unwrap() });
        // Released only once the waiter watches the holder's node: its queue read, answered
        // before that watch went out, saw the holder. (Released as soon as its node shows, the
        // read could reach the server after the release, and the waiter met no contention.)
        eventually(
            Duration::from_secs(10),
            "the background contender read the queue and watched the holder",
            || {
                let sent: Vec<i32> = bg_proxy.requests()[sent_before..].to_vec();
                async move {
                    sent.iter()
                        .position(|&op| op == OP_GET_CHILDREN2)
                        .is_some_and(|read| sent[read..].contains(&OP_GET_DATA))
                }
            },
        )
        .await;
        held.unlock().await.unwrap();
        waiter.await.unwrap().unlock().await.unwrap();
    }
    // It queues; the answer to its queue read (itself alone) is held back.
    bg_proxy.hold_after(OP_GET_CHILDREN2);
    let lock = background();
    let bg_wait = tokio::spawn(async move { lock.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the background read held",
        || async { bg_proxy.holds() == 1 },
    )
    .await;
    // A foreground contender queues now (its own read held too, so that it does not take the
    // mutex before the background one acts on its stale read).
    fg_proxy.hold_after(OP_GET_CHILDREN2);
    let lock = ZkBlockingWriteLock::new("foreground", &fg, "r")
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let fg_wait = tokio::spawn(async move { lock.lock_with_timeout().await });
    eventually(
        Duration::from_secs(10),
        "the foreground contender queued",
        a_nodes("A-", 1),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the foreground read held",
        || async { fg_proxy.holds() == 1 },
    )
    .await;
    let raw = zookeeper_client::Client::connect(&direct).await.unwrap();
    let a = children(&direct, &monitor)
        .await
        .into_iter()
        .find(|k| k.starts_with("A-"))
        .unwrap();
    let queued_at = raw
        .check_stat(&format!("{monitor}/{a}"))
        .await
        .unwrap()
        .unwrap()
        .czxid as u64;
    bg_proxy.release_held();
    let taken = tokio::time::timeout(Duration::from_secs(3), bg_wait).await;
    fg_proxy.release_held();
    if let Ok(taken) = taken {
        let g = taken.unwrap().unwrap();
        let took_at = g.fencing_token() - TOKEN_BASE;
        g.unlock().await.unwrap();
        let f = fg_wait.await.unwrap().unwrap();
        f.unlock().await.unwrap();
        panic!(
            "the background contender took the mutex at zxid {took_at:#x}, after the foreground contender's node {a} was created at {queued_at:#x}, and held it first"
        );
    }
    let f = fg_wait.await.unwrap().unwrap();
    assert!(f.fencing_token() - TOKEN_BASE > queued_at);
    f.unlock().await.unwrap();
}
