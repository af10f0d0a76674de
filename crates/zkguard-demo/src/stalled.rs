//! The stalled writer (ZooKeeper backend only): a holder whose session expires before its write
//! is sent, so that Elasticsearch rejects the stale write by its fencing token.

use std::sync::Arc;
use std::time::Duration;

use zkguard::es::{HookedStore, IndexGate};
use zkguard::lock::{LockRequest, LockService, LockType};
use zkguard::write::guarded::{GuardedError, GuardedWriter};
use zkguard::write::ops::Operation;
use zkguard::zk::{ZkLockService, ZkSession};

use super::observe::ObservedLocks;
use super::plan::{DemoEnv, DemoPlan};
use super::report::{rejected, OpRecord, OpStatus};

/// The stalled writer: lock `article` through a session of its own (behind a [`Partition`]),
/// stall before the write, cut the session off until ZooKeeper expires it, let another writer
/// save the article, send the stale write.
pub(super) async fn stalled_writer(
    env: &DemoEnv,
    plan: &DemoPlan,
    writer: &GuardedWriter,
    observed: &ObservedLocks,
    article: &str,
    ops_window: usize,
) -> Result<(Vec<OpRecord>, String), String> {
    let monitor = plan.monitor(article);
    let partition = zkguard::testkit::Partition::start(&env.settings.zookeeper.servers)
        .map_err(|e| format!("not run: cannot start the network partition proxy: {e}"))?;
    let mut own_settings = env.settings.zookeeper.clone();
    own_settings.servers = partition.connect_string().to_string();
    // The shortest session ZooKeeper grants (it raises this to 2 x tickTime), so the stall
    // outlives it quickly.
    own_settings.session_timeout = Duration::from_millis(1000);
    let session = ZkSession::connect(&own_settings)
        .await
        .map_err(|e| format!("not run: cannot open a second ZooKeeper session: {e}"))?;
    let own_locks: Arc<dyn LockService> =
        Arc::new(observed.sharing_stats(Arc::new(ZkLockService::new(session.clone()))));
    // Holds back the stale writer's `index` call until let through: the stall of a writer
    // between its last lock check and its request reaching Elasticsearch.
    let stalling = Arc::new(HookedStore::new(env.store.clone(), IndexGate::new()));
    let stale_writer =
        GuardedWriter::new(own_locks.clone(), stalling.clone()).with_ops_window(ops_window);
    let request = LockRequest::new(&monitor, "Save Content (stalled writer)");
    let guard = match own_locks.acquire(request).await {
        Ok(g) => g,
        Err(e) => {
            session.close();
            return Err(format!("not run: could not lock {article}: {e}"));
        }
    };
    let token = guard.fencing_token();
    let stale_op = Operation::increment(&monitor, &plan.index, article, "saves", 1)
        .with_info("Save Content (stalled writer)");
    let new_op = Operation::increment(&monitor, &plan.index, article, "saves", 1)
        .with_info("Save Content (after the stall)");
    let stale_write = stale_writer.write_under(guard.as_ref(), &stale_op);
    let scenario = async {
        stalling.hook().reached().await;
        // The stalled writer is cut off from ZooKeeper (a long pause or a network partition):
        // ZooKeeper expires its session after the session timeout and deletes its nodes, and
        // the next writer gets the lock.
        partition.cut();
        let wait = env
            .settings
            .zookeeper
            .session_timeout
            .max(Duration::from_secs(5))
            * 4;
        let request =
            LockRequest::new(&monitor, "Save Content (after the stall)").with_timeout(wait);
        let next_guard = env.locks.acquire(request).await;
        let result = match next_guard {
            Ok(g) => {
                let result = writer.write_under(g.as_ref(), &new_op).await;
                let _ = g.unlock().await;
                result
            }
            Err(e) => Err(GuardedError::Lock(e)),
        };
        stalling.hook().let_through();
        result
    };
    let (stale_result, new_result) = tokio::join!(stale_write, scenario);
    drop(guard);
    session.close();
    let mut records = Vec::new();
    let new_token = new_result.as_ref().map(|w| w.token).ok();
    records.push(OpRecord {
        id: new_op.id,
        class: LockType::Foreground,
        article: article.to_string(),
        field: "saves",
        actor: "writer after the stall".into(),
        status: match &new_result {
            Ok(_) => OpStatus::Applied { attempts: 1 },
            Err(e) => rejected(e),
        },
        recorded: None,
    });
    let summary = match (&stale_result, new_token) {
        (Err(GuardedError::Fenced { .. }), Some(new_token)) => format!(
            "held {article} with token {token}, stalled while its session expired; another writer saved with token {new_token}; the stale write was rejected by Elasticsearch (fenced)"
        ),
        (Err(e), _) => format!("held {article} with token {token}; the stale write failed: {e}"),
        (Ok(_), _) => format!("held {article} with token {token}; the stale write was applied (no newer write reached the article first)"),
    };
    records.push(OpRecord {
        id: stale_op.id,
        class: LockType::Foreground,
        article: article.to_string(),
        field: "saves",
        actor: "stalled writer".into(),
        status: match &stale_result {
            Ok(_) => OpStatus::Applied { attempts: 1 },
            Err(e) => rejected(e),
        },
        recorded: None,
    });
    Ok((records, summary))
}
