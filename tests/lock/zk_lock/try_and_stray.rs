//! `try_lock`, stray mutex nodes (`clear_stray`), and hand-over under an ACL without write
//! permission.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_takes_a_free_lock_and_otherwise_fails_at_once_naming_the_holder() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "tryonce");
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    let monitor = format!("{}/T1", settings.lock_root);
    // Free (the monitor node does not even exist yet): taken on the single try.
    let g1 = ZkBlockingWriteLock::new("Save Content", &c1, "T1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    // Held: fails at once for either class, naming the holder from its nodes, queueing nothing.
    for lock_type in [LockType::Foreground, LockType::Background] {
        let err = ZkBlockingWriteLock::new("second", &c2, "T1")
            .unwrap()
            .with_type(lock_type)
            .try_lock()
            .await
            .unwrap_err();
        match err.blocked_by() {
            Some(Blocker::Holder { owner, info, node }) => {
                assert_eq!(owner.as_deref(), Some(c1.owner_id()), "{err}");
                assert_eq!(info.as_deref(), Some("Save Content"), "{err}");
                assert!(
                    node.as_deref().is_some_and(|n| n.starts_with("A-")),
                    "{err}"
                );
            }
            _ => panic!("expected the holder to be named: {err}"),
        }
        assert!(err.to_string().contains(c1.owner_id()), "{err}");
        let kids = children(&servers, &monitor).await;
        assert_eq!(kids.len(), 2, "only the holder's nodes: {kids:?}");
    }
    // A zero timeout through lock_with_timeout is the same try.
    let err = ZkBlockingWriteLock::new("second", &c2, "T1")
        .unwrap()
        .with_timeout(Duration::ZERO)
        .lock_with_timeout()
        .await
        .unwrap_err();
    assert!(
        matches!(err.blocked_by(), Some(Blocker::Holder { .. })),
        "{err}"
    );
    g1.unlock().await.unwrap();
    // Free again: the try succeeds.
    let g2 = ZkBlockingWriteLock::new("second", &c2, "T1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_respects_the_queue_ahead_and_leaves_no_node() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "tryqueue");
    let c1 = session(&settings).await;
    let monitor = format!("{}/T2", settings.lock_root);
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;
    // A foreground contender is queued while the mutex is free (as between two holders).
    let (_, seq) = admin
        .create(
            &format!("{monitor}/A-"),
            &foreign_node_data("foreground"),
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let queued = format!("A-{seq}");
    // Neither a background try nor a later foreground try jumps ahead of it.
    for lock_type in [LockType::Background, LockType::Foreground] {
        let err = ZkBlockingWriteLock::new("try", &c1, "T2")
            .unwrap()
            .with_type(lock_type)
            .try_lock()
            .await
            .unwrap_err();
        match err.blocked_by() {
            Some(Blocker::QueueAhead {
                count,
                first_node,
                first_class,
                first_owner,
            }) => {
                assert_eq!(*count, 1, "{err}");
                assert_eq!(first_node, &queued, "{err}");
                assert_eq!(first_class, "foreground", "{err}");
                assert_eq!(
                    first_owner.as_deref(),
                    Some("other-host:1:0000abcd"),
                    "{err}"
                );
            }
            _ => panic!("expected the queue ahead to be named: {err}"),
        }
        assert_eq!(children(&servers, &monitor).await, vec![queued.clone()]);
    }
    // Once it is gone, the background try gets the lock.
    admin
        .delete(&format!("{monitor}/{queued}"), None)
        .await
        .unwrap();
    let g = ZkBlockingWriteLock::new("try", &c1, "T2")
        .unwrap()
        .with_type(LockType::Background)
        .try_lock()
        .await
        .unwrap();
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_mutex_is_reported_named_and_cleared_but_a_live_holders_never() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "stray");
    let c1 = session(&settings).await;
    let monitor = format!("{}/S1", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;

    // A persistent privateLock, as any client could create it.
    admin
        .create(
            &mutex,
            b"{}",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let states = list_locks(&c1, Some("S1")).await.unwrap();
    assert_eq!(states.len(), 1);
    assert!(states[0].stray && states[0].holder.is_none());
    assert_eq!(states[0].stray_session.as_deref(), Some("0x0"));
    let err = ZkBlockingWriteLock::new("blocked", &c1, "S1")
        .unwrap()
        .with_timeout(Duration::from_millis(200))
        .lock_with_timeout()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.blocked_by(),
            Some(Blocker::StrayMutex { session: None, .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("zkguard locks --monitor S1 --clear-stray"),
        "{err}"
    );
    assert_eq!(
        clear_stray(&c1, "S1").await.unwrap(),
        StrayOutcome::Removed { session: None }
    );

    // The lock works again; its holder's mutex is not stray and is never cleared.
    let g = ZkBlockingWriteLock::new("holder", &c1, "S1")
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert!(!list_locks(&c1, Some("S1")).await.unwrap()[0].stray);
    match clear_stray(&c1, "S1").await.unwrap() {
        StrayOutcome::LiveHolder { owner, node } => {
            assert_eq!(owner.as_deref(), Some(c1.owner_id()));
            assert!(node.is_some_and(|n| n.starts_with("A-")));
        }
        other => panic!("a live holder's mutex must be left alone: {other:?}"),
    }
    assert!(g.is_held());
    assert!(children(&servers, &monitor)
        .await
        .contains(&"privateLock".to_string()));
    g.unlock().await.unwrap();
    assert_eq!(clear_stray(&c1, "S1").await.unwrap(), StrayOutcome::NoMutex);

    // An ephemeral privateLock of a session that holds no queue node is stray too.
    admin
        .create(
            &mutex,
            b"{}",
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    let sid = format!("{:#x}", admin.session_id().0);
    let states = list_locks(&c1, Some("S1")).await.unwrap();
    assert!(states[0].stray);
    assert_eq!(states[0].stray_session.as_deref(), Some(sid.as_str()));
    let err = ZkBlockingWriteLock::new("blocked", &c1, "S1")
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&sid), "{err}");
    assert_eq!(
        clear_stray(&c1, "S1").await.unwrap(),
        StrayOutcome::Removed { session: Some(sid) }
    );
    assert!(children(&servers, &monitor).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_holders_are_never_seen_as_stray_while_the_lock_changes_hands() {
    let zk = shared();
    let servers = zk.connect_string();
    let settings = zk_settings(&servers, "notstray");
    let sessions = [session(&settings).await, session(&settings).await];
    // Uncontended cycles take the fast path (queue node and mutex in one multi); contended ones
    // hand the mutex over; releases delete both in one multi.
    let workers: Vec<_> = sessions
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move {
                for _ in 0..150 {
                    let g = ZkBlockingWriteLock::new("cycle", &s, "H1")
                        .unwrap()
                        .lock_with_timeout()
                        .await
                        .unwrap();
                    g.unlock().await.unwrap();
                }
            })
        })
        .collect();
    let inspector = session(&settings).await;
    let mut looks = 0;
    let mut held_seen = 0;
    while !workers.iter().all(|w| w.is_finished()) {
        for state in list_locks(&inspector, Some("H1")).await.unwrap() {
            assert!(!state.stray, "a live holder was taken for stray: {state:?}");
            held_seen += usize::from(state.holder.is_some());
        }
        looks += 1;
    }
    for w in workers {
        w.await.unwrap();
    }
    assert!(looks > 0, "the lock was never inspected");
    eprintln!("{looks} looks, {held_seen} with a holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_write_permission_still_hands_the_lock_over() {
    use zkguard::config::{ZkAcl, ZkAclEntry, ZkAuth};
    let zk = shared();
    let servers = zk.connect_string();
    let credentials = "hand:s3cret-zk";
    // The digest id of these credentials, as ZooKeeper computes it.
    let admin = zookeeper_client::Client::connector()
        .with_auth("digest", credentials.as_bytes())
        .connect(&servers)
        .await
        .unwrap();
    let probe = format!("/probe-{}", uuid_tag());
    admin
        .create(
            &probe,
            &[],
            &CreateMode::Ephemeral.with_acls(Acls::creator_all()),
        )
        .await
        .unwrap();
    let (acl, _) = admin.get_acl(&probe).await.unwrap();
    // Create, delete, read and admin, but not write: zkguard never needs to overwrite a node.
    let entry = ZkAclEntry::parse(&format!("digest:{}:cdra", acl[0].id())).unwrap();
    let mut settings = zk_settings(&servers, "nowrite");
    settings.auth = Some(ZkAuth::digest(credentials));
    settings.acl = ZkAcl::Explicit(vec![entry]);
    // A root of its own: zkguard gives the root's missing parents the configured ACL, which
    // would keep the other tests (without credentials) out of a shared parent.
    settings.lock_root = format!("/zkguard-test-nowrite-{}", uuid_tag());
    let (c1, c2) = (session(&settings).await, session(&settings).await);
    for _ in 0..2 {
        let g1 = ZkBlockingWriteLock::new("first", &c1, "N1")
            .unwrap()
            .lock_with_timeout()
            .await
            .unwrap();
        let l2 = ZkBlockingWriteLock::new("second", &c2, "N1").unwrap();
        let waiter = tokio::spawn(async move { l2.lock_with_timeout().await });
        let monitor = format!("{}/N1", settings.lock_root);
        // Listed as the same identity: nobody else may read these nodes.
        eventually(
            Duration::from_secs(5),
            "second contender queued",
            || async {
                admin
                    .list_children(&monitor)
                    .await
                    .is_ok_and(|kids| kids.iter().filter(|k| k.starts_with("A-")).count() == 2)
            },
        )
        .await;
        g1.unlock()
            .await
            .expect("a release needs no write permission");
        let g2 = waiter.await.unwrap().unwrap();
        g2.unlock().await.unwrap();
    }
}

/// A live holder that takes the mutex between `clear_stray`'s inspection of a stray one and its
/// delete keeps it. The stray node goes and the holder takes the lock while the answer to the
/// inspection's last read (the mutex read again, found to be the same node) is held; the delete
/// that follows would find a `privateLock` of version 0 as the stray one was. Every take sets
/// the monitor's data: the delete is one multi that checks the monitor's version read before
/// the inspection, and the clear reports the live holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_takes_the_mutex_while_a_stray_one_is_cleared_keeps_it() {
    init_tracing();
    let zk = shared();
    let servers = zk.connect_string();
    let proxy = ZkProxy::start(&servers);
    let settings = zk_settings(&servers, "stray-race");
    let mut via_proxy = settings.clone();
    via_proxy.servers = proxy.connect_string();
    // Long enough that the client does not give up on the held answers.
    via_proxy.session_timeout = Duration::from_secs(40);
    let monitor = format!("{}/R1", settings.lock_root);
    let mutex = format!("{monitor}/privateLock");
    let admin = zookeeper_client::Client::connect(&servers).await.unwrap();
    create_path(&admin, &monitor).await;
    admin
        .create(
            &mutex,
            b"{}",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();

    let clearer = session(&via_proxy).await;
    // The inspection reads the mutex, the queue, and the mutex again: the answer to the second
    // read of the mutex (and all after it) is held.
    proxy.hold_after_skipping(zkguard::testkit::proxy::OP_GET_DATA, 1);
    let clearing = tokio::spawn(async move { clear_stray(&clearer, "R1").await });
    eventually(
        Duration::from_secs(10),
        "the inspection's last read answered and held",
        || async { proxy.holds() == 1 },
    )
    .await;
    // Meanwhile the stray node goes and a live holder takes the lock.
    admin.delete(&mutex, None).await.unwrap();
    let hs = session(&settings).await;
    let holder = ZkBlockingWriteLock::new("holder", &hs, "R1")
        .unwrap()
        .with_timeout(Duration::from_secs(10))
        .lock_with_timeout()
        .await
        .unwrap();
    proxy.release_held();
    let outcome = clearing.await.unwrap().unwrap();
    assert!(
        matches!(outcome, StrayOutcome::LiveHolder { .. }),
        "a holder that took the lock since the inspection is live: {outcome:?}"
    );
    let (_, stat) = admin
        .get_data(&mutex)
        .await
        .expect("the live holder's mutex is still there");
    assert_eq!(Some(stat.ephemeral_owner), hs.session_id());
    assert!(holder.is_held());
    holder.unlock().await.unwrap();
    assert!(
        children(&servers, &monitor).await.is_empty(),
        "nothing left"
    );
}
